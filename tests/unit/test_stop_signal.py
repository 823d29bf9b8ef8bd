"""How often the ranks check for SIGINT/SIGTERM (gravac/train/signals.py): about once a
second of training, every step when a step takes a second or more, at most every
run.stop_check_interval steps; the stall watchdog's bounds (gravac/train/watchdog.py)
follow the measured step, evaluation and checkpoint times."""
import signal
import time

import pytest

from gravac.comm import LocalComm
from gravac.train.signals import StopSignal
from gravac.train.watchdog import CHECKPOINT, EVALUATION, EXCHANGE, FACTOR, StallWatchdog


@pytest.mark.parametrize("step_seconds, every", [(5.0, 1), (1.0, 1), (0.3, 3), (0.01, 10),
                                                 (0.0, 10)])
def test_the_next_check_comes_after_about_a_second_of_steps(step_seconds, every):
    assert StopSignal().agreed(LocalComm(), 7, step_seconds, max_interval=10) == (0, every)


def test_a_noted_signal_is_what_the_check_agrees_on():
    stop = StopSignal()
    stop.signum = signal.SIGTERM
    assert stop.agreed(LocalComm(), 3, 2.0, max_interval=10) == (signal.SIGTERM, 1)


def test_the_watchdog_bound_follows_the_slowest_work_of_each_kind():
    dog = StallWatchdog(2.0, rank=0, exit=lambda code: None)
    assert dog.bound()[0] == FACTOR * 2.0              # nothing measured yet
    dog._since -= 30.0                                 # a first step of 30 s (start-up) ...
    dog.beat()
    assert dog.bound()[0] == FACTOR * 2.0              # ... does not measure the others
    dog._since -= 0.5
    dog.beat()
    bound, why = dog.bound()
    assert bound == pytest.approx(5.0, rel=0.01)
    assert why == "10x the slowest step so far, 0.5s; at least run.stall_timeout=2"
    dog._since -= 0.01
    dog.beat()
    assert dog.bound()[0] == bound                     # the slowest, not the last
    with dog.timed(EVALUATION):
        assert dog.bound()[0] == FACTOR * 2.0          # the first evaluation
        dog._since -= 3.0
    assert dog.bound(EVALUATION)[0] == pytest.approx(30.0, rel=0.01)
    assert dog.bound(CHECKPOINT)[0] == FACTOR * 2.0


def test_a_rank_waiting_in_the_exchange_past_its_bound_says_a_peer_is_behind(capsys):
    exits = []
    dog = StallWatchdog(0.2, rank=1, exit=exits.append).start()
    dog._since -= 0.05
    dog.beat()                                         # the first step
    dog._since -= 0.05
    dog.beat()                                         # a step of 0.05 s: bound 0.5 s
    dog.phase(EXCHANGE)
    deadline = time.monotonic() + 60                   # a guard, not a speed limit
    while not exits and time.monotonic() < deadline:
        time.sleep(0.05)
    dog.stop()
    assert exits == [3]
    line = capsys.readouterr().err.strip()
    assert line.startswith("[rank 1] no training step finished for ")
    assert "(bound 0.5s: 10x the slowest step so far, 0.05s; at least run.stall_timeout=0.2)" \
        in line
    assert "waiting for the other ranks in the gradient exchange: a peer died" in line
