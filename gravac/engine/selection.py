"""One layer's selection at both levels, the gains measured on it, what a decision sends,
and the NaN/Inf flags: the pieces every step path shares (the plain and overlapped steps in
``step.py`` and ``overlap.py``, the hierarchical and shared-index exchanges).

Example::

    sel = Selection(layer, g_ef, idx_min, g_ef.index_select(0, idx_min))
    row = gain_row(sel, "energy")                # [‖g_min‖², ‖g_c‖², ‖g_ef‖²]
    payload = apply_decision(memory, [sel], SENT_MIN)   # [(layer, values, indices)]
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..controllers import SENT_CANDIDATE, SENT_DENSE
from ..memory import ResidualMemory, SparseSent
from .layers import Layer


@dataclass
class Selection:
    """A compressed layer's error-fed gradient and what both levels kept of it."""

    layer: Layer
    g_ef: torch.Tensor
    idx_min: torch.Tensor
    val_min: torch.Tensor
    idx_c: torch.Tensor | None = None
    val_c: torch.Tensor | None = None


def apply_decision(memory: ResidualMemory, selections: list[Selection],
                   sent: str) -> list[tuple[Layer, torch.Tensor, torch.Tensor]]:
    """Residuals after the agreed decision ``sent``; returns (layer, values, indices) to
    send. Dense: each layer's g_ef goes into its ``.grad`` (sent whole, residual zero) and
    nothing is returned. Otherwise the chosen level's values, which are copies (advanced
    indexing), so g_ef's buffer may now become the residual."""
    if sent == SENT_DENSE:
        for s in selections:
            s.layer.param.grad.view(-1).copy_(s.g_ef)
            memory.update(s.layer.name, s.g_ef, None)
        return []
    payload = []
    for s in selections:
        idx, val = (s.idx_c, s.val_c) if sent == SENT_CANDIDATE else (s.idx_min, s.val_min)
        memory.update(s.layer.name, s.g_ef, SparseSent(idx, val))
        payload.append((s.layer, val, idx))
    return payload


def has_nonfinite(grads: list[torch.Tensor]) -> bool:
    """Whether any entry is NaN or Inf: one sum per tensor (a NaN or Inf entry makes it
    NaN or Inf), entry by entry only when a sum is not finite (finite entries may
    overflow the sum). A float64 sum was ~10x the cost of a float32 one on CPU."""
    if not grads:
        return False
    sums = torch.stack([g.sum(dtype=torch.float32 if g.dtype in (torch.float16, torch.bfloat16)
                              else g.dtype).double() for g in grads])
    if bool(torch.isfinite(sums).all()):
        return False
    return any(not bool(torch.isfinite(g).all()) for g in grads)


def flagged_ranks(flags: torch.Tensor) -> list[int]:
    """The ranks whose entry of a summed one-hot flag vector (``StepEngine.flags``) is set."""
    return [r for r, f in enumerate(flags.tolist()) if f > 0]


def gain_row(s: Selection, measure: str) -> torch.Tensor:
    """One layer's part of the compression gains: [‖g_min‖², ‖g_c‖², ‖g_ef‖²] for
    ``"energy"``, [‖g_min‖, ‖g_c‖, ‖g‖] (raw gradient) for ``"norm"``. Measure it before
    the residual update, which reuses g_ef's buffer."""
    if measure == "energy":
        return torch.stack([_sq_norm(s.val_min), _sq_norm(_val_c(s)), _sq_norm(s.g_ef)])
    if measure == "norm":
        return torch.stack([_sq_norm(s.val_min), _sq_norm(_val_c(s)),
                            _sq_norm(s.layer.param.grad)]).sqrt()
    raise ValueError(f"gain measure must be 'energy' or 'norm', got {measure!r}")


def _sq_norm(t: torch.Tensor) -> torch.Tensor:
    t = t.reshape(-1)
    if t.dtype != torch.float32 and t.dtype != torch.float64:
        t = t.float()
    return torch.dot(t, t)


def _val_c(s: Selection) -> torch.Tensor:
    return s.val_c if s.val_c is not None else s.val_min
