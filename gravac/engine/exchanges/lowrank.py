"""The low-rank exchange (PowerSGD): factors travel by allreduce, all layers together.

Chosen by a low-rank compressor, not by ``exchange=`` (docs/ALGORITHM.md §11). With M =
g_ef of a layer as a rows x cols matrix: ``plan_layer`` maps the plan to ranks (a CF to
the largest rank whose CF is at least it; layers whose rank-r form is not smaller go
dense); ``select`` forms P = M Q (Q the warm start), averages every P in ONE grouped
allreduce, orthogonalises it and takes this rank's Q_i = Mᵀ P; the gains need no M̂
(‖P Q_iᵀ‖ = ‖Q_i‖, the candidate being the first r_c columns); ``start`` averages the Q
columns of the level decided in ONE grouped allreduce; ``unpack`` writes M̂ = P Qᵀ, sets
the residual to g_ef − M̂ and keeps the averaged Q as the next warm start.

Example::

    opt = wrap_optimizer(sgd, model.named_parameters(), comm, compressor="powersgd",
                         controller=Static(rank=4))
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...compressors.powersgd import orthogonalize_all_
from ...controllers import SENT_CANDIDATE
from ...util.sizes import matrix_shape, rank_for_cf
from ..layers import Layer
from ..phases import PhaseClock
from .base import Exchange, Pending, SentLayer, grouped_average


@dataclass
class Factors:
    """One layer sent low-rank this step (a selection of this exchange)."""

    layer: Layer
    g_ef: torch.Tensor          # flat, aliases the residual buffer
    rows: int
    cols: int
    p: torch.Tensor             # rows x r_min: M Q, then averaged and orthonormal
    r_min: int
    r_c: int | None             # the candidate's rank (<= r_min), or None
    q_local: torch.Tensor | None = None    # cols x r_min: this rank's Mᵀ P
    q_sent: torch.Tensor | None = None     # cols x r sent (averaged after the exchange)

    @property
    def select_floats(self) -> int:
        """P travelled to select it, whatever is then decided."""
        return self.rows * self.r_min


class LowRankExchange(Exchange):
    """PowerSGD's rounds as an exchange (see the module doc)."""

    kind = "lowrank"
    selectable = False

    def plan_layer(self, layer: Layer, plan):
        """(r_min, r_c) of ``layer`` under ``plan``; None when it goes dense."""
        rows, cols = matrix_shape(layer.param.shape)
        if plan.layer_rank is not None and layer.name in plan.layer_rank:
            # More columns than min(rows, cols) add nothing (they orthogonalise to zero).
            r_min, r_c = min(int(plan.layer_rank[layer.name]), rows, cols), None
        else:
            cf = plan.cf_of(layer.name)
            if cf <= 1:
                return None
            r_min = rank_for_cf(rows, cols, cf)
            r_c = None
            if plan.theta_c is not None and plan.theta_c > cf:
                r_c = min(rank_for_cf(rows, cols, plan.theta_c), r_min)
        if not self.compressor.sends_low_rank(layer.param.shape, r_min):
            return None             # its factors would not be smaller than dense
        return r_min, r_c

    def select(self, fed, step: int, clock: PhaseClock):
        comp = self.compressor
        work = []
        for layer, g_ef, r_min, r_c in fed:
            # g_ef is fp32 for fp16/bf16 gradients (the memory's dtype): the factors too.
            rows, cols = matrix_shape(layer.param.shape)
            p = g_ef.view(rows, cols) @ comp.warm_start(layer.name, cols, r_min, like=g_ef)
            work.append(Factors(layer, g_ef, rows, cols, p, r_min, r_c))
        clock.lap("t_select")
        handles, nbytes = grouped_average(self.comm, f"{self.prefix}.lowrank.p",
                                          [w.p for w in work])
        for handle in handles:
            handle.wait()
        clock.lap("t_wait_select", sync=True)
        orthogonalize_all_([w.p for w in work])     # batched on a GPU: few launches
        for w in work:
            w.q_local = w.g_ef.view(w.rows, w.cols).t() @ w.p
        clock.lap("t_select")
        return work, nbytes

    def gain_rows(self, work: list[Factors], measure: str) -> list[torch.Tensor]:
        """[‖Q_i‖², ‖Q_i[:, :r_c]‖², ‖M_i‖²] per layer (square roots, with the raw gradient
        for the whole, for ``"norm"``)."""
        if measure not in ("energy", "norm"):
            raise ValueError(f"gain measure must be 'energy' or 'norm', got {measure!r}")
        rows = []
        for w in work:
            q_c = w.q_local if w.r_c is None else w.q_local[:, :w.r_c]
            if measure == "energy":
                rows.append(torch.stack([_sq(w.q_local), _sq(q_c), _sq(w.g_ef)]).double())
            else:
                rows.append(torch.stack([_sq(w.q_local), _sq(q_c),
                                         _sq(w.layer.param.grad)]).double().sqrt())
        return rows

    def settle(self, memory, factors: list[Factors], level: str) -> list[SentLayer]:
        # The residual needs M̂, known after the exchange: updated in unpack.
        sent = []
        for w in factors:
            r = w.r_c if level == SENT_CANDIDATE else w.r_min
            w.q_sent = w.q_local if r == w.q_local.shape[1] else w.q_local[:, :r].contiguous()
            sent.append(SentLayer(w.layer, w.q_sent, None, w.select_floats + w.cols * r, 0,
                                  state=(w, memory)))
        return sent

    def start(self, sent: list[SentLayer], dense: list[Layer], tag: str = "",
              flags: torch.Tensor | None = None, same_size: bool = False) -> Pending:
        comp = self.compressor

        def rebuild():
            for s in sent:
                w, memory = s.state
                r = w.q_sent.shape[1]
                m_hat = w.p[:, :r] @ w.q_sent.t()
                w.layer.param.grad.view(w.rows, w.cols).copy_(m_hat)
                memory.update(w.layer.name, w.g_ef, m_hat)
                comp.adopt(w.layer.name, w.q_sent)
        return self.average_values("lowrank.q", sent, dense, tag, flags, rebuild)


def _sq(t: torch.Tensor) -> torch.Tensor:
    t = t.reshape(-1)
    if t.dtype not in (torch.float32, torch.float64):
        t = t.float()
    return torch.dot(t, t)
