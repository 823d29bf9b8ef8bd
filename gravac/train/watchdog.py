"""A stall watchdog: a rank whose training stops making progress for too long exits.

When a peer dies, horovodrun ends the job at once. When a peer hangs (a deadlock, a stuck
device, a stopped process), the other ranks would wait in their next collective forever,
and Horovod's own stall shutdown does not fire under Gloo. So every rank runs this thread:
if a step, an evaluation or a checkpoint takes far longer than the rank has seen such work
take, it prints what it was doing and exits non-zero, and the launcher ends the rest.

The bound follows what is measured, so a slow model is never taken for a hang: a step may
take ``FACTOR`` times the slowest step so far, an evaluation (or checkpoint, or elastic
commit) ``FACTOR`` times the slowest of its kind, and never less than ``floor_s``
(``run.stall_timeout``); the first of each kind, with nothing measured yet (start-up,
compilation, a cold disk), ``FACTOR * floor_s`` (the first step does not count among the
steps). The message says where the rank is: in the
exchange, a peer is behind (died, hangs, or is far slower); in its own forward and
backward, the rank itself is stuck.

Example::

    dog = StallWatchdog(60, rank).start()
    for batch in batches:
        dog.phase(COMPUTE); loss.backward()
        dog.phase(EXCHANGE); opt.step()
        dog.beat()
        with dog.timed(EVALUATION):
            evaluate()
    dog.stop()
"""
from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager

EXIT_CODE = 3
#: How many times the slowest measured work of a kind a rank waits before it gives up.
FACTOR = 10.0
COMPUTE, EXCHANGE = "compute", "exchange"
EVALUATION, CHECKPOINT, COMMIT = "evaluation", "checkpoint", "elastic commit"
#: What a rank stuck in each phase is doing, for the one line it prints.
_WHERE = {
    COMPUTE: "in its own data loading, forward or backward (with DDP or overlap the exchange "
             "runs there too): this rank itself may be stuck, or a peer when the exchange "
             "overlaps",
    EXCHANGE: "waiting for the other ranks in the gradient exchange: a peer died, hangs, or "
              "is far behind",
    EVALUATION: "in an evaluation (its own, or waiting for the other ranks' results)",
    CHECKPOINT: "writing or agreeing on a checkpoint (a slow disk, or a peer behind)",
    COMMIT: "in an elastic commit (waiting for the other ranks)",
}


class StallWatchdog:
    """``timeout_s``: the floor of every bound, in seconds (0: no watchdog)."""

    def __init__(self, timeout_s: float, rank: int, exit=os._exit):
        self.timeout_s = float(timeout_s)
        self.rank = rank
        self._exit = exit
        self._since = time.monotonic()
        self._phase = COMPUTE
        self._kind = "step"                     # what the running bound is for
        self._slowest: dict[str, float] = {}   # kind -> slowest seen, seconds
        self._beats = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "StallWatchdog":
        """Watch from now (again after ``stop``: what was measured is kept)."""
        if self.timeout_s > 0 and (self._thread is None or not self._thread.is_alive()):
            self._since = time.monotonic()
            self._kind, self._phase = "step", COMPUTE
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._watch, args=(self._stop,),
                                            name="gravac-stall-watchdog", daemon=True)
            self._thread.start()
        return self

    def phase(self, name: str) -> None:
        """What this rank does now within the step (``COMPUTE``, ``EXCHANGE``)."""
        self._phase = name

    def beat(self) -> None:
        """A training step finished: its time joins the measurements (the first step's
        start-up, compilation and first negotiations are not a measure of the others)."""
        self._finished("step" if self._beats else "first step")
        self._beats += 1
        self._phase = COMPUTE

    @contextmanager
    def timed(self, kind: str):
        """Work between steps (``EVALUATION``, ``CHECKPOINT``, ``COMMIT``), bounded by the
        slowest of its kind; the next step's time starts after it."""
        outer = self._phase
        self._kind = self._phase = kind
        self._since = time.monotonic()
        try:
            yield
        finally:
            self._finished(kind)
            self._kind, self._phase = "step", outer

    def bound(self, kind: str | None = None) -> tuple[float, str]:
        """(seconds ``kind``'s work may take, why) as measured so far."""
        kind = kind or self._kind
        slowest = self._slowest.get(kind)
        if slowest is None:
            return FACTOR * self.timeout_s, (f"no {kind} measured yet: {FACTOR:g}x "
                                             f"run.stall_timeout={self.timeout_s:g}")
        bound = max(self.timeout_s, FACTOR * slowest)
        return bound, (f"{FACTOR:g}x the slowest {kind} so far, {slowest:.3g}s; at least "
                       f"run.stall_timeout={self.timeout_s:g}")

    def stop(self) -> None:
        """Stop watching (its thread ends within its poll interval)."""
        self._stop.set()

    def _finished(self, kind: str) -> None:
        now = time.monotonic()
        took = now - self._since
        self._slowest[kind] = max(self._slowest.get(kind, 0.0), took)
        self._since = now

    def _watch(self, stopped: threading.Event) -> None:
        interval = min(1.0, self.timeout_s / 10)
        while not stopped.wait(interval):
            idle = time.monotonic() - self._since
            bound, why = self.bound()
            if idle > bound:
                what = "training step" if self._kind == "step" else self._kind
                sys.stderr.write(
                    f"[rank {self.rank}] no {what} finished for {idle:.3g}s (bound {bound:.3g}s: "
                    f"{why}); this rank is {_WHERE.get(self._phase, self._phase)}. Exiting so "
                    "that the job does not hang; resume from the last checkpoint with "
                    "--resume.\n")
                sys.stderr.flush()
                self._exit(EXIT_CODE)
                return
