"""Ctrl-C and SIGTERM stop a run cleanly: every rank agrees at a step boundary, a checkpoint
is written, and the job exits 128 + the signal's number (130 for SIGINT, 143 for SIGTERM).

A handler only notes the signal: a collective cannot be interrupted halfway, and a rank that
left it would hang the others. Schedulers may signal one rank only, so the ranks agree
every ``run.stop_check_interval`` steps with a two-value allreduce (``StopSignal.agreed``);
all of them then checkpoint at the same step and stop. A second signal exits at once, without a checkpoint.

Example::

    stop = StopSignal(rank=comm.rank).install()
    for step in ...:
        train_one_step()
        if step % check_interval == 0:        # the same steps on every rank
            signum = stop.agreed(comm, step)  # collective: 0, or the signal to stop for
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
        sys.stderr.write(f"[rank {self.rank}] {name}: stopping at the next check "
                         "(run.stop_check_interval) and saving a checkpoint (send it again "
                         "to exit at once)\n")
        sys.stderr.flush()

    def agreed(self, comm, step: int) -> int:
        """Collective, at the same steps on every rank: the signal some rank got (SIGTERM first
        if ranks got different ones), or 0."""
        got = torch.tensor([float(self.signum == sig) for sig in SIGNALS])
        counts = comm.allreduce(got, op="sum", name=f"gravac.stop.{step}")
        for sig, count in sorted(zip(SIGNALS, counts.tolist()), reverse=True):
            if count > 0:
                return int(sig)
        return 0
