"""Exact Top-k of many tensors at once, each with its own k: a handful of launches for a
whole model instead of a handful per layer.

On a GPU a layer's ``torch.topk`` costs ~0.1 ms whatever its size (a dozen latency-bound
launches), so ResNet-101's 161 compressed layers spent 17 ms a step selecting, against
22-29 ms of forward and backward on an H200 (docs/notes/2026-11-benchmarks.md §7). Here every layer is
handled in the same kernels:

1. |x| of every layer in one flat buffer (one ``cat``);
2. a threshold per layer from a sample of S entries per layer (one batched draw, one
   row-wise sort of an L x S matrix), taken at the rank that leaves at least k_l entries
   at or above it except with probability ~3e-5 (``sample_rank``);
3. the candidates: entries at or above their layer's threshold (one comparison against
   the thresholds spread over the layers, one ``nonzero``: the first host sync);
4. per layer, the candidates counted (the second host sync): a layer with fewer than k_l
   (an unlucky sample) makes the caller fall back to one call per layer;
5. the candidates sorted once by (layer, decreasing magnitude) as one int64 key (the
   magnitude's float bits, which order non-negative floats as integers), and the first
   k_l of each layer's run taken.

Exact: each layer's candidates are every entry at or above a threshold, and there are at
least k_l of them, so its top k_l are among them; the sort then picks exactly those (ties
in magnitude broken arbitrarily, as ``torch.topk`` breaks them). NaN entries are never
candidates (a NaN gradient skips the step on every rank anyway).

Example::

    idx = segmented_topk([g1, g2, g3], [100, 10, 1000], seed=0, step=7)
    # idx[i]: k_i indices into g_i (None: a sample fell short, select layer by layer)
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ..util.segments import offsets_in, repeat_by_counts, views_of_one

#: Sample entries per layer for its threshold (a row of the batched sort).
SAMPLE = 4096
_MAG_BITS = 31


def sample_rank(n: int, k: int, s: int) -> int:
    """The rank in a sample of s entries (of n) whose value is taken as the threshold.

    The number of sample entries at or above the true k-th largest magnitude is
    Binomial(s, k/n). Taking the threshold at that mean plus 4 standard deviations (+2)
    leaves at least k candidates except with probability ~3e-5 (then the caller falls
    back, keeping the result exact) while keeping the candidates near k. Above s (k near
    n) the sample cannot place a threshold: ``segmented_topk`` then takes every entry.
    """
    expected = k * s / n
    return math.ceil(expected + 4 * math.sqrt(expected) + 2)


#: What ``segmented_topk`` calls (a module name, so that a test can force a short sample).
_sample_rank = sample_rank


class _Plan(NamedTuple):
    """What a call needs from the layers' sizes and ks alone, made once per (sizes, ks,
    device) and kept (``_PLANS``): the host's loops over the layers and the small
    host-to-device copies leave the step (a GPU step is bound by its host's work)."""

    offsets: list[int]
    total: int
    kept: int
    size_t: torch.Tensor        # each layer's size, on the device
    offset_t: torch.Tensor      # each layer's first entry in the flat buffer
    end_t: torch.Tensor         # each layer's end (its last entry + 1) in the flat buffer
    rank_t: torch.Tensor        # [threshold's column in the sorted sample, rank <= S]
    k_t: torch.Tensor
    within: torch.Tensor        # each kept entry's place in its layer's take, minus its start
    local_shift: torch.Tensor   # each kept entry's layer offset (global -> local index)


#: Plans by (sizes, ks, device, rank rule); a few: k changes only when the compression
#: factor does.
_PLANS: dict[tuple, _Plan] = {}
_MAX_PLANS = 16


def _plan(sizes: tuple[int, ...], ks: tuple[int, ...], device) -> _Plan:
    key = (sizes, ks, str(device), _sample_rank)
    plan = _PLANS.get(key)
    if plan is not None:
        return plan
    offsets = [0]
    for n in sizes[:-1]:
        offsets.append(offsets[-1] + n)
    total, kept = sum(sizes), sum(ks)
    small = torch.tensor([sizes, offsets, ks], dtype=torch.int64).to(device)
    size_t, offset_t, k_t = small[0], small[1], small[2]
    ranks = [_sample_rank(n, k, SAMPLE) for n, k in zip(sizes, ks)]
    # rank > S: threshold 0, every entry of the layer a candidate (the last column of a
    # row sorted in decreasing order, then zeroed)
    rank_t = torch.tensor([[min(r, SAMPLE) - 1, r <= SAMPLE] for r in ranks],
                          dtype=torch.int64).to(device)
    take_start = torch.cumsum(k_t, 0) - k_t
    within = torch.arange(kept, device=device) - repeat_by_counts(take_start, k_t, kept)
    plan = _Plan(offsets, total, kept, size_t, offset_t, offset_t + size_t, rank_t, k_t, within,
                 repeat_by_counts(offset_t, k_t, kept))
    if len(_PLANS) >= _MAX_PLANS:
        _PLANS.pop(next(iter(_PLANS)))
    _PLANS[key] = plan
    return plan


def _magnitudes(xs: list[torch.Tensor], offsets: list[int]) -> torch.Tensor:
    """|x| of every layer in one flat float32 buffer: one pass over their common buffer
    where the layers are adjacent views of one (the error-fed gradients on a GPU,
    ``ResidualMemory.compensate_all``), else concatenated first."""
    base = views_of_one(xs)
    if base is not None:
        at = offsets_in(base, xs)
        start = at[0]
        if all(a == start + o for a, o in zip(at, offsets)):
            part = base[start:start + offsets[-1] + xs[-1].numel()]
            return part.abs() if part.dtype == torch.float32 else part.float().abs_()
    mags = torch.cat([x if x.dim() == 1 else x.reshape(-1) for x in xs])
    return mags.float().abs_() if mags.dtype != torch.float32 else mags.abs_()


def segmented_topk(xs: list[torch.Tensor], ks: list[int], seed: int = 0,
                   step: int = 0) -> list[torch.Tensor] | None:
    """Exact top-k by magnitude of each 1-D tensor of ``xs`` (same device, float16,
    bfloat16 or float32) with its own ``ks[i]`` (1 <= k < n): int64 indices into each
    tensor, or None when some layer's sample left fewer than k candidates (then select
    layer by layer). ``seed`` and ``step`` seed the samples (the result is exact for any
    sample; only the speed depends on it)."""
    device = xs[0].device
    sizes = tuple(x.numel() for x in xs)
    ks = tuple(int(k) for k in ks)
    plan = _plan(sizes, ks, device)
    layers = len(xs)
    mags = _magnitudes(xs, plan.offsets)
    # 2. thresholds: S draws per layer, uniform over the layer (with replacement)
    g = torch.Generator(device=device).manual_seed((seed * 1_000_003 + step) & ((1 << 62) - 1))
    draws = torch.rand(layers, SAMPLE, generator=g, device=device)
    size_t = plan.size_t
    pos = torch.minimum((draws * size_t[:, None]).long(), size_t[:, None] - 1)
    sample = mags.index_select(0, (pos + plan.offset_t[:, None]).view(-1)).view(layers, SAMPLE)
    ordered = sample.sort(dim=1, descending=True).values
    thresholds = ordered.gather(1, plan.rank_t[:, :1]).view(-1) * plan.rank_t[:, 1]
    # 3. candidates: entries at or above their layer's threshold
    spread = repeat_by_counts(thresholds, size_t, plan.total)
    candidates = torch.ge(mags, spread).nonzero().view(-1)                 # sync 1
    # 4. candidates per layer: enough everywhere? nonzero's positions increase, so each
    # layer's candidates are one run, bounded by where its start and end fall among them
    # (not torch.bincount: on a GPU it reads its largest value back to the host, and its
    # histogram of millions of candidates into a few hundred bins took 0.34 ms on an H200)
    run_start = torch.searchsorted(candidates, plan.offset_t)
    counts = torch.searchsorted(candidates, plan.end_t) - run_start
    if bool((counts < plan.k_t).any()):                                    # sync 2
        return None
    # 5. one sort by (layer, decreasing magnitude); the first k_l of each layer's run
    layer_of = torch.searchsorted(plan.offset_t, candidates, right=True) - 1
    bits = mags.index_select(0, candidates).view(torch.int32).to(torch.int64)
    key = (layer_of << _MAG_BITS) + ((1 << _MAG_BITS) - 1 - bits)
    order = torch.sort(key).indices
    rank_pos = repeat_by_counts(run_start, plan.k_t, plan.kept) + plan.within
    chosen = candidates.index_select(0, order.index_select(0, rank_pos))
    return list((chosen - plan.local_shift).split(ks))
