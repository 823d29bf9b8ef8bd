"""A stall watchdog: a rank that sees no training step finish for too long exits.

When a peer dies, horovodrun ends the job at once. When a peer hangs (a deadlock, a stuck
device, a stopped process), the other ranks would wait in their next collective forever,
and Horovod's own stall shutdown does not fire under Gloo. So every rank runs this thread:
if no step finishes within ``timeout_s`` while armed, it prints why and exits non-zero,
and horovodrun then terminates the rest. Evaluation and checkpointing are not timed
(``paused()``): their length depends on the data set and the disk, not on the peers.

Example::

    dog = StallWatchdog(60, rank).start()
    for batch in batches:
        ...; opt.step(); dog.beat()
        with dog.paused():
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


class StallWatchdog:
    def __init__(self, timeout_s: float, rank: int, exit=os._exit):
        self.timeout_s = float(timeout_s)
        self.rank = rank
        self._exit = exit
        self._last = time.monotonic()
        self._armed = True
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="gravac-stall-watchdog",
                                        daemon=True)

    def start(self) -> "StallWatchdog":
        if self.timeout_s > 0:
            self._thread.start()
        return self

    def beat(self) -> None:
        self._last = time.monotonic()

    @contextmanager
    def paused(self):
        self._armed = False
        try:
            yield
        finally:
            self._last = time.monotonic()
            self._armed = True

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        interval = min(1.0, self.timeout_s / 10)
        while not self._stop.wait(interval):
            idle = time.monotonic() - self._last
            if self._armed and idle > self.timeout_s:
                sys.stderr.write(
                    f"[rank {self.rank}] no training step finished for {idle:.0f}s "
                    f"(run.stall_timeout={self.timeout_s:g}): another rank died or hangs. "
                    "Exiting so that the job does not hang; resume from the last checkpoint "
                    "with --resume.\n")
                sys.stderr.flush()
                self._exit(EXIT_CODE)
                return
