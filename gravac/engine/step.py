"""The step engine: one step's pipeline, independent of the transport.

plan -> NaN/Inf scan -> error feedback -> select (both levels) -> agree gains (and the
NaN/Inf flags) -> decide -> pack -> exchange (when no gains were agreed, the flags ride
in its dense group, or beside it when it has none) -> unpack -> step record. A plan that
has decided already (GraVAC ``decide="previous"``, E7) sends its level and agrees the
gains and flags after the exchange has started. It talks to
other ranks only through a ``Comm`` and to the controller only through its contract
(``plan``, ``decide``, ``end_step``), so the same engine runs on Horovod,
torch.distributed or one process.

Every collective it issues depends only on values every rank shares (the plan, agreed
gains, agreed NaN flags), so every rank issues the same collectives in the same order.
A step whose flags say some rank had a NaN/Inf is skipped on every rank, after the round
that carried the flags: the residuals are rolled back (``ResidualMemory.rollback_step``)
and nothing received is written into the gradients.

Example::

    engine = StepEngine(layers, compressor, controller, comm)
    stats = engine.synchronize(step=0, lr_decayed=False)   # grads now averaged
    optimizer.step()
    engine.end_step(stats, t_update=..., t_iter=..., samples=32 * comm.size)
"""
from __future__ import annotations

import time
from typing import NamedTuple

import torch

from ..comm import Comm
from ..compressors import Compressor, SelectContext, num_kept
from ..controllers import SENT_CANDIDATE, SENT_DENSE, SENT_MIN, Controller, StepRecord
from ..memory import ResidualMemory, follow_devices
from .agreement import check_agreement
from .decision import checked_decision
from .exchange import EXCHANGES, AllgatherExchange, check_exchange
from .hierarchical import HierarchicalStep
from .layers import Layer
from .lowrank import LowRankStep
from .phases import PhaseClock
from .record import SENT_SKIPPED, StepStats
from .selection import (Selection, apply_decision, flagged_ranks, gain_row,  # noqa: F401
                        gain_rows, has_nonfinite, nonfinite_flag)
from .shared_index import SharedIndexStep

class Decision(NamedTuple):
    """What ``StepEngine.decide`` agreed: the level sent (None on a skipped step), the
    gains, the ranks with a NaN/Inf, and this rank's flag if still to agree (a bool, or a
    0-dim bool tensor on a GPU: ``nonfinite_flag``)."""

    sent: str | None
    gain_min: float | None
    gain_c: float | None
    bad_ranks: list[int]
    local_bad: bool | torch.Tensor | None


__all__ = ["EXCHANGES", "StepEngine", "check_exchange", "flagged_ranks", "gain_row",
           "has_nonfinite", "nonfinite_flag"]


class StepEngine:
    """Compress, exchange and aggregate the gradients of ``layers`` for one step.

    ``nonfinite``: ``"skip"`` a step with a NaN/Inf gradient on any rank (on every rank),
    or ``"raise"``; ``max_consecutive_skips`` bounds the skips in a row. ``dense_wire``:
    ``"fp16"`` sends dense layers as fp16 (Horovod's Compression.fp16). ``exchange``: how
    sparse layers travel (``EXCHANGES``): ``"allgather"`` (the paper's),
    ``"allgather_coded"`` (the same with coded index fields, ``codec.py``), ``"hierarchical"``
    (``hierarchical.py``; ``host_of_rank`` overrides the launcher's host of each rank) or
    ``"shared_index"`` (``shared_index.py``). Building a hierarchical engine is collective.
    """

    def __init__(self, layers: list[Layer], compressor: Compressor, controller: Controller,
                 comm: Comm, prefix: str = "gravac", nonfinite: str = "skip",
                 max_consecutive_skips: int = 10, dense_wire: str = "native",
                 exchange: str = "allgather", host_of_rank=None):
        if nonfinite not in ("skip", "raise"):
            raise ValueError(f"nonfinite must be 'skip' (skip the step on every rank) or 'raise' "
                             f"(stop), got {nonfinite!r}")
        if isinstance(max_consecutive_skips, bool) or not isinstance(max_consecutive_skips, int) \
                or max_consecutive_skips < 0:
            raise ValueError(f"max_consecutive_skips must be an int >= 0, got "
                             f"{max_consecutive_skips!r}")
        self.layers, self.compressor, self.controller = layers, compressor, controller
        self.comm, self.prefix = comm, prefix
        self.nonfinite, self.max_consecutive_skips = nonfinite, max_consecutive_skips
        self.exchange = AllgatherExchange(comm, prefix, dense_wire,
                                          index_coding=exchange == "allgather_coded")
        self.memory = ResidualMemory()
        # Low-rank compressors (PowerSGD) send factors by allreduce: gravac/engine/lowrank.py.
        self.lowrank = LowRankStep(self) if compressor.is_lowrank else None
        self.exchange_kind = check_exchange(exchange, compressor)
        # The step of a non-default exchange (None: the allgather path below).
        self.route = None
        if exchange == "hierarchical":
            self.route = HierarchicalStep(self, host_of_rank)
        elif exchange == "shared_index":
            self.route = SharedIndexStep(self)
        self.skipped_steps: list[dict] = []
        self._consecutive_skips = 0
        # CUDA kernels run asynchronously: time phases only after the device has finished.
        self._refresh_devices()
        #: On CUDA, synchronise at every phase boundary for an exact split (costs a device
        #: sync per phase; ``benchmarks/step_profile.py`` turns it on). CPU: always exact.
        self.exact_phases = False
        #: A ``BackwardOverlap`` when the step starts in backward's hooks (overlap=True).
        self.overlap = None
        self.controller.bind(self.compressed_layer_names, comm)

    @property
    def compressed_layer_names(self) -> list[str]:
        return [l.name for l in self.layers if l.compressible]

    # -- world ----------------------------------------------------------------------------
    def agree(self, description: dict) -> None:
        """Collective: every rank must describe the same set-up (raises on all otherwise)."""
        check_agreement(description, self.comm, name=f"{self.prefix}.agree")

    def rebind(self, comm: Comm) -> None:
        """Use ``comm`` from now on (an elastic reset); the controller keeps its state."""
        self.comm = comm
        self.exchange.comm = comm
        if self.route is not None:
            self.route.bind(comm)
        if self.overlap is not None:
            self.overlap.reset()
        self.controller.rebind(self.compressed_layer_names, comm)

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
    def synchronize(self, step: int, lr_decayed: bool, t_compute: float | None) -> StepStats:
        """Average every layer's gradient across ranks (compressed as the controller
        plans), in place in ``.grad``; returns what the step did. With ``overlap`` (a
        ``BackwardOverlap``), the buckets that backward's hooks started are finished."""
        if self.overlap is not None:
            return self.overlap.synchronize(t_compute)
        self._refresh_devices()
        clock = PhaseClock(self.now, exact=not self._cuda or self.exact_phases)
        # A learning-rate decay must reach the controller before it plans the step that
        # uses the new rate.
        if lr_decayed:
            self.controller.on_lr_decay()
        plan = self.controller.plan(step)
        clock.lap("t_control")
        self._densify_grads()
        # NaN/Inf: each rank scans its gradients now, before error feedback; the ranks agree
        # on the flags together with data they exchange anyway (the gains allreduce, the
        # exchange's dense group, or beside the exchange), so a step has no round of its
        # own for it. Residuals are updated into spare buffers and rolled back if a rank
        # had one. A controller that observes gradients (Accordion) must not see a skipped
        # step's: it agrees first. On a GPU the flag stays there (no host sync) until it
        # travels with the gains or the exchange.
        local_bad = nonfinite_flag([l.param.grad for l in self.layers])
        clock.lap("t_check")
        if self.controller.observes_gradients:   # the same on every rank
            bad_ranks = self._agree_flags(local_bad, clock)
            if bad_ranks:
                return self.skip(step, bad_ranks, clock, t_compute)
            local_bad = None                     # agreed
        if self.controller.wants_gradients:      # may differ per rank: no collective here
            self.controller.observe_gradients(
                {l.name: l.param.grad for l in self.layers if l.compressible})
            clock.lap("t_control")
        self.memory.begin_step()
        if self.lowrank is not None:
            # PowerSGD's path expects agreed flags (it has rounds of its own: P, gains, Q).
            if local_bad is not None:
                bad_ranks = self._agree_flags(local_bad, clock)
                if bad_ranks:
                    return self.skip(step, bad_ranks, clock, t_compute)
            return self.lowrank.synchronize(plan, step, clock, t_compute)
        if self.route is not None:
            return self.route.synchronize(plan, step, clock, t_compute, local_bad)

        selections, dense = self.feed_and_select_all(self.layers, plan, step, clock)

        # E7 (GraVAC decide="previous"): the plan has decided what the step sends, so the
        # gains only update the controller's averages: their allreduce goes after the
        # exchange has started, in its round, instead of holding it back by a round.
        gains_later = plan.decided is not None and plan.needs_gains
        if gains_later:
            sent, rows, candidate_planned = self._planned_level(plan, selections, clock)
            gain_min = gain_c = None
        else:
            d = self.decide(plan, selections, clock, local_bad)
            if d.bad_ranks:
                return self.skip(step, d.bad_ranks, clock, t_compute)
            sent, gain_min, gain_c, local_bad = d.sent, d.gain_min, d.gain_c, d.local_bad

        # Compression computed and then not used (a dense decision): Algorithm 1 times a
        # dense step without it (line 23), so the controller is told t_iter minus this.
        # (E7's gains round is not for nothing: it carries the flags and the averages.)
        t_discarded = 0.0
        if sent == SENT_DENSE and selections:
            t_discarded = sum(clock.times[p] for p in ("t_select", "t_norms", "t_wait_gains"))
        had_layers = bool(selections)
        payload = apply_decision(self.memory, selections, sent)
        if sent == SENT_DENSE:
            dense.extend(s.layer for s in selections)
            selections = []
        clock.lap("t_residual")
        packed = self.exchange.pack(payload)
        clock.lap("t_pack", sync=True)
        if gains_later:
            pending = self.exchange.start(packed, dense, same_size=self.compressor.exact_count)
            # The plan's level again (checked_decision), and the gains reach the averages.
            d = self.decide(plan, [], clock, local_bad, has_layers=had_layers,
                            candidate_planned=candidate_planned, rows=rows)
            gain_min, gain_c, bad_ranks = d.gain_min, d.gain_c, d.bad_ranks
            pending.wait()
        else:
            pending = self.exchange.start(
                packed, dense, same_size=self.compressor.exact_count,
                flags=None if local_bad is None else self.flags(local_bad))
            flags = None if pending.carries_flags else self.start_flags(local_bad)
            pending.wait()
            bad_ranks = (pending.flagged_ranks() if pending.carries_flags
                         else self.finish_flags(flags))
        clock.lap("t_wait_exchange", sync=True)
        if bad_ranks:
            # What arrived is discarded: gradients are not written, residuals go back.
            self.memory.rollback_step()
            return self.skip(step, bad_ranks, clock, t_compute)
        pending.unpack()
        clock.lap("t_unpack", sync=True)

        sparse = [(layer, int(v.numel())) for layer, v, _ in payload]
        return self.sent_stats(step, plan, sent, sparse, dense, pending.bytes_sent, gain_min,
                               gain_c, clock, t_compute, t_discarded)

    def sent_stats(self, step: int, plan, sent: str, sparse: list[tuple[Layer, int]],
                   dense: list[Layer], bytes_sent: int, gain_min, gain_c, clock: PhaseClock,
                   t_compute: float | None, t_discarded: float) -> StepStats:
        """The record of a step that was sent: ``sparse`` lists (layer, values sent)."""
        kept = sum(n for _, n in sparse)
        sparse_numel = sum(layer.numel for layer, _ in sparse)
        dense_numel = sum(l.numel for l in dense)
        if not sparse:
            sent, cf_sent = SENT_DENSE, 1.0    # nothing went sparse this step
        elif sent == SENT_CANDIDATE:
            cf_sent = float(plan.theta_c)
        elif plan.layer_cf is None:
            cf_sent = float(plan.theta_min)
        else:
            cf_sent = _effective_cf(sparse_numel, kept)
        self._consecutive_skips = 0
        return StepStats(
            step=step, sent=sent, cf=cf_sent,
            # What really travelled: DGC and RedSync keep about, not exactly, n/θ values.
            cf_actual=_effective_cf(sparse_numel, kept) if sparse else 1.0,
            theta_min=float(plan.theta_min),
            theta_c=None if plan.theta_c is None else float(plan.theta_c),
            gain_min=gain_min, gain_c=gain_c,
            sparse_layers=len(sparse), dense_layers=len(dense), values_sent=kept,
            # Values and indices each count as one float (as the paper counts), plus dense.
            floats_sent=2 * kept + dense_numel,
            dense_floats=sum(l.numel for l in self.layers), bytes_sent=bytes_sent,
            t_compute=t_compute, t_compress=clock.local(), t_comm=clock.waits(),
            t_discarded=t_discarded, **clock.times,
            layer_cf=None if plan.layer_cf is None else dict(plan.layer_cf))

    def end_step(self, stats: StepStats, samples: float | None) -> None:
        """Tell the controller how the step went (every rank, same order); fills the
        smoothed gains into ``stats``."""
        gain = {SENT_CANDIDATE: stats.gain_c, SENT_MIN: stats.gain_min}.get(stats.sent, 1.0)
        t_iter = stats.t_iter
        if t_iter is not None and stats.t_discarded:
            t_iter = max(t_iter - stats.t_discarded, 0.0)
        self.controller.end_step(
            StepRecord(step=stats.step, sent=stats.sent, cf=stats.cf,
                       gain=1.0 if gain is None else gain, t_iter=t_iter,
                       samples=samples), self.comm)
        summary = self.controller.summary()
        stats.delta_min, stats.delta_c = summary.get("delta_min"), summary.get("delta_c")

    # -- pieces ---------------------------------------------------------------------------
    def _densify_grads(self) -> None:
        for layer in self.layers:
            self.densify_grad(layer)

    @staticmethod
    def densify_grad(layer: Layer) -> None:
        grad = layer.param.grad
        if grad is None:
            # Every rank must send every layer (another rank may have a gradient for it).
            layer.param.grad = torch.zeros_like(layer.param)
        elif grad.is_sparse:
            # Sparse embedding gradients: compressed or averaged like any other layer
            # (the optimizer then sees a dense gradient, as with sparse_as_dense).
            layer.param.grad = grad.to_dense()


    def feed_and_select_all(self, layers: list[Layer], plan, step: int,
                            clock: PhaseClock) -> tuple[list[Selection], list[Layer]]:
        """Error feedback of every compressible layer, then both levels' selection of
        all of them together (``select_all``: a compressor may batch the layers):
        (the selections, the layers that go dense: not compressible, or planned dense,
        whose gradient then absorbed its residual)."""
        dense, compressed = [], []
        for layer in layers:
            if not layer.compressible:
                dense.append(layer)
                continue
            cf = plan.cf_of(layer.name)
            if cf <= 1:
                self.memory.flush_into(layer.name, layer.param.grad)
                dense.append(layer)
            else:
                compressed.append((layer, cf))
        g_efs = self.memory.compensate_all([layer.name for layer, _ in compressed],
                                           [layer.param.grad for layer, _ in compressed])
        fed = [(layer, g_ef, cf) for (layer, cf), g_ef in zip(compressed, g_efs)]
        clock.lap("t_feedback")
        selections = self.select_all(fed, plan.theta_c, step)
        clock.lap("t_select")
        return selections, dense

    def feed_and_select(self, layer: Layer, plan, step: int,
                        clock: PhaseClock) -> Selection | None:
        """Error feedback and both levels' selection of one compressible layer at the
        plan's CF; None when the plan sends it dense (its gradient then absorbed the
        residual: free when that is zero, e.g. GraVAC settled on dense on a fast link)."""
        selections, _ = self.feed_and_select_all([layer], plan, step, clock)
        return selections[0] if selections else None

    def select(self, layer: Layer, g_ef: torch.Tensor, cf: float, theta_c: float | None,
               step: int) -> Selection:
        """Both levels of one layer (``select_all``)."""
        return self.select_all([(layer, g_ef, cf)], theta_c, step)[0]

    def select_all(self, fed: list[tuple[Layer, torch.Tensor, float]], theta_c: float | None,
                   step: int) -> list[Selection]:
        """Both levels of each (layer, g_ef, cf): the first keeps num_kept(n, cf) of g_ef,
        the second (multi-level, where θc > cf) num_kept(n, θc) of those kept values.
        Each level is one ``select_many`` over every layer."""
        rank = self.comm.rank
        idx_min = self.compressor.select_many(
            [g_ef for _, g_ef, _ in fed], [num_kept(layer.numel, cf) for layer, _, cf in fed],
            [SelectContext(step, layer.index, rank, 0) for layer, _, _ in fed])
        # index_select, not advanced indexing: ~3-10x slower on CPU
        selections = [Selection(layer, g_ef, idx, g_ef.index_select(0, idx))
                      for (layer, g_ef, _), idx in zip(fed, idx_min)]
        second = [i for i, (_, _, cf) in enumerate(fed) if theta_c is not None and theta_c > cf]
        if second:
            # Multi-level: the second pass sees the k_min kept values, not the n entries;
            # its k is the one a direct compression at θc would use.
            subs = self.compressor.select_many(
                [selections[i].val_min for i in second],
                [num_kept(fed[i][0].numel, theta_c) for i in second],
                [SelectContext(step, fed[i][0].index, rank, 1) for i in second])
            for i, sub in zip(second, subs):
                sel = selections[i]
                sel.idx_c, sel.val_c = sel.idx_min.index_select(0, sub), sel.val_min.index_select(0, sub)
        return selections

    def _planned_level(self, plan, selections: list[Selection], clock: PhaseClock):
        """E7: (the level the plan decided, the gain rows to agree after the exchange has
        started, whether every layer has a candidate). The rows are measured now, before
        the residual update reuses g_ef's buffer."""
        candidate_planned = all(s.val_c is not None for s in selections)
        sent = plan.decided if selections else SENT_MIN
        if sent == SENT_CANDIDATE and not candidate_planned:
            raise RuntimeError("controller decided the candidate but its plan has no "
                               "candidate CF above theta_min")
        rows = gain_rows(selections, plan.gain_measure)
        clock.lap("t_norms")
        return sent, rows, candidate_planned

    def decide(self, plan, selections: list[Selection], clock: PhaseClock,
               local_bad: bool | torch.Tensor | None, has_layers: bool | None = None,
               candidate_planned: bool | None = None,
               rows: list[torch.Tensor] | None = None) -> "Decision":
        """The step's decision, the same on every rank. With ``plan.needs_gains`` the gains
        of ``selections`` (this rank's, maybe none; or their ``gain_row`` rows, measured
        earlier) are agreed by one allreduce that also carries ``local_bad`` when not None;
        ranks with a NaN/Inf mean the step must be skipped (the residuals are rolled back
        here, ``sent`` is None). ``has_layers`` and ``candidate_planned`` (from
        ``selections`` by default) must be the same on every rank. ``Decision.local_bad``:
        the flag still to agree (None once the gains did)."""
        if has_layers is None:
            has_layers = bool(selections)
        if candidate_planned is None:
            candidate_planned = all(s.val_c is not None for s in selections)
        gain_min = gain_c = None
        if plan.needs_gains:
            if rows is None:
                rows = gain_rows(selections, plan.gain_measure)
            gain_min, gain_c, bad_ranks = self.agree_gain_rows(rows, clock, local_bad)
            if bad_ranks:
                self.memory.rollback_step()
                return Decision(None, gain_min, gain_c, bad_ranks, None)
            local_bad = None                     # agreed with the gains
            if not candidate_planned:
                gain_c = None
        sent = checked_decision(self.controller, gain_min, gain_c, has_layers,
                                candidate_planned, plan.decided)
        clock.lap("t_control")
        return Decision(sent, gain_min, gain_c, [], local_bad)

    def agree_gain_rows(self, rows: list[torch.Tensor], clock: PhaseClock | None = None,
                         local_bad: bool | torch.Tensor | None = None):
        """Whole-model compression gains of both levels from per-layer rows (``gain_row``),
        summed over ranks with one tiny allreduce: (gain_min, gain_c, ranks with a NaN/Inf
        gradient). ``"energy"`` rows give Σ‖g_min‖²/Σ‖g_ef‖² and Σ‖g_c‖²/Σ‖g_ef‖²
        (Algorithm 1); ``"norm"`` rows Σ‖g_min‖/Σ‖g‖ and Σ‖g_c‖/Σ‖g‖ with the raw gradient g,
        as in the authors' code (it may exceed 1). ``local_bad`` (this rank's NaN/Inf flag,
        None when already agreed) rides in the same allreduce.

        The rows are summed on the gradients' device, the flags appended there, and the
        lot moved to the host at once: one device sync per step for the gains and the
        flags, not one per layer. The allreduce itself runs on that CPU tensor (what every
        transport takes; torch.distributed with nccl moves it to the GPU and back)."""
        if rows:
            device = rows[0].device
            sums = torch.stack([r.to(device) for r in rows]).double().sum(0)
        else:
            device = local_bad.device if isinstance(local_bad, torch.Tensor) \
                else torch.device("cpu")
            sums = torch.zeros(3, dtype=torch.float64, device=device)
        if local_bad is not None:
            sums = torch.cat([sums, self.flags(local_bad, device=device)])
        sums = sums.cpu()
        if clock is not None:
            clock.lap("t_norms", sync=True)
        sums = self.comm.allreduce(sums, op="sum", name=f"{self.prefix}.gains")
        if clock is not None:
            clock.lap("t_wait_gains", sync=True)
        bad_ranks = flagged_ranks(sums[3:]) if local_bad is not None else []
        total = float(sums[2])
        if bad_ranks or total <= 0.0:
            return 1.0, 1.0, bad_ranks
        return float(sums[0]) / total, float(sums[1]) / total, bad_ranks

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

    def start_flags(self, local_bad: bool | torch.Tensor | None):
        """The NaN/Inf flags' allreduce when the gains did not carry them (``local_bad``
        not None), started beside the exchange: one more tiny allreduce in its round."""
        if local_bad is None:
            return None
        return self.comm.allreduce_async(self.flags(local_bad), op="sum",
                                         name=f"{self.prefix}.finite")

    @staticmethod
    def finish_flags(handle) -> list[int]:
        """The ranks flagged by ``start_flags``' allreduce ([] when it was not needed)."""
        return flagged_ranks(handle.wait()) if handle is not None else []

    def _agree_flags(self, local_bad: bool | torch.Tensor, clock: PhaseClock) -> list[int]:
        """Ranks whose gradient has a NaN or Inf this step, agreed by one tiny allreduce
        of their own (before anything else of the step)."""
        clock.lap("t_check", sync=True)
        flags = self.comm.allreduce(self.flags(local_bad), op="sum", name=f"{self.prefix}.finite")
        clock.lap("t_wait_check", sync=True)
        return flagged_ranks(flags)

    def skip(self, step: int, bad_ranks: list[int], clock: PhaseClock, t_compute) -> StepStats:
        self._consecutive_skips += 1
        self.skipped_steps.append({"step": step, "ranks": bad_ranks})
        if self.nonfinite == "raise" or self._consecutive_skips > self.max_consecutive_skips:
            why = ("nonfinite='raise'" if self.nonfinite == "raise" else
                   f"{self._consecutive_skips} consecutive steps skipped (max_consecutive_skips="
                   f"{self.max_consecutive_skips})")
            raise FloatingPointError(
                f"non-finite gradient (NaN or Inf) at step {step} on rank(s) "
                f"{', '.join(map(str, bad_ranks))}; stopping: {why}. Lower the learning rate, "
                "clip gradients (optimizer.grad_clip) or check the data of those ranks.")
        return StepStats(step=step, sent=SENT_SKIPPED, cf=1.0, nonfinite_ranks=bad_ranks,
                         dense_floats=sum(l.numel for l in self.layers),
                         t_compute=t_compute, t_compress=clock.local(), t_comm=clock.waits(),
                         t_update=0.0, **clock.times)

    # -- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"memory": self.memory.state_dict(), "controller": self.controller.state_dict(),
                "compressor": self.compressor.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        # Residuals follow their parameter's device and dtype: a checkpoint written on a
        # CPU (or read with map_location="cpu") resumes on a GPU, and vice versa. So do the
        # per-layer tensors of the controller and the compressor (Accordion's
        # accumulators, PowerSGD's Q): each moves to its parameter's device now.
        like = {l.name: l.param for l in self.layers}
        self.memory.load_state_dict(state["memory"], like=like)
        self.controller.load_state_dict(follow_devices(state["controller"], like))
        self.compressor.load_state_dict(follow_devices(state.get("compressor", {}), like))


def _effective_cf(numel: int, kept: int) -> float:
    return float(numel) / kept if kept else 1.0
