"""The low-rank step (PowerSGD): factors travel by allreduce, all layers together.

``StepEngine.synchronize`` hands a step to ``LowRankStep`` when its compressor is low-rank
(``compressor.is_lowrank``), after the plan and the NaN/Inf agreement (so a skipped step
never touches a residual). Per step, with M = g_ef of a layer as a rows x cols matrix
(docs/ALGORITHM.md §11):

1. error feedback: g_ef = grad + residual; the rank r_min of each layer from the plan
   (a CF maps to the largest rank whose CF is at least it; Static/Accordion may plan ranks);
   layers planned dense, and layers whose rank-r form is not smaller than dense, go dense;
2. P = M Q (Q: the layer's warm start), ONE grouped allreduce (average) of every P;
3. orthogonalise P; this rank's Q_i = Mᵀ P;
4. with a candidate (GraVAC), gains before any Q travels: P is orthonormal, so
   ‖P Q_iᵀ‖² = ‖Q_i‖², and the rank-r_c result is the first r_c columns of P and Q_i
   (Gram-Schmidt keeps prefixes): gain_min = Σ‖Q_i‖² / Σ‖M_i‖², gain_c = Σ‖Q_i[:, :r_c]‖² /
   Σ‖M_i‖², summed over layers and ranks by the engine's one small gains allreduce;
5. the controller decides from those agreed gains (candidate, θmin or dense), the same on
   every rank; ONE grouped allreduce (average) of the Q columns sent (none on a dense
   decision: the layers then travel with the dense ones), and the dense layers' grouped
   allreduce as in the sparse exchange;
6. M̂ = P Qᵀ into ``.grad``; residual = g_ef − M̂; the averaged Q becomes the warm start of
   its columns (columns not sent keep their previous values, which every rank shares).

Collectives: P, [gains], Q, dense: each issued only on values every rank shares (the plan,
the layer shapes, agreed gains), so every rank issues the same ones in the same order.

Example::

    engine = StepEngine(layers, gravac.compressors.get("powersgd"), Static(rank=4), comm)
    stats = engine.synchronize(step=0, lr_decayed=False, t_compute=None)   # uses LowRankStep
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..compressors.powersgd import compression_factor, matrix_shape, orthogonalize_, rank_for_cf
from ..controllers import SENT_CANDIDATE, SENT_DENSE, StepPlan
from .decision import checked_decision
from .layers import Layer
from .phases import PhaseClock
from .record import StepStats


@dataclass
class _Factors:
    """One layer sent low-rank this step."""

    layer: Layer
    rows: int
    cols: int
    g_ef: torch.Tensor          # flat, aliases the residual buffer
    p: torch.Tensor             # rows x r_min: M Q, then averaged and orthonormal
    r_min: int
    r_c: int | None             # the candidate's rank (<= r_min), or None
    q_local: torch.Tensor | None = None    # cols x r_min: this rank's Mᵀ P
    q_sent: torch.Tensor | None = None     # cols x r sent (averaged after the exchange)


class LowRankStep:
    """The low-rank half of ``StepEngine``: uses the engine's layers, memory, compressor,
    controller, comm and dense exchange; returns the step's ``StepStats``."""

    def __init__(self, engine):
        self.engine = engine

    # -- ranks ----------------------------------------------------------------------------
    @staticmethod
    def ranks(plan: StepPlan, layer: Layer, rows: int, cols: int):
        """(r_min, r_c) of ``layer`` under ``plan``; (None, None) when planned dense."""
        if plan.layer_rank is not None and layer.name in plan.layer_rank:
            # More columns than min(rows, cols) add nothing (they orthogonalise to zero).
            return min(int(plan.layer_rank[layer.name]), rows, cols), None
        cf = plan.cf_of(layer.name)
        if cf <= 1:
            return None, None
        r_min = rank_for_cf(rows, cols, cf)
        r_c = None
        if plan.theta_c is not None and plan.theta_c > cf:
            r_c = min(rank_for_cf(rows, cols, plan.theta_c), r_min)
        return r_min, r_c

    # -- the step -------------------------------------------------------------------------
    def synchronize(self, plan: StepPlan, step: int, clock: PhaseClock,
                    t_compute: float | None) -> StepStats:
        e = self.engine
        comp, memory = e.compressor, e.memory
        dense = [l for l in e.layers if not l.compressible]
        work: list[_Factors] = []
        for layer in e.layers:
            if not layer.compressible:
                continue
            rows, cols = matrix_shape(layer.param.shape)
            r_min, r_c = self.ranks(plan, layer, rows, cols)
            if r_min is None or not comp.sends_low_rank(layer.param.shape, r_min):
                # Planned dense, or its factors would not be smaller: dense, with its residual.
                memory.flush_into(layer.name, layer.param.grad)
                dense.append(layer)
                clock.lap("t_feedback")
                continue
            # g_ef is fp32 for fp16/bf16 gradients (the memory's dtype): the factors too.
            g_ef = memory.compensate(layer.name, layer.param.grad)
            clock.lap("t_feedback")
            m = g_ef.view(rows, cols)
            p = m @ comp.warm_start(layer.name, cols, r_min, like=g_ef)
            work.append(_Factors(layer, rows, cols, g_ef, p, r_min, r_c))
            clock.lap("t_select")

        p_bytes, handles = self._allreduce([w.p for w in work], "p")
        wait0 = clock.times["t_wait_exchange"]
        for handle in handles:
            handle.wait()
        clock.lap("t_wait_exchange", sync=True)
        t_wait_p = clock.times["t_wait_exchange"] - wait0
        for w in work:
            orthogonalize_(w.p)
            w.q_local = w.g_ef.view(w.rows, w.cols).t() @ w.p
        clock.lap("t_select")

        gain_min = gain_c = None
        if plan.needs_gains:
            gain_min, gain_c = self._agree_gains(work, plan.gain_measure, clock)
            if not any(w.r_c is not None for w in work):
                gain_c = None
        sent = checked_decision(e.controller, gain_min, gain_c, bool(work),
                                all(w.r_c is not None for w in work))
        clock.lap("t_control")

        t_discarded = 0.0
        p_floats = sum(w.rows * w.r_min for w in work)     # P travelled whatever was decided
        if sent == SENT_DENSE and work:
            # Algorithm 1 times a dense step without the compression it threw away.
            t_discarded = sum(clock.times[k] for k in ("t_select", "t_norms", "t_wait_gains"))
            t_discarded += t_wait_p
            for w in work:
                w.layer.param.grad.view(-1).copy_(w.g_ef)
                memory.update(w.layer.name, w.g_ef, None)
                dense.append(w.layer)
            work = []
            clock.lap("t_residual")
        for w in work:
            r = w.r_c if sent == SENT_CANDIDATE else w.r_min
            w.q_sent = w.q_local if r == w.q_local.shape[1] else w.q_local[:, :r].contiguous()
        clock.lap("t_pack")
        q_bytes, handles = self._allreduce([w.q_sent for w in work], "q")
        pending = e.exchange.start(None, dense)
        for handle in handles:
            handle.wait()
        pending.wait()
        clock.lap("t_wait_exchange", sync=True)
        for w in work:
            r = w.q_sent.shape[1]
            m_hat = w.p[:, :r] @ w.q_sent.t()
            w.layer.param.grad.view(w.rows, w.cols).copy_(m_hat)
            clock.lap("t_unpack")
            memory.update(w.layer.name, w.g_ef, m_hat)
            comp.adopt(w.layer.name, w.q_sent)
            clock.lap("t_residual")
        pending.unpack()
        clock.lap("t_unpack", sync=True)

        lowrank_numel = sum(w.layer.numel for w in work)
        sent_floats = sum(w.rows * w.r_min + w.cols * w.q_sent.shape[1] for w in work)
        factor_floats = p_floats + sum(w.cols * w.q_sent.shape[1] for w in work)
        effective = lowrank_numel / sent_floats if work else 1.0
        by_rank = plan.layer_rank is not None
        if not work:
            sent, cf_sent = SENT_DENSE, 1.0
        elif sent == SENT_CANDIDATE and plan.layer_cf is None:
            cf_sent = float(plan.theta_c)
        elif plan.layer_cf is None and not by_rank:
            cf_sent = float(plan.theta_min)
        else:
            cf_sent = effective
        if by_rank:
            layer_cf = {w.layer.name: compression_factor(w.rows, w.cols, w.q_sent.shape[1])
                        for w in work}
        else:
            layer_cf = None if plan.layer_cf is None else dict(plan.layer_cf)
        e._consecutive_skips = 0
        return StepStats(
            step=step, sent=sent, cf=cf_sent, cf_actual=effective,
            # Planned in ranks, θmin is what the ranks came to.
            theta_min=cf_sent if by_rank else float(plan.theta_min),
            theta_c=None if plan.theta_c is None else float(plan.theta_c),
            gain_min=gain_min, gain_c=gain_c,
            sparse_layers=len(work), dense_layers=len(dense), values_sent=factor_floats,
            # P of every low-rank layer (it travels before the decision), the Q columns
            # sent, and the dense layers: no indices.
            floats_sent=factor_floats + sum(l.numel for l in dense),
            dense_floats=sum(l.numel for l in e.layers),
            bytes_sent=p_bytes + q_bytes + pending.bytes_sent,
            t_compute=t_compute, t_compress=clock.local(), t_comm=clock.waits(),
            t_discarded=t_discarded, **clock.times, layer_cf=layer_cf)

    # -- pieces ---------------------------------------------------------------------------
    def _allreduce(self, tensors: Sequence[torch.Tensor], what: str):
        """Start ONE grouped allreduce (average, in place) per dtype of ``tensors`` (fp32;
        fp64 layers apart), in layer order: (bytes sent, handles)."""
        e = self.engine
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for t in tensors:
            by_dtype.setdefault(t.dtype, []).append(t)
        handles, nbytes = [], 0
        for dtype in sorted(by_dtype, key=str):
            group = by_dtype[dtype]
            name = f"{e.prefix}.lowrank.{what}" + ("" if len(by_dtype) == 1 else f".{dtype}")
            handles.append(e.comm.grouped_allreduce_async_(group, op="average", name=name))
            nbytes += sum(t.numel() * t.element_size() for t in group)
        return nbytes, handles

    def _agree_gains(self, work: list[_Factors], measure: str, clock: PhaseClock):
        """Whole-model gains of both ranks, summed over layers and ranks with the engine's
        one small allreduce (name ``<prefix>.gains``). With P orthonormal, this rank's
        rank-r approximation P Q_iᵀ has ‖P Q_iᵀ‖ = ‖Q_i‖, so no M̂ is formed."""
        if measure not in ("energy", "norm"):
            raise ValueError(f"gain measure must be 'energy' or 'norm', got {measure!r}")
        if work:
            rows = []
            for w in work:
                q_c = w.q_local if w.r_c is None else w.q_local[:, :w.r_c]
                if measure == "energy":
                    rows.append(torch.stack([_sq(w.q_local), _sq(q_c), _sq(w.g_ef)]).double())
                else:
                    rows.append(torch.stack([_sq(w.q_local), _sq(q_c),
                                             _sq(w.layer.param.grad)]).double().sqrt())
            # Summed on the factors' device, moved to the host once: one sync per step.
            device = rows[0].device
            sums = torch.stack([r.to(device) for r in rows]).sum(0).cpu()
        else:
            sums = torch.zeros(3, dtype=torch.float64)      # (the host's, as the sums)
        clock.lap("t_norms", sync=True)
        sums = self.engine.comm.allreduce(sums, op="sum", name=f"{self.engine.prefix}.gains")
        clock.lap("t_wait_gains", sync=True)
        total = float(sums[2])
        if total <= 0.0:
            return 1.0, 1.0
        return float(sums[0]) / total, float(sums[1]) / total


def _sq(t: torch.Tensor) -> torch.Tensor:
    t = t.reshape(-1)
    if t.dtype not in (torch.float32, torch.float64):
        t = t.float()
    return torch.dot(t, t)
