"""benchmarks/end_to_end.py's arithmetic: when DDP's PowerSGD hook starts, and the table
that puts every gravac method against the fastest peer (issue 13's target)."""
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
from end_to_end import METHODS, peer_table, powersgd_start  # noqa: E402


def test_ddp_powersgd_starts_after_a_tenth_of_the_run_and_never_before_step_2():
    assert [powersgd_start(n) for n in (300, 100, 80, 15, 5)] == [30, 10, 8, 2, 2]
    for name in ("ddp_powersgd_rank1", "ddp_powersgd_rank4"):
        assert METHODS[name][1] == ["compression.ddp_start_powersgd_iter={powersgd_start}"]


def _run(ttt, loss):
    return {"time_to_target": ttt, "final_loss": loss}


def test_peer_table_takes_the_fastest_peer_of_either_backend():
    by_backend = {
        "horovod": {"dense": _run(100.0, 4.0), "horovod_fp16": _run(70.0, 4.0),
                    "gravac_recommended": _run(40.0, 3.8)},
        "torch": {"dense": _run(95.0, 4.0), "horovod_fp16": _run(60.0, 4.0),
                  "ddp_powersgd_rank4": _run(50.0, 4.1), "ddp_powersgd_rank1": _run(None, 4.6),
                  "gravac_recommended": _run(None, 4.2)},
    }
    text = peer_table("1gbit", by_backend)
    assert "(DDP PowerSGD rank 4, 50.0 s)" in text.splitlines()[0]
    rows = [line for line in text.splitlines() if line.startswith("| horovod") or
            line.startswith("| torch")]
    # peers and dense are not rows; a gravac run that never reached the target says so
    assert rows == ["| horovod | gravac_recommended | 40.0 | 0.80x | -5.0% |",
                    "| torch | gravac_recommended | never | — | +5.0% |"]


def test_no_peer_reached_the_target_means_no_table():
    assert peer_table("1gbit", {"horovod": {"dense": _run(10.0, 1.0),
                                            "horovod_fp16": _run(None, 1.0)}}) is None
