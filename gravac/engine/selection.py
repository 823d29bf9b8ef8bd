"""One layer's selection at both levels, the gains measured on it, and the NaN/Inf
flags: the pieces the step pipeline (``step.py``) and the exchanges share.

Example::

    [sel] = select_levels(TopK(), [(layer, g_ef, 10.0, 40.0)], step=0, rank=0)
    row = gain_row(sel, "energy")                # [‖g_min‖², ‖g_c‖², ‖g_ef‖²]
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..compressors import SelectContext
from ..compressors import base as compressor_base
from ..util.segments import gather_segments
from ..util.sizes import num_kept
from .layers import Layer

#: On a GPU, from this many layers the values each level kept are gathered by one launch
#: over all layers (``gather_segments``) instead of one ``index_select`` per layer (and,
#: at the second level, two): a GPU step is bound by its host's launches. On an H100
#: (docs/results/gpu_h100_2026-11-27) ResNet-101's 161 layers compressed in 15.2 ms
#: against 19.9 one gather per layer with Top-k 10x, 23.0 against 32.4 with GraVAC; the
#: LSTM's 10 layers stay below (no difference measured there).
GATHER_MIN_LAYERS = 24


@dataclass
class Selection:
    """A compressed layer's error-fed gradient and what both levels kept of it."""

    layer: Layer
    g_ef: torch.Tensor
    idx_min: torch.Tensor
    val_min: torch.Tensor
    idx_c: torch.Tensor | None = None
    val_c: torch.Tensor | None = None
    #: Floats that travelled to select it (none: a sparsifier selects locally).
    select_floats = 0


def select_levels(compressor, fed, step: int, rank: int) -> list[Selection]:
    """Both levels of each ``(layer, g_ef, cf, cf_c)``: the first keeps num_kept(n, cf) of
    g_ef, the second (multi-level, where ``cf_c`` is not None) num_kept(n, cf_c) of those
    kept values. Each level is one ``select_many`` over every layer (a compressor may
    batch them)."""
    idx_min = compressor.select_many(
        [g_ef for _, g_ef, _, _ in fed], [num_kept(layer.numel, cf) for layer, _, cf, _ in fed],
        [SelectContext(step, layer.index, rank, 0) for layer, _, _, _ in fed])
    val_min = _gather([g_ef for _, g_ef, _, _ in fed], idx_min)
    selections = [Selection(layer, g_ef, idx, val)
                  for (layer, g_ef, _, _), idx, val in zip(fed, idx_min, val_min)]
    second = [i for i, (_, _, _, cf_c) in enumerate(fed) if cf_c is not None]
    if second:
        # Multi-level: the second pass sees the k_min kept values, not the n entries;
        # its k is the one a direct compression at the candidate CF would use.
        subs = compressor.select_many(
            [selections[i].val_min for i in second],
            [num_kept(fed[i][0].numel, fed[i][3]) for i in second],
            [SelectContext(step, fed[i][0].index, rank, 1) for i in second])
        idx_c = _gather([selections[i].idx_min for i in second], subs)
        val_c = _gather([selections[i].val_min for i in second], subs)
        for i, idx, val in zip(second, idx_c, val_c):
            selections[i].idx_c, selections[i].val_c = idx, val
    return selections


def _gather(sources: list[torch.Tensor], indices: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each source's entries at its indices: one launch for all (``gather_segments``) on a
    GPU from ``GATHER_MIN_LAYERS`` sources of one device and dtype, else one
    ``index_select`` each (not advanced indexing: ~3-10x slower on CPU). The same values
    either way."""
    if len(sources) >= GATHER_MIN_LAYERS and compressor_base.device_path(sources[0]) \
            and len({(s.device, s.dtype) for s in sources}) == 1 \
            and len({i.device for i in indices}) == 1:
        return gather_segments(sources, indices)
    return [s.index_select(0, i) for s, i in zip(sources, indices)]


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


def nonfinite_flag(grads: list[torch.Tensor]) -> bool | torch.Tensor:
    """``has_nonfinite`` without a host sync for gradients on a GPU: there it returns a
    0-dim bool tensor on the first gradient's device (True: some entry is NaN or Inf),
    which ``StepEngine.flags`` turns into the flags without reading it, so the flag
    reaches the host together with the gains (or the exchange) instead of stopping the
    host once per step, or once per bucket in backward's hooks with overlap. Exact, like
    ``has_nonfinite``: entry by entry (``isfinite``), never a sum that could overflow.
    CPU gradients: ``has_nonfinite``'s bool, as always."""
    if not grads or all(g.device.type == "cpu" for g in grads):
        return has_nonfinite(grads)
    device = grads[0].device
    groups: dict[torch.device, list[torch.Tensor]] = {}
    for g in grads:
        groups.setdefault(g.device, []).append(g)
    flags = [_device_nonfinite(group).to(device) for group in groups.values()]
    return flags[0] if len(flags) == 1 else torch.stack(flags).any()


def _device_nonfinite(grads: list[torch.Tensor]) -> torch.Tensor:
    """A 0-dim bool tensor on the gradients' device: whether any entry is NaN or Inf.

    One multi-tensor kernel for the whole list: torch's own check behind GradScaler
    (``_amp_foreach_non_finite_check_and_unscale_``, here with a scale of exactly 1, which
    leaves every value as it is). Per tensor, ``isfinite().all()`` costs two launches, and
    ResNet-101's 314 gradients spent 11 ms of an H200 step launching them (docs/notes/2026-11-benchmarks.md
    §7). Where that operator is missing, the per-tensor check."""
    device = grads[0].device
    found = torch.zeros(1, dtype=torch.float32, device=device)
    try:
        torch._amp_foreach_non_finite_check_and_unscale_(
            grads, found, torch.ones(1, dtype=torch.float32, device=device))
    except (AttributeError, RuntimeError):   # no such operator, or not for these tensors
        return torch.stack([torch.isfinite(g).all() for g in grads]).all().logical_not()
    return found[0] > 0


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


def gain_rows(selections: list[Selection], measure: str) -> list[torch.Tensor]:
    """``gain_row`` of every selection: on the CPU one row each; on a GPU one [layers, 3]
    table of them (what ``StepEngine.agree_gain_rows`` sums either way), its norms from
    three multi-tensor kernels (``torch._foreach_norm``) instead of three dot products per
    layer (ResNet-101: 8.9 ms of launches a step on an H200), and no tensor per layer
    made to hold a row; squared for ``"energy"``, which rounds differently from
    ``gain_row``'s dot product in the last bits."""
    if not selections or selections[0].g_ef.device.type == "cpu" \
            or measure not in ("energy", "norm"):
        return [gain_row(s, measure) for s in selections]
    third = [s.g_ef if measure == "energy" else s.layer.param.grad for s in selections]
    columns = []
    for tensors in ([s.val_min for s in selections], [_val_c(s) for s in selections], third):
        tensors = [t if t.dim() == 1 else t.reshape(-1) for t in tensors]
        kinds = {(t.dtype, t.device) for t in tensors}
        if len(kinds) != 1:
            return [gain_row(s, measure) for s in selections]
        dtype = next(iter(kinds))[0]
        wide = None if dtype in (torch.float32, torch.float64) else torch.float32
        try:
            norms = torch._foreach_norm(tensors, 2, dtype=wide)
        except (AttributeError, RuntimeError, TypeError):
            return [gain_row(s, measure) for s in selections]
        columns.append(torch.stack(norms))
    table = torch.stack(columns, dim=1)
    return [table.square() if measure == "energy" else table]


def lag_terms(grads: list[torch.Tensor], g_efs: list[torch.Tensor]) -> torch.Tensor:
    """[Σ⟨r, g⟩, Σ‖g‖²] over layers, in float64, with r = g_ef - g the residual that error
    feedback added to this step's raw gradient g: summed over ranks, their ratio is the
    residual's lag (``StepPlan.measure_lag``). Measure it before selection, while g_ef is
    g + r (the residual update reuses g_ef's buffer)."""
    terms = []
    for g, g_ef in zip(grads, g_efs):
        g = g.reshape(-1)
        g_ef = g_ef.reshape(-1)
        if g_ef.dtype not in (torch.float32, torch.float64):
            g_ef = g_ef.float()
        if g.dtype != g_ef.dtype:
            g = g.to(g_ef.dtype)
        g_sq = torch.dot(g, g)
        terms.append(torch.stack([torch.dot(g_ef, g) - g_sq, g_sq]))
    return torch.stack(terms).double().sum(0)


def _sq_norm(t: torch.Tensor) -> torch.Tensor:
    t = t.reshape(-1)
    if t.dtype != torch.float32 and t.dtype != torch.float64:
        t = t.float()
    return torch.dot(t, t)


def _val_c(s: Selection) -> torch.Tensor:
    return s.val_c if s.val_c is not None else s.val_min
