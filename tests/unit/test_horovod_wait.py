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
