"""Where a step's synchronisation spends its time: local work and waits in collectives.

The engine times each phase with a ``PhaseClock`` (one clock read per phase boundary)
and reports every phase in the step record, so that waiting for another rank (its
backward skew, Horovod's cycle) never looks like compression:

local work (``LOCAL_PHASES``, their sum is ``t_compress``)
    t_control   the controller's plan and decision
    t_check     the local NaN/Inf scan of the gradients
    t_feedback  error feedback: g_ef = g + residual (and dense layers absorbing theirs)
    t_select    both levels' selection and the gathering of the kept values
    t_norms     the per-layer norms behind the compression gains
    t_residual  residual <- g_ef - sent
    t_pack      packing the sparse values and indices into the wire buffer
    t_unpack    summing every rank's values into the gradients (and fp16 copies back)

waits in collectives (``WAIT_PHASES``, their sum is ``t_comm``)
    t_wait_check     the NaN/Inf flag allreduce when it runs in a round of its own
                     (controllers that observe gradients: Accordion); otherwise the
                     flags ride in the gains allreduce, the exchange's dense group
                     or beside the exchange, and their wait is in those phases
    t_wait_select    the rounds a selection needs before its values can travel (the
                     shared-index exchange's index sets, PowerSGD's P)
    t_wait_gains     the gains allreduce (GraVAC ``decide="previous"`` without overlap:
                     started after the exchange, so this wait holds the exchange's too)
    t_wait_exchange  the sparse allgather and the dense allreduces

``t_discarded`` (``discarded_time``): a step that went dense after compressing threw away
``DISCARDED_PHASES``, the selection, its norms and its rounds; Algorithm 1 times a dense
step without them (line 23), so the controller's t_iter leaves them out. The gains
allreduce is not among them: it carries the NaN/Inf flags, which every step agrees, and
with overlap it waits behind the buckets in flight, which a dense step sends as well.
One definition for every exchange, with and without overlap.

On CUDA a clock read would synchronise the device; by default only the phase
boundaries that already synchronised do (``exact=False``), so the split between the
local phases is where the host waited, not where the kernels ran; the totals stay exact.
Those boundaries (``lap(..., sync=True)``) wait for the device before reading the clock,
so a phase measured there ends when its kernels have finished, not when they were
queued. With ``exact=False`` the clock starts on the host clock alone: the step's
caller read the synchronised clock just before (``DistributedOptimizer.synchronize``),
and with overlap the clock starts in backward's first hook, which must not wait for
backward's kernels.
``benchmarks/step_profile.py`` prints these phases for a model and a CF.

Example::

    clock = PhaseClock(engine.now)
    ...                                   # select
    clock.lap("t_select")
    clock.times["t_select"]               # seconds since the previous lap
"""
from __future__ import annotations

import time
from typing import Callable

LOCAL_PHASES = ("t_control", "t_check", "t_feedback", "t_select", "t_norms", "t_residual",
                "t_pack", "t_unpack")
WAIT_PHASES = ("t_wait_check", "t_wait_select", "t_wait_gains", "t_wait_exchange")
PHASES = LOCAL_PHASES + WAIT_PHASES
#: The phases of compression that a step which went dense did for nothing.
DISCARDED_PHASES = ("t_select", "t_norms", "t_wait_select")


def discarded_time(times: dict, went_dense: bool, compressed: bool) -> float:
    """``t_discarded``: the ``DISCARDED_PHASES`` of ``times`` when the step compressed
    some layer (``compressed``, from the plan: the same on every rank) and then sent it
    dense; 0 otherwise."""
    return sum(times[p] for p in DISCARDED_PHASES) if went_dense and compressed else 0.0


class PhaseClock:
    """Adds the time since the previous ``lap`` to the named phase.

    ``synced_now`` is the clock that waits for the device (``StepEngine.now``); with
    ``exact=False`` it is read only by ``lap(..., sync=True)`` and the other laps use the
    host clock alone.
    """

    def __init__(self, synced_now: Callable[[], float], exact: bool = True):
        self._synced_now = synced_now
        self._exact = exact
        self.start = self._last = synced_now() if exact else time.perf_counter()
        self.times = dict.fromkeys(PHASES, 0.0)

    def lap(self, phase: str, sync: bool = False) -> float:
        """Charge the time since the previous lap to ``phase``; returns the clock read."""
        now = self._synced_now() if (self._exact or sync) else time.perf_counter()
        self.times[phase] += now - self._last
        self._last = now
        return now

    def resume(self) -> None:
        """Restart the lap here without charging the time since the previous one (the
        overlapped step: the backward compute between two hooks is not a phase)."""
        self._last = self._synced_now() if self._exact else time.perf_counter()

    def charged(self) -> float:
        """Seconds charged to all phases so far."""
        return sum(self.times.values())

    def local(self) -> float:
        return sum(self.times[p] for p in LOCAL_PHASES)

    def waits(self) -> float:
        return sum(self.times[p] for p in WAIT_PHASES)
