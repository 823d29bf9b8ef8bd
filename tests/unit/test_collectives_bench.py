"""benchmarks/collectives.py's lockstep measurement (the CPU phase of a step in a layout,
``scaling.py calibrate`` fits it): on one process, and its merge of several ranks' rows."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import collectives as C  # noqa: E402


def test_lockstep_on_one_process_times_the_work_asked():
    from gravac.comm import init

    comm = init("local")
    out = C.measure_lockstep(comm, [0, 20], repeats=3)
    assert set(out) == set(C.WORK_KINDS)
    for kind, data in out.items():
        unit = data["unit_s"]
        idle, busy = data["rows"]
        assert idle["work_s"] == 0 and len(idle["steps_s"]) == 3
        # 20 ms of work as timed alone, in whole units of that work
        assert busy["work_s"] == pytest.approx(round(0.02 / unit) * unit)
        assert all(s >= o > 0 for s, o in zip(busy["steps_s"], busy["own_s"]))


def test_merge_lockstep_takes_the_slowest_rank_per_step():
    def rank(work, steps, own):
        return {"gemm": {"unit_s": 1e-3, "rows": [{"work_s": work, "steps_s": steps,
                                                   "own_s": own}]}}

    merged = C.merge_lockstep([rank(0.1, [0.30, 0.20, 0.25], [0.15, 0.16, 0.17]),
                               rank(0.1, [0.26, 0.28, 0.24], [0.18, 0.19, 0.20])])
    row = merged["gemm"]["rows"][0]
    assert row["step_s"] == pytest.approx(0.28)        # median of 0.30, 0.28, 0.25
    assert row["own_s"] == pytest.approx(0.175)        # median of all six
    assert merged["gemm"]["unit_s"] == [1e-3, 1e-3]
