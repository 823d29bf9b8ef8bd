"""Waiting for a Horovod collective without keeping a core busy (gravac/comm/horovod.py):
the poll-and-sleep schedule on a fake handle, and the CPU a waiting rank burns, measured
on a real 2-rank job in tests/parallel/test_horovod_comm_wait.py."""
from __future__ import annotations

import pytest

hvd_comm = pytest.importorskip("gravac.comm.horovod", reason="Horovod is not installed")


def test_sleeps_back_off_to_the_cap_until_the_handle_is_done():
    answers = iter([False] * 7 + [True])
    slept = []
    sleeps = hvd_comm.wait_sleeping(42, poll=lambda h: h == 42 and next(answers),
                                    sleep=slept.append)
    assert sleeps == 7
    first, cap = hvd_comm.WAIT_POLL_FIRST_S, hvd_comm.WAIT_POLL_MAX_S
    assert slept == [min(first * 2 ** i, cap) for i in range(7)]
    assert slept[-1] == cap and cap <= 1e-3       # under Horovod's 1 ms default cycle


def test_a_finished_handle_does_not_sleep():
    slept = []
    assert hvd_comm.wait_sleeping(1, poll=lambda h: True, sleep=slept.append) == 0
    assert slept == []


def test_auto_sleeps_only_where_a_machines_ranks_outnumber_its_cores():
    resolve = hvd_comm.resolve_wait_mode
    # the sandbox: 4 ranks in network namespaces of one 2-core machine share its host name
    assert resolve("auto", ["m"] * 4, 2, 2) == ("sleep", "auto: 4 ranks on 2 cores")
    # 2 real hosts of 2 ranks and 2 cores each, or a core per rank: Horovod's own wait
    assert resolve("auto", ["a", "a", "b", "b"], 0, 2) == ("spin", "auto: 2 ranks on 2 cores")
    assert resolve("auto", ["a"] * 8, 5, 16)[0] == "spin"
    # an explicit setting is kept; anything else is refused in one line
    assert resolve("spin", ["m"] * 4, 0, 2) == ("spin", "run.horovod_wait")
    assert resolve("sleep", ["a"], 0, 64) == ("sleep", "run.horovod_wait")
    with pytest.raises(ValueError, match="one of auto, sleep, spin, got .busy."):
        resolve("busy", ["a"], 0, 2)


def test_set_wait_mode_is_what_handles_use():
    before = hvd_comm.wait_mode()
    try:
        hvd_comm.set_wait_mode("spin", "test")
        assert hvd_comm.wait_mode() == ("spin", "test")
        with pytest.raises(ValueError):
            hvd_comm.set_wait_mode("auto")        # auto is resolved before, never set
    finally:
        hvd_comm.set_wait_mode(*before)


def test_doctests():
    import doctest

    assert doctest.testmod(hvd_comm).failed == 0
