"""Overlap with backward: each bucket of layers leaves while backward is still running.

With ``overlap=True`` the optimizer registers a post-accumulate-grad hook on every
parameter it communicates. The layers are cut into buckets once, in reverse order
(backward produces the last layer's gradient first), each holding about
``bucket_cap_mb`` of gradient; the cut depends only on the model, so it is the same on
every rank. When every layer of the next bucket has its gradient (after
``backward_passes_per_step`` backward passes), the hook runs that bucket's part of the
step: the NaN/Inf scan, error feedback, selection at the level the plan already fixed
(Static, Accordion, GraVAC with ``decide="previous"``), the residual update, and it
starts the bucket's exchange (one allgather of its sparse layers, one grouped allreduce
of its dense ones), while autograd goes on with the layers below.

Buckets start strictly in order: a bucket whose gradients are ready before its
predecessor's waits for it, so every rank issues the same collectives in the same order
whatever order backward ran in (as DDP's reducer does). ``step()`` (``synchronize``)
starts the buckets still waiting (a layer without a gradient on this rank is sent as
zeros, as in the plain step), agrees the NaN/Inf flags (in the gains allreduce, in the
last bucket's dense group, or one tiny allreduce after the buckets), waits, and writes
the averaged gradients; if some rank had a NaN/Inf, it rolls every residual back and
writes nothing, on every rank.

What cannot leave during backward: with GraVAC's own rule (``decide="current"``) a
compressed layer's level is chosen from this step's agreed gains, known only after every
layer is compressed; its selection still runs in the hook, and it is sent with the other
compressed layers in one allgather after the gains allreduce (dense layers overlap).
A controller that observes gradients (Accordion) gets copies taken in the hooks, after
the flags agreed that the step is not skipped.

Example::

    opt = wrap_optimizer(sgd, model.named_parameters(), comm, controller=Static(cf=100),
                         overlap=True, bucket_cap_mb=25)
    loss.backward()          # buckets leave as their gradients are produced
    opt.step()               # waits for them, writes the averaged gradients, updates
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..controllers import SENT_CANDIDATE, SENT_DENSE, SENT_MIN, StepPlan
from ..memory import SparseSent
from .decision import checked_decision
from .layers import Layer
from .phases import PhaseClock
from .record import StepStats
from .selection import flagged_ranks, gain_row, nonfinite_flag


#: The first bucket closes at 1 MiB (or the cap, if smaller), as DDP's: the last layers'
#: gradients leave early, while most of backward is still ahead.
FIRST_BUCKET_BYTES = 2**20


def build_buckets(layers: list[Layer], cap_bytes: int) -> list[list[Layer]]:
    """The layers in reverse order, cut after a bucket reaches ``cap_bytes`` of gradient
    (the first one at ``FIRST_BUCKET_BYTES`` already; a layer larger than the cap is a
    bucket of its own). Depends only on the model."""
    buckets: list[list[Layer]] = []
    current: list[Layer] = []
    size = 0
    for layer in reversed(layers):
        current.append(layer)
        size += layer.numel * layer.param.element_size()
        if size >= (min(cap_bytes, FIRST_BUCKET_BYTES) if not buckets else cap_bytes):
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


@dataclass
class _StepState:
    """What one overlapped step has done so far."""

    step: int
    plan: StepPlan
    clock: PhaseClock
    level: str | None                # what compressed layers send; None: after the gains
    ready: set = field(default_factory=set)
    next_bucket: int = 0
    pendings: list = field(default_factory=list)
    rows: list = field(default_factory=list)          # gain rows, one per selection
    held: list = field(default_factory=list)          # selections waiting for the gains
    selected: int = 0
    all_candidate: bool = True
    sparse: list = field(default_factory=list)        # (layer, values sent)
    dense: list = field(default_factory=list)
    bytes_sent: int = 0
    local_bad: bool | torch.Tensor = False            # on a GPU: a device flag, no sync
    flags_carrier: object = None                      # the exchange the flags ride in
    staged: dict | None = None                        # gradient copies for the controller
    t_hooks: float = 0.0


class BackwardOverlap:
    """Runs a ``StepEngine``'s step bucket by bucket from gradient hooks.

    ``context()`` gives (step, lr_decayed) of the step the first hook belongs to (the
    optimizer's clock), so the controller plans it before the first bucket leaves.
    """

    def __init__(self, engine, context: Callable[[], tuple[int, bool]],
                 bucket_cap_mb: float = 25.0, backward_passes_per_step: int = 1):
        if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float)) \
                or not bucket_cap_mb > 0:
            raise ValueError(f"bucket_cap_mb must be a number > 0 (MiB of gradient per bucket), "
                             f"got {bucket_cap_mb!r}")
        if isinstance(backward_passes_per_step, bool) \
                or not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be an int >= 1, got "
                             f"{backward_passes_per_step!r}")
        if engine.lowrank is not None:
            raise ValueError("overlap=True takes a sparsifier or compressor='none'; PowerSGD's "
                             "rounds (P, then Q) run in step() (set overlap=False)")
        self.engine = engine
        self.context = context
        self.bucket_cap_mb = float(bucket_cap_mb)
        self.backward_passes_per_step = backward_passes_per_step
        self.buckets = build_buckets(engine.layers, int(bucket_cap_mb * 2**20))
        self._layer_of = {id(l.param): l for l in engine.layers}
        self._passes = [0] * len(engine.layers)
        self._state: _StepState | None = None
        for layer in engine.layers:
            owner = getattr(layer.param, "_gravac_overlap", None)
            if owner is not None and owner is not self:
                # Both would start collectives from backward: a second set nobody waits for.
                raise ValueError(f"parameter {layer.name} already has the backward hooks of "
                                 "another overlapped gravac optimizer; call its "
                                 "remove_hooks() before wrapping the model again")
        self._handles = [l.param.register_post_accumulate_grad_hook(self._on_grad)
                         for l in engine.layers]
        for layer in engine.layers:
            layer.param._gravac_overlap = self

    @property
    def active(self) -> bool:
        """A step has begun (some hook ran) and ``synchronize`` has not finished it."""
        return self._state is not None

    def remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for layer in self.engine.layers:
            if getattr(layer.param, "_gravac_overlap", None) is self:
                del layer.param._gravac_overlap

    def reset(self) -> None:
        """Forget a step left half-done (an elastic reset: its collectives are gone)."""
        self._state = None
        self._passes = [0] * len(self.engine.layers)

    # -- backward -------------------------------------------------------------------------
    def _on_grad(self, param: torch.Tensor) -> None:
        layer = self._layer_of[id(param)]
        passes = self._passes[layer.index] + 1
        if passes > self.backward_passes_per_step:
            raise RuntimeError(
                f"the gradient of {layer.name} was computed {passes} times before step(); "
                f"backward_passes_per_step={self.backward_passes_per_step}: call step() (or "
                "synchronize()) after that many backward passes, or raise it")
        self._passes[layer.index] = passes
        if passes < self.backward_passes_per_step:
            return                      # accumulating: the last pass sends
        # What the hooks add to the phases is taken out of t_compute (backward's time) by
        # synchronize: the phase time charged in this hook, not the hook's wall time, which
        # on a GPU with exact phases would include waiting for backward's own kernels.
        charged = 0.0 if self._state is None else self._state.clock.charged()
        state = self._begin()
        state.clock.resume()
        state.ready.add(layer.index)
        self._start_ready(state)
        state.t_hooks += state.clock.charged() - charged

    def _begin(self) -> _StepState:
        if self._state is not None:
            return self._state
        step, lr_decayed = self.context()
        e = self.engine
        e._refresh_devices()
        clock = PhaseClock(e.now, exact=not e._cuda or e.exact_phases)
        if lr_decayed:
            e.controller.on_lr_decay()
        plan = e.controller.plan(step)
        level = plan.decided if plan.needs_gains else SENT_MIN
        if level == SENT_CANDIDATE and (plan.theta_c is None or plan.theta_c <= plan.theta_min
                                        or plan.layer_cf is not None):
            raise RuntimeError("controller decided the candidate but its plan has no candidate "
                               "CF above theta_min")
        clock.lap("t_control")
        e.memory.begin_step()
        self._state = _StepState(step, plan, clock, level,
                                 staged={} if e.controller.wants_gradients else None)
        return self._state

    def _start_ready(self, state: _StepState) -> None:
        while state.next_bucket < len(self.buckets) and \
                all(l.index in state.ready for l in self.buckets[state.next_bucket]):
            self._start_bucket(state, state.next_bucket)
            state.next_bucket += 1

    def _start_bucket(self, state: _StepState, b: int) -> None:
        e, clock, plan = self.engine, state.clock, state.plan
        layers = self.buckets[b]
        for layer in layers:
            e.densify_grad(layer)
        # On a GPU a device flag, or-ed over the buckets: no host sync in backward's hooks.
        bad = nonfinite_flag([l.param.grad for l in layers])
        state.local_bad = bad if state.local_bad is False else state.local_bad | bad
        clock.lap("t_check")
        if state.staged is not None:
            for layer in layers:
                if layer.compressible:
                    state.staged[layer.name] = layer.param.grad.detach().clone()
            clock.lap("t_control")
        payload, dense = [], []
        for layer in layers:
            sel = e.feed_and_select(layer, plan, state.step, clock) if layer.compressible \
                else None
            if sel is None:
                dense.append(layer)
                continue
            state.selected += 1
            state.all_candidate &= sel.val_c is not None
            if plan.needs_gains:
                state.rows.append(gain_row(sel, plan.gain_measure))
                clock.lap("t_norms")
            if state.level is None:
                state.held.append(sel)   # sent after the gains decide
                continue
            self._settle(state, sel, state.level, payload, dense)
            clock.lap("t_residual")
        # The last bucket's scan completes this rank's flags: without a gains round to
        # carry them, they ride in its dense group (if it has one).
        last = b == len(self.buckets) - 1 and not plan.needs_gains
        self._start_exchange(state, payload, dense, f".b{b}",
                             flags=e.flags(state.local_bad) if last else None)

    def _settle(self, state: _StepState, sel, level: str, payload: list, dense: list) -> None:
        """Send ``sel`` at ``level``: its values into ``payload`` (or g_ef into the dense
        list) and the residual keeps the rest."""
        memory = self.engine.memory
        if level == SENT_DENSE:
            sel.layer.param.grad.view(-1).copy_(sel.g_ef)
            memory.update(sel.layer.name, sel.g_ef, None)
            dense.append(sel.layer)
            return
        idx, val = (sel.idx_c, sel.val_c) if level == SENT_CANDIDATE else (sel.idx_min, sel.val_min)
        payload.append((sel.layer, val, idx))
        # val is a copy (gathered), so g_ef's buffer may now become the residual.
        memory.update(sel.layer.name, sel.g_ef, SparseSent(idx, val))
        state.sparse.append((sel.layer, int(val.numel())))

    def _start_exchange(self, state: _StepState, payload: list, dense: list, tag: str,
                        flags: torch.Tensor | None = None) -> None:
        exchange = self.engine.exchange
        packed = exchange.pack(payload)
        state.clock.lap("t_pack")
        state.dense.extend(dense)
        if packed is None and not dense:
            return                       # the same on every rank: the plan decides it
        pending = exchange.start(packed, dense, tag=tag,
                                 same_size=self.engine.compressor.exact_count, flags=flags)
        if pending.carries_flags:
            state.flags_carrier = pending
        state.pendings.append(pending)
        state.bytes_sent += pending.bytes_sent

    # -- step() ---------------------------------------------------------------------------
    def synchronize(self, t_compute: float | None) -> StepStats:
        """Finish the step: start what is left, agree, wait, write the gradients."""
        state = self._begin()
        state.clock.resume()
        try:
            return self._finish(state, t_compute)
        finally:
            self.reset()

    def _finish(self, state: _StepState, t_compute: float | None) -> StepStats:
        e, clock, plan = self.engine, state.clock, state.plan
        if t_compute is not None:
            t_compute = max(t_compute - state.t_hooks, 0.0)   # hook work is in the phases
        state.ready.update(l.index for l in e.layers)
        self._start_ready(state)         # layers without a gradient: zeros, in order
        gain_min = gain_c = None
        bad_ranks: list[int] = []
        flags = None
        sent = state.level
        if plan.needs_gains:
            gain_min, gain_c, bad_ranks = e.agree_gain_rows(state.rows, clock, state.local_bad)
            if not bad_ranks:
                if not state.all_candidate:
                    gain_c = None
                sent = checked_decision(e.controller, gain_min, gain_c, state.selected > 0,
                                        state.all_candidate, plan.decided)
                clock.lap("t_control")
                if state.held:
                    payload, dense = [], []
                    for sel in state.held:
                        self._settle(state, sel, sent, payload, dense)
                    clock.lap("t_residual")
                    self._start_exchange(state, payload, dense, ".held")
        elif state.flags_carrier is None:
            # The last bucket had no dense group to carry the flags: one more tiny
            # allreduce, started after every bucket.
            flags = e.comm.allreduce_async(e.flags(state.local_bad), op="sum",
                                           name=f"{e.prefix}.finite")
        for pending in state.pendings:
            pending.wait()
        if flags is not None:
            bad_ranks = flagged_ranks(flags.wait())
        elif state.flags_carrier is not None:
            bad_ranks = state.flags_carrier.flagged_ranks()
        clock.lap("t_wait_exchange", sync=True)
        if bad_ranks:
            # What arrived is not written (dense buckets were reduced in place, but the
            # step is skipped); residuals go back.
            e.memory.rollback_step()
            return e.skip(state.step, bad_ranks, clock, t_compute)
        for pending in state.pendings:
            pending.unpack()
        clock.lap("t_unpack", sync=True)
        if state.staged:
            e.controller.observe_gradients(state.staged)
            clock.lap("t_control")
        t_discarded = 0.0
        if sent == SENT_DENSE and state.selected:
            # The selection and norms were for nothing; the gains allreduce was not: it
            # carries the NaN/Inf flags, and it waits behind the buckets in flight (on a
            # slow link, the whole dense exchange), which a dense step needs anyway. The
            # plain step's count (with t_wait_gains) made dense look 5x faster here.
            t_discarded = clock.times["t_select"] + clock.times["t_norms"]
        return e.sent_stats(state.step, plan, sent or SENT_MIN, state.sparse, state.dense,
                            state.bytes_sent, gain_min, gain_c, clock, t_compute, t_discarded)
