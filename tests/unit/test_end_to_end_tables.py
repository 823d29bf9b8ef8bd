"""benchmarks/end_to_end.py's arithmetic: when DDP's PowerSGD hook starts, the table that
puts every gravac method against the fastest peer (issue 13's target), and the table of
ratios over several rounds."""
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
from end_to_end import (METHODS, peer_table, powersgd_start, round_dir, rounds_table,  # noqa: E402
                        summarize, table)


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


def test_the_launchers_dense_path_is_a_peer_too():
    """On a fast link plain DDP can beat every compression hook: it is the one to beat."""
    text = peer_table("10gbit", {"torch": {"dense": _run(33.0, 4.0),
                                           "horovod_fp16": _run(36.0, 4.0),
                                           "gravac_auto": _run(34.0, 3.9)}})
    assert "(PyTorch DDP, 33.0 s)" in text.splitlines()[0]
    assert "| torch | gravac_auto | 34.0 | 1.03x | -2.5% |" in text


def test_no_peer_reached_the_target_means_no_table():
    assert peer_table("1gbit", {"horovod": {"dense": _run(None, 1.0),
                                            "horovod_fp16": _run(None, 1.0)}}) is None


def _speed(sps, ttt):
    return {"samples_per_sec": sps, "time_to_target": ttt}


def test_rounds_table_takes_each_ratio_to_its_own_rounds_dense():
    per_round = [
        {"dense": _speed(40.0, 100.0), "static": _speed(100.0, 40.0), "gravac": _speed(90.0, 50.0)},
        {"dense": _speed(50.0, 80.0), "static": _speed(110.0, 40.0), "gravac": _speed(130.0, None)},
        {"dense": _speed(45.0, 90.0), "static": _speed(99.0, 45.0), "gravac": _speed(99.0, 45.0)},
    ]
    text = rounds_table("1gbit", "horovod", per_round)
    assert "3 rounds" in text.splitlines()[0]
    rows = {line.split(" | ")[0][2:]: line for line in text.splitlines()
            if line.startswith("| static") or line.startswith("| gravac")}
    assert set(rows) == {"static", "gravac"}          # dense is every ratio's denominator
    # static: 2.50x, 2.20x, 2.20x -> median 2.20x; time to target 0.40, 0.50, 0.50
    assert rows["static"] == ("| static | 2.20x (2.20-2.50) | 2.50x | 2.20x | 2.20x | "
                              "0.50x (0.40-0.50) |")
    # gravac: 2.25x, 2.60x, 2.20x; it missed the target in round 2: said, not dropped
    assert rows["gravac"] == ("| gravac | 2.25x (2.20-2.60) | 2.25x | 2.60x | 2.20x | "
                              "0.50x (0.50-0.50), never in 1 |")


def test_one_round_keeps_its_runs_where_they_always_were(tmp_path):
    assert round_dir(tmp_path, 1, 1) == tmp_path
    assert round_dir(tmp_path, 2, 3) == tmp_path / "round2"


def test_an_auto_run_says_what_it_ran_and_which_method_it_chose_when():
    def step(i, method):
        return {"step": i, "time": 0.1 * i, "t_iter": 0.1, "samples_per_sec": 320.0,
                "loss": 2.0 - 0.01 * i, "sent": "dense" if method == "fp16" else "min",
                "cf": 1.0 if method == "fp16" else 10.0, "method": method,
                "cum_floats_sent": 50.0, "cum_dense_floats": 100.0}
    steps = [step(i, "fp16" if i < 5 or i >= 10 else "sparse:10") for i in range(40)]
    run = {"steps": steps, "windows": [], "eval": {"loss": 1.5, "top1": 0.5},
           "chosen": [(10, "fp16"), (35, "fp16")]}
    auto = summarize(run, target=1.8)
    assert auto["methods"] == {"fp16": 35, "sparse:10": 5}
    dense = summarize({**run, "chosen": []}, target=1.8)
    text = table("1gbit", {"dense": dense, "gravac_auto": auto}, 1.8, "torch")
    assert ("gravac_auto: steps per method: {'fp16': 35, 'sparse:10': 5}; "
            "chosen (step: method): 10: fp16, 35: fp16") in text
