"""benchmarks/collectives.py's lockstep measurement (the CPU phase of a step in a layout,
``benchmarks/scaling calibrate`` fits it): on one process, and its merge of several ranks' rows."""
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


def test_solo_kind_has_one_rank_work_per_step_in_turn():
    # 3 ranks, 6 steps: rank 0 works at steps 0 and 3, rank 1 at 1 and 4, rank 2 at 2 and 5
    turns = [[C._works("stream_solo", r, 3, i) for i in range(6)] for r in range(3)]
    assert turns == [[True, False, False, True, False, False],
                     [False, True, False, False, True, False],
                     [False, False, True, False, False, True]]
    assert all(C._works("stream", r, 3, i) for r in range(3) for i in range(6))


def test_merge_lockstep_of_a_solo_kind_keeps_the_working_ranks_own_time():
    def rank(steps, own):
        return {"stream_solo": {"unit_s": 1e-3, "rows": [{"work_s": 0.1, "steps_s": steps,
                                                          "own_s": own}]}}

    merged = C.merge_lockstep([rank([0.12, 0.13, 0.11], [0.10, None, 0.09]),
                               rank([0.12, 0.13, 0.11], [None, 0.12, None])])
    row = merged["stream_solo"]["rows"][0]
    assert row["own_s"] == pytest.approx(0.10)         # median of 0.10, 0.09, 0.12
    assert row["step_s"] == pytest.approx(0.12)


def test_lockstep_solo_on_one_process_works_every_step():
    from gravac.comm import init

    out = C.measure_lockstep(init("local"), [10], repeats=2, kinds=("stream_solo",))
    busy = out["stream_solo"]["rows"][0]
    assert all(o is not None and o > 0 for o in busy["own_s"])
