"""benchmarks/residual_lag.py: a short measurement of a workload through gravac's engine
(dense measures nothing, a compressed method's first lag is zero, the gains are GraVAC's),
its summary's arithmetic, and its table."""
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
from residual_lag import main, summarise, train  # noqa: E402


def test_a_short_run_measures_gain_and_lag_of_compressed_methods_only():
    dense = train("wide_cnn", "dense", steps=3)
    assert [r["step"] for r in dense] == [0, 1, 2]
    assert all(r["gain"] is None and r["lag"] is None for r in dense)
    rank4 = train("wide_cnn", "powersgd:4", steps=3)
    assert rank4[0]["lag"] == 0.0                      # no residual before the first step
    assert all(0 < r["gain"] <= 1 for r in rank4)
    assert rank4[1]["lag"] != 0.0
    assert rank4[0]["loss"] == pytest.approx(dense[0]["loss"])   # same seed, same batch


def test_the_summary_reads_the_first_steps_and_the_second_half():
    rows = [{"step": i, "loss": float(i), "gain": 0.5, "lag": 0.01 * i} for i in range(20)]
    s = summarise(rows)
    assert s["final_loss"] == pytest.approx((18 + 19) / 2)          # the last 10%
    assert s["lag_first"] == pytest.approx(0.01 * sum(range(1, 10)) / 9)
    assert s["lag_second_half"] == pytest.approx(0.01 * sum(range(10, 20)) / 10)
    assert s["gain_first"] == s["gain_second_half"] == 0.5


def test_the_table_compares_each_method_with_dense(capsys):
    assert main(["--workloads", "wide_cnn", "--methods", "dense", "powersgd:4",
                 "--steps", "4"]) == 0
    out = capsys.readouterr().out
    assert "| lag, steps 2-10 | lag, 2nd half |" in out
    assert "| dense |" in out and "| powersgd:4 |" in out


def test_a_bad_method_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit):
        main(["--methods", "powersgd:x"])
    assert "--methods powersgd:x" in capsys.readouterr().err


def test_steps_below_1_are_refused_not_read_as_the_default(capsys):
    with pytest.raises(SystemExit):
        main(["--steps", "0", "--workloads", "wide_cnn", "--methods", "dense"])
    assert "argument --steps: must be >= 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--lag", "0"], "argument --lag: Auto(low_rank_lag=0.0): must be in (0, 1]"),
    (["--epsilon", "1.5"], "argument --epsilon: Auto(epsilon=1.5): must be in (0, 1]")])
def test_thresholds_outside_autos_ranges_are_refused_before_any_run(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2 and message in capsys.readouterr().err
