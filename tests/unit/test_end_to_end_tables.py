"""benchmarks/end_to_end.py's arithmetic: when DDP's PowerSGD hook starts, the table that
puts every gravac method against the fastest peer (its time-to-target target), and the table of
ratios over several rounds; its options refused in one line before any run, --summarize-only
on the runs there are, and a failed run reported without losing the others."""
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import end_to_end  # noqa: E402
from end_to_end import (METHODS, bits_per_second, peer_table, powersgd_start,  # noqa: E402
                        round_dir, rounds_table, summarize, table)


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


def test_an_auto_run_that_chose_nothing_yet_is_still_summarized_as_auto():
    """A run shorter than Auto's trials has no "chosen" event: its step records' method
    field still says it is Auto, not GraVAC with no windows."""
    steps = [{"step": i, "time": 0.1 * i, "t_iter": 0.1, "samples_per_sec": 320.0,
              "loss": 2.0 - 0.01 * i, "sent": "min", "cf": 10.0,
              "method": "dense" if i < 6 else "sparse:10",
              "cum_floats_sent": 50.0, "cum_dense_floats": 100.0} for i in range(14)]
    run = {"steps": steps, "windows": [], "eval": {"loss": 1.5, "top1": 0.5}, "chosen": []}
    auto = summarize(run, target=1.9)
    text = table("none", {"dense": auto, "gravac_auto": auto}, 1.9, "torch")
    assert ("gravac_auto: steps per method: {'dense': 6, 'sparse:10': 8}; chosen (step: "
            "method): none yet") in text
    assert "windows" not in text


def test_rates_are_tcs_spellings_or_none_for_the_plain_loopback():
    assert bits_per_second("1gbit") == 1e9 and bits_per_second("100mbit") == 1e8
    assert bits_per_second("none") is None
    for bad in ("fast", "1gbits", "0mbit", ""):
        with pytest.raises(ValueError, match="use e.g. 100mbit, 1gbit, 10gbit, or none"):
            bits_per_second(bad)


@pytest.fixture
def no_training(monkeypatch):
    """run_one, the report and the result set replaced: main's own logic only. Returns
    the (method, rate, sandbox) of each run started."""
    started = []

    def fail_if_run(method, rate, steps, out, np_, extra, workload, backend, sandbox=True,
                    hosts=1):
        started.append((method, rate, sandbox))
        raise AssertionError("a run started")
    monkeypatch.setattr(end_to_end, "run_one", fail_if_run)
    monkeypatch.setattr(end_to_end.subprocess, "call", lambda *a, **k: 0)
    return started


@pytest.mark.parametrize("args, message", [
    (["--np", "0"], "argument --np: must be >= 1, got 0"),
    (["--steps", "10"], "argument --steps: 10 must exceed the 10 warm-up steps"),
    (["--steps", "0"], "argument --steps: 0 must exceed the 10 warm-up steps"),
    (["--rates", "none", "fast"], "argument --rates: 'fast' not understood"),
    (["--rates", "none", "--hosts", "2", "--np", "4"], "--rates none (the host's plain "
                                                       "loopback) is one host"),
    (["--methods", "static_topk_10x"], "--methods must include dense"),
])
def test_bad_options_are_refused_in_one_line_before_any_run(args, message, no_training,
                                                            tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        end_to_end.main([*args, "--out", str(tmp_path / "e2e")])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err.splitlines()[-1]
    assert no_training == [] and not (tmp_path / "e2e").exists()


def _fake_run(loss0=2.0):
    steps = [{"step": i, "time": 0.1 * i, "t_iter": 0.1, "samples_per_sec": 320.0,
              "loss": loss0 - 0.01 * i, "sent": "dense", "cf": 1.0,
              "cum_floats_sent": 100.0, "cum_dense_floats": 100.0} for i in range(20)]
    return {"steps": steps, "windows": [], "eval": {"loss": 1.5, "top1": 0.5}, "chosen": []}


def test_summarize_only_takes_the_runs_there_are_and_names_a_missing_one(
        no_training, monkeypatch, tmp_path, capsys):
    out = tmp_path / "e2e"
    for method in ("dense", "static_topk_10x"):
        (out / "none" / "horovod" / method).mkdir(parents=True)
    monkeypatch.setattr(end_to_end, "load", lambda run_dir: _fake_run())
    assert end_to_end.main(["--summarize-only", "--rates", "none", "--out", str(out)]) == 0
    results = (out / "results.md").read_text()
    first_table = results.split("### none: gravac against")[0]
    rows = [line.split(" | ")[0] for line in first_table.splitlines() if line.startswith("| ")
            and not line.startswith("| method")]
    assert rows == ["| dense", "| static_topk_10x"]    # not the 40-odd methods never run
    assert "2 methods" in results
    # asked by name, a missing run is refused in one line naming its directory
    with pytest.raises(SystemExit):
        end_to_end.main(["--summarize-only", "--rates", "none", "--out", str(out),
                         "--methods", "dense", "gravac_auto"])
    assert (f"--summarize-only: no run {out}/none/horovod/gravac_auto; train it first, or "
            "leave its method out of --methods") in capsys.readouterr().err
    # without dense there is nothing to compare with
    with pytest.raises(SystemExit):
        end_to_end.main(["--summarize-only", "--rates", "none", "1gbit", "--out", str(out)])
    assert f"no run {out}/1gbit/horovod/dense; train it first" in capsys.readouterr().err
    assert no_training == []


def test_a_failed_run_is_reported_at_the_end_and_the_others_are_kept(monkeypatch, tmp_path,
                                                                     capsys):
    started = []

    def run_one(method, rate, steps, out, np_, extra, workload, backend, sandbox=True,
                hosts=1):
        started.append((method, rate, sandbox))
        if method == "static_topk_10x" or (method == "dense" and rate == "1gbit"):
            raise end_to_end.RunFailed(f"{method} at {rate} on {backend} failed (exit status "
                                       f"1); see {method}.log")
        return end_to_end.run_dir_of(out, rate, backend, method)
    monkeypatch.setattr(end_to_end, "run_one", run_one)
    monkeypatch.setattr(end_to_end, "load", lambda run_dir: _fake_run())
    monkeypatch.setattr(end_to_end.subprocess, "call", lambda *a, **k: 0)
    out = tmp_path / "e2e"
    code = end_to_end.main(["--rates", "none", "1gbit", "--steps", "20", "--out", str(out),
                            "--methods", "dense", "static_topk_10x", "horovod_fp16"])
    assert code == 1
    # none: the plain loopback, no sandbox; 1gbit: dense failed, so nothing else ran there
    assert started == [("dense", "none", False), ("static_topk_10x", "none", False),
                       ("horovod_fp16", "none", False), ("dense", "1gbit", True)]
    err = capsys.readouterr().err.splitlines()
    assert err == ["end_to_end.py: static_topk_10x at none on horovod failed (exit status 1); "
                   "see static_topk_10x.log",
                   "end_to_end.py: dense at 1gbit on horovod failed (exit status 1); "
                   "see dense.log",
                   "end_to_end.py: 2 run(s) failed"]
    results = (out / "results.md").read_text()
    assert "| horovod_fp16 | " in results and "| static_topk_10x | " not in results
    assert "### Failed runs" in results


def test_a_run_too_short_to_summarize_is_named(tmp_path):
    with pytest.raises(end_to_end.RunFailed, match="metrics file not found"):
        end_to_end.load(tmp_path)
