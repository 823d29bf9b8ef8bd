"""Ctrl-C and SIGTERM stop a run cleanly: every rank agrees at a step boundary, a checkpoint
is written, and the job exits 128 + the signal's number (130 for SIGINT, 143 for SIGTERM).

A handler only notes the signal: a collective cannot be interrupted halfway, and a rank that
left it would hang the others. Schedulers may signal one rank only, so the ranks agree with
a three-value allreduce (``StopSignal.agreed``: the signals, and the step time) about once
a second of training: every step when a step takes a second or more, every
``run.stop_check_interval`` steps at most; all of them then checkpoint at the same step and
stop. The next check's step comes from the agreed step time, so it is the same on every
rank. A second signal exits at once, without a checkpoint. (A launcher kills its ranks a
while after it signals them: horovodrun 5 s, torchrun 30 s. With longer steps than that the
step in flight cannot finish in time, and the last periodic checkpoint is what remains.)

Example::

    stop = StopSignal(rank=comm.rank).install()
    next_check = 1
    for step in ...:
        train_one_step()
        if step >= next_check:                # the same steps on every rank
            signum, every = stop.agreed(comm, step, step_seconds, max_interval=10)
            next_check = step + every
            if signum:
                save_checkpoint(...)
                raise Interrupted(signum, step, where)
    stop.uninstall()
"""
from __future__ import annotations

import os
import signal
import sys
import threading

import torch

SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: About how much training time passes between two checks for a signal (seconds).
CHECK_EVERY_S = 1.0


class Interrupted(Exception):
    """The run stopped at ``step`` for ``signum`` after saving a checkpoint in ``where``."""

    def __init__(self, signum: int, step: int, where: str):
        self.signum, self.step, self.where = signum, step, where
        super().__init__(f"interrupted by {signal.Signals(signum).name} at step {step}: "
                         f"checkpoint saved to {where}; continue with --resume")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class StopSignal:
    """Notes SIGINT/SIGTERM; ``agreed`` turns a note on any rank into a stop on all."""

    def __init__(self, rank: int = 0):
        self.rank = rank
        self.signum = 0
        self._previous: dict = {}

    def install(self) -> "StopSignal":
        # signal handlers can only be set from the main thread (tests call train() from
        # worker threads, and then the job has no handler of its own to replace)
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.signum:
            sys.stderr.write(f"[rank {self.rank}] second {name}: exiting now, without a "
                             "checkpoint\n")
            sys.stderr.flush()
            os._exit(128 + signum)
        self.signum = signum
        sys.stderr.write(f"[rank {self.rank}] {name}: stopping after the step in flight "
                         "(within about a second of steps) and saving a checkpoint (send it "
                         "again to exit at once)\n")
        sys.stderr.flush()

    def agreed(self, comm, step: int, step_seconds: float,
               max_interval: int) -> tuple[int, int]:
        """Collective, at the same steps on every rank: (the signal some rank got, SIGTERM
        first if ranks got different ones, or 0; the steps until the next check: about
        ``CHECK_EVERY_S`` of the ranks' mean ``step_seconds``, 1 to ``max_interval``)."""
        got = torch.tensor([*(float(self.signum == sig) for sig in SIGNALS),
                            float(step_seconds)], dtype=torch.float64)
        summed = comm.allreduce(got, op="sum", name=f"gravac.stop.{step}").tolist()
        mean_step = summed[-1] / comm.size
        every = max_interval if mean_step <= 0 else \
            max(1, min(max_interval, int(CHECK_EVERY_S / mean_step)))
        for sig, count in sorted(zip(SIGNALS, summed[:-1]), reverse=True):
            if count > 0:
                return int(sig), every
        return 0, every
