"""The step pipeline: one step's work, the same for every exchange, with or without overlap.

plan -> NaN/Inf scan -> error feedback -> select (both levels) -> agree gains (and the
NaN/Inf flags) -> decide -> settle (residuals) -> exchange -> unpack -> step record, bucket
by bucket. Without overlap the model is one bucket that ``synchronize()`` starts; with
overlap, backward's hooks start each bucket as its gradients are ready (``buckets.py``),
on the steps whose exchange overlaps (a step of a method whose exchange does not, e.g.
PowerSGD's under ``controller: auto``, is one bucket that ``synchronize()`` starts). A
DDP communication hook (``gravac/torch/hooks.py``) hands in DDP's buckets instead
(``external_buckets``, ``start_bucket``).
How the values travel, and which rounds a selection needs, is the exchange's
(``exchanges/``): the pipeline writes the flags, the gains, the decision, the skip and
rollback, ``t_discarded`` and the step record once, for all of them.

A bucket leaves as soon as it is selected when the level it sends is known before the
gains (Static, Accordion, GraVAC ``decide="previous"``); otherwise its compressed layers
wait for the decision and go in one exchange after the gains allreduce (with overlap the
dense layers leave at once; without it they wait too, so that the step sends one
exchange). An exchange whose collectives must not run beside the world's
(``world_beside``: hierarchical) waits for the gains and the flags with every layer.

Every collective depends only on values every rank shares (the plan, agreed gains,
agreed NaN flags), so every rank issues the same collectives in the same order. A step
whose flags say some rank had a NaN/Inf is skipped on every rank, after the round that
carried the flags (the gains allreduce, the last bucket's dense group, or one tiny
allreduce beside the exchange; first of all when the controller observes gradients):
the residuals are rolled back and nothing received is written into the gradients.

Example::

    engine = StepEngine(layers, compressor, controller, comm, GravacOptions())
    stats = engine.synchronize(step=0, lr_decayed=False, t_compute=None)  # grads averaged
    optimizer.step()
    engine.end_step(stats, samples=32 * comm.size)
"""
from __future__ import annotations

import gc
import time
import weakref
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from .. import compressors as _compressors
from ..comm import Comm
from ..comm.handshake import describe as describe_gravac
from ..controllers import SENT_CANDIDATE, SENT_DENSE, SENT_MIN, Controller, StepPlan, StepRecord
from ..memory import ResidualMemory, follow_devices
from .agreement import check_agreement
from .buckets import BackwardHooks, build_buckets
from .exchanges import EXCHANGES, SentLayer, exchange_class
from .layers import Layer
from .options import GravacOptions
from .phases import PhaseClock, discarded_time
from .record import SENT_SKIPPED, StepStats
from .selection import flagged_ranks, lag_terms, nonfinite_flag


class AgreedGains(NamedTuple):
    """``StepEngine.agree_gain_rows``: the gains of both levels, the ranks that had a
    NaN/Inf, the per-layer rows summed over ranks (None unless asked for) and the
    residual's lag (None unless its terms were given)."""

    gain_min: float
    gain_c: float
    bad_ranks: list
    layers: dict | None = None
    lag: float | None = None


@dataclass
class _Step:
    """What one step has done so far."""

    step: int
    plan: StepPlan
    clock: PhaseClock
    #: (first level, candidate level) of each layer compressed this step, whole model.
    planned: dict[str, tuple]
    all_candidate: bool
    level: str | None                 # what compressed layers send; None: after the gains
    hold_all: bool                    # dense layers wait for the decision too
    #: Backward's hooks start the buckets: there are hooks, and this step's exchange
    #: overlaps (a method on one that does not, e.g. PowerSGD's, runs in synchronize).
    overlapped: bool
    buckets: list                     # the step's buckets: ``self.buckets`` or one
    #: No bucket will be added (cut outside the engine, e.g. by DDP: open until its last).
    closed: bool = True
    ready: set = field(default_factory=set)
    next_bucket: int = 0
    pendings: list = field(default_factory=list)
    rows: list = field(default_factory=list)           # gain rows, one per selection
    row_names: list = field(default_factory=list)      # their layers (plan.layer_gains)
    lag_terms: list = field(default_factory=list)      # per bucket (plan.measure_lag)
    held: list = field(default_factory=list)           # selections waiting for the decision
    held_dense: list = field(default_factory=list)     # dense layers waiting (hold_all)
    sent: list = field(default_factory=list)           # SentLayer of what left compressed
    discarded_floats: int = 0         # selection traffic of layers that then went dense
    select_bytes: int = 0
    local_bad: bool | torch.Tensor = False             # on a GPU: a device flag, no sync
    scanned: bool = False             # every gradient scanned for NaN/Inf already
    flags_agreed: bool = False
    flags_carrier: object = None      # the exchange the flags ride in
    staged: dict | None = None        # gradient copies for the controller (overlap)
    t_hooks: float = 0.0
    #: A skip counts toward max_consecutive_skips (not under an AMP GradScaler, which
    #: lowers its scale after each overflow: a streak of them is normal).
    limit_skips: bool = True
    #: Layers frozen on this rank (``requires_grad`` off since the optimizer was built):
    #: they send zeros, their residuals sit the step out.
    frozen: frozenset = frozenset()
    #: Layers whose gradient came sparse (an embedding's): name -> its sparse_dim, to
    #: hand the optimizer a sparse gradient again.
    sparse: dict = field(default_factory=dict)
    #: Dense layers divided by ``gradient_predivide_factor`` before their allreduce.
    prescaled: list = field(default_factory=list)


class StepEngine:
    """Compress, exchange and aggregate the gradients of ``layers`` for one step.

    ``options`` (``GravacOptions``) set the exchange, overlap, the NaN/Inf policy and the
    dense wire; ``host_of_rank`` overrides the launcher's host of each rank for the
    hierarchical exchange. ``step_context()`` gives (step, lr_decayed) of the step the
    first backward hook belongs to (the optimizer's clock), with overlap.
    """

    def __init__(self, layers: list[Layer], compressor, controller: Controller, comm: Comm,
                 options: GravacOptions, host_of_rank=None, step_context=None,
                 external_buckets: bool = False):
        options.check_with(compressor, controller)
        self.layers, self.compressor, self.controller = layers, compressor, controller
        self.comm, self.options, self.prefix = comm, options, options.name_prefix
        self.host_of_rank = host_of_rank
        #: The exchange of the step in progress (a plan naming a method picks its own).
        self.exchange = self._default_exchange = exchange_class(options.exchange, compressor)(
            comm, self.prefix, options.dense_wire, compressor, host_of_rank=host_of_rank)
        self._method_exchanges: dict[str, object] = {}
        #: PowerSGD of a controller's powersgd methods when the configured compressor is
        #: not PowerSGD already (its Q is checkpointed beside the compressor's state).
        self._extra_lowrank = None
        if any(m.kind == "powersgd" for m in controller.methods) and not compressor.is_lowrank:
            self._extra_lowrank = _compressors.get("powersgd")
        self.memory = ResidualMemory()
        self.skipped_steps: list[dict] = []
        self._consecutive_skips = 0
        # CUDA kernels run asynchronously: time phases only after the device has finished.
        self._refresh_devices()
        #: On CUDA, synchronise at every phase boundary for an exact split (costs a device
        #: sync per phase; ``benchmarks/step_profile.py`` turns it on). CPU: always exact.
        self.exact_phases = False
        self._state: _Step | None = None
        self._step_context = step_context
        self.hooks: BackwardHooks | None = None
        self.buckets = [layers]
        #: Buckets are cut outside the engine and handed in by ``start_bucket`` (a DDP
        #: communication hook), in the same order on every rank.
        self.external_buckets = external_buckets
        if external_buckets and options.overlap:
            raise ValueError("overlap=True: the buckets a DDP communication hook hands in "
                             "already overlap with backward; leave overlap at false")
        if options.overlap:
            self.buckets = build_buckets(layers, int(options.bucket_cap_mb * 2**20))
            self.hooks = BackwardHooks(layers, self._on_ready, options.backward_passes_per_step)
        for component, what in ((controller, "controller"), (compressor, "compressor")):
            _claim(component, self, what)
        self.controller.bind(self.compressed_layer_names, comm)
        self.controller.observe_layers(
            {l.name: tuple(l.param.shape) for l in layers if l.compressible},
            sum(l.numel for l in layers if not l.compressible), options.exchange)

    @property
    def compressed_layer_names(self) -> list[str]:
        return [l.name for l in self.layers if l.compressible]

    @property
    def active(self) -> bool:
        """A step has begun (a backward hook ran) and ``synchronize`` has not finished it."""
        return self._state is not None

    # -- world ----------------------------------------------------------------------------
    def agree(self, description: dict) -> None:
        """Collective: every rank must describe the same set-up (raises on all otherwise)."""
        check_agreement(description, self.comm, name=f"{self.prefix}.agree")

    def describe_setup(self) -> dict:
        """What every rank must agree on: compressor, controller, parameters, options."""
        return {
            # Another gravac on some rank would issue other collectives.
            "gravac": describe_gravac(),
            "compressor": self.compressor.describe(),
            "controller": self.controller.describe(),
            # Buckets decide the collectives: every rank must cut them alike.
            **self.options.describe(),
            "exchange": self.exchange.describe(),
            "parameters": [f"{l.name} {tuple(l.param.shape)} {l.param.dtype}"
                           f"{' compressed' if l.compressible else ''}" for l in self.layers],
        }

    def rebind(self, comm: Comm) -> None:
        """Use ``comm`` from now on (an elastic reset); the controller keeps its state."""
        self.comm = comm
        # (A method's exchange may be the default one: bound once.)
        for exchange in {id(e): e for e in (self._default_exchange,
                                            *self._method_exchanges.values())}.values():
            exchange.bind(comm)
        self.reset()
        self.controller.rebind(self.compressed_layer_names, comm)

    def reset(self) -> None:
        """Forget a step left half-done (an elastic reset: its collectives are gone)."""
        self._state = None
        if self.hooks is not None:
            self.hooks.reset()

    def remove_hooks(self) -> None:
        """Back to one bucket that ``synchronize`` starts (no overlap)."""
        if self.hooks is not None:
            self.hooks.remove()
        self.hooks, self.buckets = None, [self.layers]

    def _refresh_devices(self) -> None:
        """Where the parameters live: ``device`` (the first layer's: small tensors made
        for the step, e.g. the NaN/Inf flags, go there) and the CUDA devices that ``now``
        waits for. Read again at every step: a model moved after the optimizer was built
        moves its parameters' data, not the parameters (all of them: the first one tells,
        a pass over every layer only when it moved)."""
        first = self.layers[0].param.device if self.layers else torch.device("cpu")
        if getattr(self, "device", None) == first:
            return
        devices = {l.param.device for l in self.layers}
        self.device = first
        self._cuda_devices = sorted((d for d in devices if d.type == "cuda"), key=str)

    @property
    def _cuda(self) -> bool:
        return bool(self._cuda_devices)

    def now(self) -> float:
        """The clock, read after the parameters' CUDA devices finished their work (not
        the current device's: a rank's model may live on another GPU than the current)."""
        for device in self._cuda_devices:
            torch.cuda.synchronize(device)
        return time.perf_counter()

    # -- the step -------------------------------------------------------------------------
    def synchronize(self, step: int, lr_decayed: bool, t_compute: float | None,
                    limit_skips: bool = True) -> StepStats:
        """Average every layer's gradient across ranks (compressed as the controller
        plans), in place in ``.grad``; returns what the step did. With overlap, the
        buckets that backward's hooks started are finished. ``limit_skips=False``: a
        skipped step does not count toward ``max_consecutive_skips`` (an AMP step)."""
        state = self._state or self._begin(step, lr_decayed)
        state.limit_skips = limit_skips
        state.clock.resume()
        try:
            if not state.overlapped:
                skipped = self._before_buckets(state, t_compute)
                if skipped is not None:
                    return skipped
            return self._finish(state, t_compute)
        finally:
            self.reset()

    def _begin(self, step: int, lr_decayed: bool) -> _Step:
        self._refresh_devices()
        clock = PhaseClock(self.now, exact=not self._cuda or self.exact_phases)
        # A learning-rate decay must reach the controller before it plans the step that
        # uses the new rate.
        if lr_decayed:
            self.controller.on_lr_decay()
        plan = self.controller.plan(step)
        self.exchange = self._exchange_for(plan.method)
        if plan.measure_lag and not plan.needs_gains:
            # (Its terms ride in the gains' allreduce.)
            raise RuntimeError("a plan asked for the residual's lag without gains "
                               "(StepPlan.measure_lag needs needs_gains)")
        if plan.layer_gains and not self.exchange.selects_every_layer:
            # (The plan is the same on every rank: every rank raises here.)
            raise RuntimeError(f"a plan asked for per-layer gains over the {self.exchange.kind} "
                               "exchange, whose ranks select different layers")
        planned = {}
        for layer in self.layers:
            if layer.compressible:
                levels = self.exchange.plan_layer(layer, plan)
                if levels is not None:
                    planned[layer.name] = levels
        all_candidate = bool(planned) and all(c is not None for _, c in planned.values())
        level = plan.decided if plan.needs_gains else SENT_MIN
        if level == SENT_CANDIDATE and not all_candidate:
            raise RuntimeError("controller decided the candidate but its plan has no candidate "
                               "CF above theta_min")
        clock.lap("t_control")
        overlapped = (self.hooks is not None or self.external_buckets) and self.exchange.overlaps
        hold_all = not self.exchange.world_beside or (level is None and not overlapped)
        # (DDP's buckets hold what DDP's reducer wrote: its own rules for frozen layers.)
        frozen = frozenset() if self.external_buckets else frozenset(
            l.name for l in self.layers if not l.param.requires_grad)
        self.memory.begin_step(held=frozen)
        buckets = [self.layers]
        if overlapped:
            buckets = [] if self.external_buckets else self.buckets
        self._state = _Step(step, plan, clock, planned, all_candidate, level, hold_all,
                            overlapped, buckets, closed=not (overlapped and self.external_buckets),
                            frozen=frozen)
        if overlapped:
            # The exchange's work before selection, gradients or not (an overlapping
            # exchange's begin does not read them; without hooks: _before_buckets).
            self.exchange.begin(self.layers, clock)
            if self.controller.wants_gradients:
                self._state.staged = {}
        return self._state

    def _exchange_for(self, method):
        """The exchange of ``method`` (``StepPlan.method``; None: the configured one), made
        on first use and kept (its codecs and buffers with it): dense and fp16 by grouped
        allreduce, PowerSGD by the low-rank exchange, a sparse CF by the exchange that
        suits the world (``Method.exchange_for``)."""
        if method is None:
            return self._default_exchange
        exchange = self._method_exchanges.get(method.key)
        if exchange is None:
            wire, comp = self.options.dense_wire, self.compressor
            if method.dense:
                kind, wire = "allgather", ("fp16" if method.kind == "fp16" else "native")
            elif method.kind == "powersgd":
                kind = "lowrank"
                comp = self.compressor if self._extra_lowrank is None else self._extra_lowrank
            else:
                kind = method.exchange_for(self.comm.size, self.options.exchange)
            if (kind, wire, comp) == (self._default_exchange.kind, self.options.dense_wire,
                                      self.compressor):
                # One instance per exchange: the hierarchical one owns its process sets.
                exchange = self._default_exchange
            else:
                exchange = EXCHANGES[kind](self.comm, self.prefix, wire, comp,
                                           host_of_rank=self.host_of_rank)
            self._method_exchanges[method.key] = exchange
        return exchange

    @property
    def compressors(self) -> list:
        """Every compressor a step may use (the configured one, and PowerSGD's for a
        controller choosing methods): their state is checkpointed."""
        extra = [] if self._extra_lowrank is None else [self._extra_lowrank]
        return [self.compressor, *extra]

    def _before_buckets(self, state: _Step, t_compute) -> StepStats | None:
        """Without hooks every gradient is here: a controller that observes gradients
        (Accordion) must not see a skipped step's, so the flags are agreed first, in a
        round of their own; and the exchange's work before selection runs."""
        clock = state.clock
        self._prepare_grads(state, self.layers)
        # Before the exchange's first work (the hierarchical host average would spread a
        # NaN to the host's other ranks).
        state.local_bad = nonfinite_flag([l.param.grad for l in self.layers])
        state.scanned = True
        clock.lap("t_check")
        if self.controller.observes_gradients:   # the same on every rank
            bad_ranks = self._agree_flags(state.local_bad, clock)
            if bad_ranks:
                return self.skip(state.step, bad_ranks, clock, t_compute, state.limit_skips,
                                 plan=state.plan)
            state.flags_agreed = True
        if self.controller.wants_gradients:      # may differ per rank: no collective here
            self.controller.observe_gradients(
                {l.name: l.param.grad for l in self.layers if l.compressible})
            clock.lap("t_control")
        self.exchange.begin(self.layers, clock)
        return None

    def _on_ready(self, layer: Layer) -> None:
        """A backward hook: ``layer``'s gradient is complete; start what is ready."""
        self._hand_in([layer])

    def start_bucket(self, layers: list[Layer], last: bool) -> None:
        """A bucket cut outside the engine (``external_buckets``: a DDP communication
        hook, which hands DDP's buckets in DDP's order, the same on every rank):
        ``layers``' gradients are complete. On a step whose exchange overlaps the bucket
        leaves now; on one that does not (PowerSGD's) every bucket waits for
        ``synchronize``, which finishes the step after the ``last`` one."""
        state = self._state
        if last:
            handed = {l.index for l in layers} | (set() if state is None else state.ready)
            missing = [l.name for l in self.layers if l.index not in handed]
            if missing:      # the same on every rank: the model and DDP's buckets are
                raise RuntimeError(
                    f"{len(missing)} parameter(s) the step averages were in none of the "
                    f"buckets handed in ({', '.join(missing[:3])}); a DDP model must hold "
                    "exactly the parameters gravac was built on (requires_grad ones, none "
                    "of DDP's ignored ones)")
        self._hand_in(layers, bucket=True, last=last)

    def _hand_in(self, layers: list[Layer], bucket: bool = False, last: bool = False) -> None:
        # What the hooks add to the phases is taken out of t_compute (backward's time) by
        # synchronize: the phase time charged in this hook, not the hook's wall time, which
        # on a GPU with exact phases would include waiting for backward's own kernels.
        state = self._state
        charged = 0.0 if state is None else state.clock.charged()
        if state is None:
            state = self._begin(*self._step_context())
        state.clock.resume()
        state.ready.update(l.index for l in layers)
        if bucket and state.overlapped:
            state.buckets.append(layers)
            state.closed = last
        if state.overlapped:     # else synchronize starts the one bucket
            self._start_ready(state)
        state.t_hooks += state.clock.charged() - charged

    def _start_ready(self, state: _Step) -> None:
        while state.next_bucket < len(state.buckets) and \
                all(l.index in state.ready for l in state.buckets[state.next_bucket]):
            self._start_bucket(state, state.next_bucket)
            state.next_bucket += 1

    @staticmethod
    def _tag(state: _Step, what) -> str:
        """The end of a bucket's collectives' names: buckets in flight at once (overlap)
        need different ones; without overlap there is one exchange and no tag."""
        return f".{what}" if state.overlapped else ""

    def _start_bucket(self, state: _Step, b: int) -> None:
        clock, plan, memory, exchange = state.clock, state.plan, self.memory, self.exchange
        layers = state.buckets[b]
        self._prepare_grads(state, layers)
        if not state.scanned:
            # On a GPU a device flag, or-ed over the buckets: no host sync in the hooks.
            bad = nonfinite_flag([l.param.grad for l in layers])
            state.local_bad = bad if state.local_bad is False else state.local_bad | bad
            clock.lap("t_check")
        if state.staged is not None:
            for layer in layers:
                if layer.compressible:
                    state.staged[layer.name] = layer.param.grad.detach().clone()
            clock.lap("t_control")
        work = exchange.mine(layers)
        compressed = [l for l in work if l.name in state.planned]
        dense = [l for l in work if l.name not in state.planned]
        for layer in dense:
            if layer.compressible:
                # Planned dense: its gradient absorbs the residual (free when that is zero,
                # e.g. GraVAC settled on dense on a fast link).
                memory.flush_into(layer.name, layer.param.grad)
        g_efs = memory.compensate_all([l.name for l in compressed],
                                      [l.param.grad for l in compressed])
        clock.lap("t_feedback")
        if plan.measure_lag and compressed:
            # Before selection, while g_ef is g + r (gravac/engine/selection.py).
            state.lag_terms.append(lag_terms([l.param.grad for l in compressed], g_efs))
            clock.lap("t_norms")
        selections = []
        if compressed:
            fed = [(l, g, *state.planned[l.name]) for l, g in zip(compressed, g_efs)]
            selections, nbytes = exchange.select(fed, state.step, clock)
            state.select_bytes += nbytes
        if plan.needs_gains:
            # Measured now, before the residual update reuses g_ef's buffer.
            state.rows.extend(exchange.gain_rows(selections, plan.gain_measure))
            if plan.layer_gains:
                state.row_names.extend(s.layer.name for s in selections)
            clock.lap("t_norms")
        if state.hold_all:
            state.held.extend(selections)
            state.held_dense.extend(dense)
            return
        if state.level is None:
            state.held.extend(selections)
            selections = []
        sent = self._settle(state, selections, state.level, dense)
        # The last bucket's scan completes this rank's flags: without a gains round to
        # carry them, they ride in its dense group (if it has one).
        last = state.closed and b == len(state.buckets) - 1 and not plan.needs_gains \
            and not state.flags_agreed
        self._start(state, sent, dense, self._tag(state, f"b{b}"),
                    flags=self.flags(state.local_bad) if last else None)

    def _prepare_grads(self, state: _Step, layers: list[Layer]) -> None:
        """Every layer's gradient dense, in the layout every rank sends: zeros where there
        is none (another rank may have one) or where the layer is frozen here; a sparse
        one (an embedding's) densified and compressed like any other layer."""
        for layer in layers:
            grad = layer.param.grad
            if grad is not None and grad.is_sparse:
                state.sparse[layer.name] = grad.sparse_dim()
            densify_grad(layer)
            if layer.name in state.frozen:
                layer.param.grad.zero_()     # a gradient left from before the freeze

    def _after_unpack(self, state: _Step) -> bool:
        """The averages as the optimizer takes them: Horovod's ``op`` and
        ``gradient_predivide_factor``, sparse gradients sparse again, and no gradient at
        all for a layer frozen here that no rank sent anything for (the optimizer then
        leaves it alone, momentum and weight decay included, as without gravac).
        Whether there was anything to do (most steps: no)."""
        if state.prescaled:
            torch._foreach_mul_([l.param.grad for l in state.prescaled],
                                self.options.gradient_predivide_factor)
        if self.options.op == "sum":
            torch._foreach_mul_([l.param.grad for l in self.layers], float(self.comm.size))
        # (Most steps have neither: no pass over the layers then.)
        for layer in self.layers if state.frozen or state.sparse else ():
            if layer.name in state.frozen and not layer.param.grad.any():
                # Zero on every rank alike only when every rank sent zeros: a rank that
                # did not freeze the layer keeps it trained everywhere.
                layer.param.grad = None
            elif layer.name in state.sparse:
                layer.param.grad = layer.param.grad.to_sparse(state.sparse[layer.name])
        return bool(state.prescaled or state.frozen or state.sparse
                    or self.options.op == "sum")

    def _settle(self, state: _Step, selections, level: str, dense: list) -> list[SentLayer]:
        """Send ``selections`` at ``level``: what the exchange sends of each, the residual
        keeping the rest; on a dense decision g_ef goes whole (into ``dense``)."""
        if level != SENT_DENSE:
            sent = self.exchange.settle(self.memory, selections, level)
        else:
            sent = []
            if selections:      # g_ef whole into each gradient, then every residual zero
                torch._foreach_copy_([s.layer.param.grad.view(-1) for s in selections],
                                     [s.g_ef for s in selections])
                self.memory.clear_all([s.layer.name for s in selections])
            for s in selections:
                dense.append(s.layer)
                state.discarded_floats += s.select_floats
        if selections:
            state.clock.lap("t_residual")
        return sent

    def _start(self, state: _Step, sent: list[SentLayer], dense: list[Layer], tag: str,
               flags: torch.Tensor | None = None) -> None:
        if not sent and not dense:
            return                       # the same on every rank: the plan decides it
        factor = self.options.gradient_predivide_factor
        if factor != 1.0 and dense:
            # Horovod's split average: 1/f before the sum (the fp16 wire's range), f/N
            # after. Sparse values are summed in their own dtype after the allgather.
            torch._foreach_div_([l.param.grad for l in dense], factor)
            state.prescaled.extend(dense)
        pending = self.exchange.start(sent, dense, tag, flags,
                                      same_size=self.exchange.compressor.exact_count)
        state.clock.lap("t_pack", sync=True)
        if pending.carries_flags:
            state.flags_carrier = pending
        state.sent.extend(sent)
        state.pendings.append(pending)

    def _finish(self, state: _Step, t_compute: float | None) -> StepStats:
        clock, plan = state.clock, state.plan
        if t_compute is not None:
            t_compute = max(t_compute - state.t_hooks, 0.0)   # hook work is in the phases
        state.ready.update(l.index for l in self.layers)
        self._start_ready(state)         # layers without a gradient: zeros, in order
        gain_min = gain_c = None
        bad_ranks: list[int] = []
        flags = None
        sent = state.level
        lag = None
        if plan.needs_gains:
            agreed = self.agree_gain_rows(
                state.rows, clock, None if state.flags_agreed else state.local_bad,
                names=state.row_names if plan.layer_gains else None,
                lag_terms=state.lag_terms if plan.measure_lag else None)
            gain_min, gain_c, bad_ranks = agreed.gain_min, agreed.gain_c, agreed.bad_ranks
            state.flags_agreed = True
            if not bad_ranks:
                if not state.all_candidate:
                    gain_c = None
                if agreed.layers is not None:
                    self.controller.observe_layer_gains(agreed.layers)
                lag = agreed.lag
                if lag is not None:
                    self.controller.observe_lag(lag)
                sent = self._decide(gain_min, gain_c, state)
                clock.lap("t_control")
        if not bad_ranks and (state.held or state.held_dense):
            if not state.flags_agreed and state.hold_all:
                # Never beside the exchange (world_beside): the flags' round of its own,
                # before it (a 2x2 Horovod run hung when they ran beside a shard group's).
                bad_ranks = self._agree_flags(state.local_bad, clock)
                state.flags_agreed = True
            if not bad_ranks:
                dense = list(state.held_dense)
                payload = self._settle(state, state.held, sent, dense)
                self._start(state, payload, dense, self._tag(state, "held"))   # flags agreed
        if not bad_ranks and not state.flags_agreed and state.flags_carrier is None:
            # No group carried the flags: one more tiny allreduce, beside the exchange.
            flags = self.comm.allreduce_async(self.flags(state.local_bad), op="sum",
                                              name=f"{self.prefix}.finite")
        for pending in state.pendings:
            pending.wait()
        if flags is not None:
            bad_ranks = flagged_ranks(flags.wait())
        elif state.flags_carrier is not None and not bad_ranks:
            bad_ranks = state.flags_carrier.flagged_ranks()
        clock.lap("t_wait_exchange", sync=True)
        if bad_ranks:
            # What arrived is not written (dense buckets were reduced in place, but the
            # step is skipped); residuals go back.
            self.memory.rollback_step()
            return self.skip(state.step, bad_ranks, clock, t_compute, state.limit_skips,
                             plan=state.plan)
        for pending in state.pendings:
            pending.unpack()
        clock.lap("t_unpack", sync=True)
        self.exchange.end(clock)
        if self._after_unpack(state):
            clock.lap("t_unpack")
        if state.staged:
            self.controller.observe_gradients(state.staged)
            clock.lap("t_control")
        return self._record(state, sent or SENT_MIN, gain_min, gain_c, t_compute, lag)

    def _decide(self, gain_min: float, gain_c: float | None, state: _Step) -> str:
        """``controller.decide`` from the agreed gains (``SENT_MIN`` when no layer is
        compressed), refusing an answer outside the three, or the candidate when none was
        planned. A plan that decided before the step (GraVAC ``decide="previous"``) sends
        its level; ``decide`` still sees the gains, which update its averages."""
        if not state.planned:
            return SENT_MIN
        sent = self.controller.decide(gain_min, gain_c)
        if state.plan.decided is not None:
            sent = state.plan.decided
        if sent not in (SENT_CANDIDATE, SENT_MIN, SENT_DENSE):
            raise RuntimeError(f"controller returned {sent!r}; expected one of "
                               f"{SENT_CANDIDATE!r}, {SENT_MIN!r}, {SENT_DENSE!r}")
        if sent == SENT_CANDIDATE and not state.all_candidate:
            raise RuntimeError("controller chose the candidate but its plan had no candidate "
                               "CF above theta_min")
        return sent

    def _record(self, state: _Step, sent: str, gain_min, gain_c, t_compute,
                lag: float | None = None) -> StepStats:
        """The step record of a step that was sent."""
        plan, clock = state.plan, state.clock
        went_dense = sent == SENT_DENSE
        remote = [] if went_dense else self.exchange.remote(
            [(l, *state.planned[l.name]) for l in self.layers if l.name in state.planned], sent)
        sparse = state.sent + remote
        names = {s.layer.name for s in sparse}
        dense_numel = sum(l.numel for l in self.layers if l.name not in names)
        kept = sum(s.values for s in sparse)
        effective = sum(s.layer.numel for s in sparse) / kept if kept else 1.0
        by_rank = plan.layer_rank is not None
        if not sparse:
            sent, cf_sent = SENT_DENSE, 1.0    # nothing went compressed this step
        elif by_rank:
            cf_sent = effective
        elif sent == SENT_CANDIDATE:
            cf_sent = float(plan.theta_c)
        elif plan.layer_cf is None:
            cf_sent = float(plan.theta_min)
        else:
            cf_sent = effective
        if by_rank:
            layer_cf = {s.layer.name: s.layer.numel / s.values for s in sparse}
        else:
            layer_cf = None if plan.layer_cf is None else dict(plan.layer_cf)
        values = kept + state.discarded_floats
        self._consecutive_skips = 0
        return StepStats(
            step=state.step, sent=sent, cf=cf_sent,
            # What really travelled: DGC and RedSync keep about, not exactly, n/θ values.
            cf_actual=effective,
            # Planned in ranks, θmin is what the ranks came to.
            theta_min=cf_sent if by_rank else float(plan.theta_min),
            theta_c=None if plan.theta_c is None else float(plan.theta_c),
            gain_min=gain_min, gain_c=gain_c, lag=lag,
            sparse_layers=len(sparse), dense_layers=len(self.layers) - len(sparse),
            values_sent=values,
            # Values and indices each count as one float (as the paper counts), plus dense.
            floats_sent=values + sum(s.index_floats for s in sparse) + dense_numel,
            dense_floats=sum(l.numel for l in self.layers),
            bytes_sent=sum(p.bytes_sent for p in state.pendings) + state.select_bytes,
            t_compute=t_compute, t_compress=clock.local(), t_comm=clock.waits(),
            t_discarded=discarded_time(clock.times, went_dense, bool(state.planned)),
            **clock.times, layer_cf=layer_cf,
            method=_method_name(plan))

    def end_step(self, stats: StepStats, samples: float | None) -> None:
        """Tell the controller how the step went (every rank, same order); fills the
        smoothed gains into ``stats``. Its t_iter leaves out ``t_discarded``."""
        gain = {SENT_CANDIDATE: stats.gain_c, SENT_MIN: stats.gain_min}.get(stats.sent, 1.0)
        t_iter = stats.t_iter
        if t_iter is not None and stats.t_discarded:
            t_iter = max(t_iter - stats.t_discarded, 0.0)
        # The step's own smoothed gains, read before a window's end resets them (the step
        # line then showed delta_c null beside the gain_c that had just moved θc).
        summary = self.controller.summary()
        self.controller.end_step(
            StepRecord(step=stats.step, sent=stats.sent, cf=stats.cf,
                       gain=1.0 if gain is None else gain, t_iter=t_iter,
                       samples=samples,
                       extra={"t_comm": stats.t_comm,
                              "t_pack": (stats.t_pack or 0.0) + (stats.t_unpack or 0.0)}),
            self.comm)
        stats.delta_min, stats.delta_c = summary.get("delta_min"), summary.get("delta_c")

    # -- agreement ------------------------------------------------------------------------
    def agree_gain_rows(self, rows: list[torch.Tensor], clock: PhaseClock | None = None,
                        local_bad: bool | torch.Tensor | None = None,
                        names: list[str] | None = None,
                        lag_terms: list[torch.Tensor] | None = None) -> AgreedGains:
        """Whole-model compression gains of both levels from per-layer rows (``gain_row``,
        or [layers, 3] tables of them: ``gain_rows`` on a GPU), summed over ranks with one
        tiny allreduce: (gain_min, gain_c, ranks with a NaN/Inf gradient, per-layer rows).
        ``"energy"`` rows give Σ‖g_min‖²/Σ‖g_ef‖² and Σ‖g_c‖²/Σ‖g_ef‖²
        (Algorithm 1); ``"norm"`` rows Σ‖g_min‖/Σ‖g‖ and Σ‖g_c‖/Σ‖g‖ with the raw gradient g,
        as in the authors' code (it may exceed 1). ``local_bad`` (this rank's NaN/Inf flag,
        None when already agreed) rides in the same allreduce. ``names`` (the rows' layers,
        the same on every rank): the rows travel per layer instead of summed (3 values a
        layer), and their sums over ranks come back by name (``StepPlan.layer_gains``).
        ``lag_terms`` (``selection.lag_terms`` of each bucket): their sums ride in the same
        allreduce, and the lag Σ⟨r, g⟩ / Σ‖g‖² comes back (``StepPlan.measure_lag``).

        The rows are summed on the gradients' device, the flags appended there, and the
        lot moved to the host at once: one device sync per step for the gains and the
        flags, not one per layer. The allreduce itself runs on that CPU tensor (what every
        transport takes; torch.distributed with nccl moves it to the GPU and back)."""
        if rows:
            device = rows[0].device
            rows = [r.reshape(-1, 3) for r in rows]
            if any(r.device != device for r in rows):
                rows = [r.to(device) for r in rows]
            table = torch.cat(rows).double()
        else:
            device = local_bad.device if isinstance(local_bad, torch.Tensor) \
                else torch.device("cpu")
            table = torch.zeros(0, 3, dtype=torch.float64, device=device)
        if names is not None and len(names) != table.shape[0]:
            raise RuntimeError(f"{len(names)} layer names for {table.shape[0]} gain rows")
        sums = table.reshape(-1) if names is not None else table.sum(0)
        width = sums.numel()
        if lag_terms is not None:
            terms = [t.to(device) for t in lag_terms] or \
                [torch.zeros(2, dtype=torch.float64, device=device)]
            sums = torch.cat([sums, torch.stack(terms).sum(0)])
        if local_bad is not None:
            sums = torch.cat([sums, self.flags(local_bad, device=device)])
        sums = sums.cpu()
        if clock is not None:
            clock.lap("t_norms", sync=True)
        sums = self.comm.allreduce(sums, op="sum", name=f"{self.prefix}.gains")
        if clock is not None:
            clock.lap("t_wait_gains", sync=True)
        lag = None
        if lag_terms is not None:
            dot, g_sq = float(sums[width]), float(sums[width + 1])
            lag = dot / g_sq if g_sq > 0 else 0.0
        skip = width + (2 if lag_terms is not None else 0)
        bad_ranks = flagged_ranks(sums[skip:]) if local_bad is not None else []
        layers = None
        if names is not None:
            agreed = sums[:width].reshape(-1, 3)
            layers = {name: tuple(float(x) for x in row) for name, row in zip(names, agreed)}
            sums = agreed.sum(0)
        total = float(sums[2])
        if bad_ranks or total <= 0.0:
            return AgreedGains(1.0, 1.0, bad_ranks, layers, lag)
        return AgreedGains(float(sums[0]) / total, float(sums[1]) / total, bad_ranks, layers,
                           lag)

    def flags(self, local_bad: bool | torch.Tensor,
              device: torch.device | str | None = None) -> torch.Tensor:
        """One entry per rank, 1 at this rank's if its gradient has a NaN or Inf: summed
        over ranks, the entries name the ranks that had one. ``local_bad``: a bool, or a
        0-dim bool tensor (``nonfinite_flag`` on a GPU), written in without reading it
        (no host sync). Made on ``device``; by default the flag's own (the CPU for a
        bool), so flags from a GPU are reduced on the GPU, with the gradients."""
        if device is None:
            device = local_bad.device if isinstance(local_bad, torch.Tensor) \
                else torch.device("cpu")
        flags = torch.zeros(self.comm.size, dtype=torch.float64, device=device)
        if isinstance(local_bad, torch.Tensor):
            flags[self.comm.rank] = local_bad.to(device)
        elif local_bad:
            flags[self.comm.rank] = 1.0
        return flags

    def _agree_flags(self, local_bad: bool | torch.Tensor, clock: PhaseClock) -> list[int]:
        """Ranks whose gradient has a NaN or Inf this step, agreed by one tiny allreduce
        of their own."""
        clock.lap("t_check", sync=True)
        flags = self.comm.allreduce(self.flags(local_bad), op="sum", name=f"{self.prefix}.finite")
        clock.lap("t_wait_check", sync=True)
        return flagged_ranks(flags)

    def skip(self, step: int, bad_ranks: list[int], clock: PhaseClock, t_compute,
             limit_skips: bool = True, plan: StepPlan | None = None) -> StepStats:
        """A step some rank's NaN/Inf stops, on every rank: every gradient becomes NaN
        (what reads them next, clipping or AMP's GradScaler, sees the skip on every rank
        alike; they held a mix of local and partly averaged values), nothing is updated.
        ``plan``: the step's, whose method the record names."""
        for layer in self.layers:
            if layer.param.grad is not None:
                layer.param.grad.fill_(float("nan"))
        self._consecutive_skips += int(limit_skips)
        self.skipped_steps.append({"step": step, "ranks": bad_ranks})
        limit = self.options.max_consecutive_skips
        if self.options.nonfinite == "raise" or self._consecutive_skips > limit:
            why = ("nonfinite='raise'" if self.options.nonfinite == "raise" else
                   f"{self._consecutive_skips} consecutive steps skipped (max_consecutive_skips="
                   f"{limit})")
            raise FloatingPointError(
                f"non-finite gradient (NaN or Inf) at step {step} on rank(s) "
                f"{', '.join(map(str, bad_ranks))}; stopping: {why}. Lower the learning rate, "
                "clip gradients (optimizer.grad_clip) or check the data of those ranks.")
        return StepStats(step=step, sent=SENT_SKIPPED, cf=1.0, nonfinite_ranks=bad_ranks,
                         method=_method_name(plan),
                         dense_floats=sum(l.numel for l in self.layers),
                         t_compute=t_compute, t_compress=clock.local(), t_comm=clock.waits(),
                         t_update=0.0, **clock.times)

    # -- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        state = {"memory": self.memory.state_dict(), "controller": self.controller.state_dict(),
                 "compressor": self.compressor.state_dict()}
        if self._extra_lowrank is not None:
            state["lowrank"] = self._extra_lowrank.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        # Residuals follow their parameter's device and dtype: a checkpoint written on a
        # CPU (or read with map_location="cpu") resumes on a GPU, and vice versa. So do the
        # per-layer tensors of the controller and the compressor (Accordion's
        # accumulators, PowerSGD's Q): each moves to its parameter's device now.
        like = {l.name: l.param for l in self.layers}
        # Before anything is loaded: residuals of names this engine lacks (a checkpoint of
        # an optimizer built with other names: named_parameters given or not, a "module."
        # prefix) were kept as dead entries and the resume was silently not exact.
        unknown = sorted(set(state["memory"].get("residuals", {})) - set(like))
        if unknown:
            raise ValueError(f"the state holds residuals of {len(unknown)} parameter name(s) "
                             f"this optimizer does not have ({', '.join(map(repr, unknown[:3]))}"
                             f"{', ...' if len(unknown) > 3 else ''}; its own: "
                             f"{', '.join(map(repr, list(like)[:3]))}, ...): it was saved with "
                             "other parameter names; build the optimizer with the "
                             "named_parameters it was saved with")
        self.memory.load_state_dict(state["memory"], like=like)
        self.controller.load_state_dict(follow_devices(state["controller"], like))
        self.compressor.load_state_dict(follow_devices(state.get("compressor", {}), like))
        if self._extra_lowrank is not None:
            self._extra_lowrank.load_state_dict(follow_devices(state.get("lowrank", {}), like))


def _method_name(plan: StepPlan | None) -> str | None:
    """What a step record names as the step's method: the plan's (Auto's), else None."""
    if plan is None or plan.method is None:
        return None
    return plan.method_name or plan.method.key


def densify_grad(layer: Layer) -> None:
    """A layer's gradient as a dense tensor, zeros where it has none: every rank must
    send every layer (another rank may have a gradient for it); sparse embedding
    gradients are compressed or averaged like any other layer (the optimizer then sees a
    dense gradient, as with sparse_as_dense). A gradient in another memory layout (a
    channels_last conv weight's) is made contiguous: the exchanges write the averages
    into flat views of it."""
    grad = layer.param.grad
    if grad is None:
        layer.param.grad = torch.zeros_like(layer.param, memory_format=torch.contiguous_format)
    elif grad.is_sparse:
        layer.param.grad = grad.to_dense()
    elif not grad.is_contiguous():
        layer.param.grad = grad.contiguous()


#: id(controller or compressor) -> (it, the engine it serves), both held weakly.
_OWNERS: dict[int, tuple[weakref.ref, weakref.ref]] = {}


def _claim(component, engine: StepEngine, what: str) -> None:
    """``component`` (a controller or a compressor) serves ``engine`` alone: it holds one
    training's state (GraVAC's windows, Accordion's per-layer norms, PowerSGD's Q), and a
    second optimizer or DDP hook given the same instance mixed two models' measurements
    (GraVAC's windows ended twice as often) or failed on one rank only (Accordion on
    models of other shapes, then a hang). Refused, in one line, before any collective."""
    def other_owner() -> bool:
        for key in [k for k, (it, owner) in _OWNERS.items() if it() is None or owner() is None]:
            del _OWNERS[key]
        held = _OWNERS.get(id(component))
        return held is not None and held[0]() is component and held[1]() is not engine
    # An optimizer dropped by the user (``opt = ...`` again) may still wait for the cycle
    # collector: collected before it counts as another owner.
    if other_owner():
        gc.collect()
    if other_owner():
        raise ValueError(f"this {what} ({component!r}) already serves another gravac "
                         f"optimizer or DDP hook: give each its own, e.g. a new "
                         f"{type(component).__name__}(...) per optimizer")
    _OWNERS[id(component)] = (weakref.ref(component), weakref.ref(engine))
