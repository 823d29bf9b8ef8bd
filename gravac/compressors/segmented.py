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

import torch

from ..util.segments import repeat_by_counts

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


def segmented_topk(xs: list[torch.Tensor], ks: list[int], seed: int = 0,
                   step: int = 0) -> list[torch.Tensor] | None:
    """Exact top-k by magnitude of each 1-D tensor of ``xs`` (same device, float16,
    bfloat16 or float32) with its own ``ks[i]`` (1 <= k < n): int64 indices into each
    tensor, or None when some layer's sample left fewer than k candidates (then select
    layer by layer). ``seed`` and ``step`` seed the samples (the result is exact for any
    sample; only the speed depends on it)."""
    device = xs[0].device
    sizes = [x.numel() for x in xs]
    layers, total, kept = len(xs), sum(sizes), sum(ks)
    offsets = [0]
    for n in sizes[:-1]:
        offsets.append(offsets[-1] + n)
    mags = torch.cat([x.reshape(-1) for x in xs])
    mags = mags.float().abs_() if mags.dtype != torch.float32 else mags.abs_()
    small = torch.tensor([sizes, offsets], dtype=torch.int64).to(device, non_blocking=True)
    size_t, offset_t = small[0], small[1]
    # 2. thresholds: S draws per layer, uniform over the layer (with replacement)
    g = torch.Generator(device=device).manual_seed((seed * 1_000_003 + step) & ((1 << 62) - 1))
    draws = torch.rand(layers, SAMPLE, generator=g, device=device)
    pos = torch.minimum((draws * size_t[:, None]).long(), size_t[:, None] - 1)
    sample = mags.index_select(0, (pos + offset_t[:, None]).view(-1)).view(layers, SAMPLE)
    ranks = [_sample_rank(n, k, SAMPLE) for n, k in zip(sizes, ks)]
    # rank > S: threshold 0, every entry of the layer a candidate (the last column of a
    # row sorted in decreasing order, then zeroed)
    rank_t = torch.tensor([[min(r, SAMPLE) - 1, r <= SAMPLE] for r in ranks],
                          dtype=torch.int64).to(device, non_blocking=True)
    ordered = sample.sort(dim=1, descending=True).values
    thresholds = ordered.gather(1, rank_t[:, :1]).view(-1) * rank_t[:, 1]
    # 3. candidates: entries at or above their layer's threshold
    spread = repeat_by_counts(thresholds, size_t, total)
    candidates = torch.ge(mags, spread).nonzero().view(-1)                 # sync 1
    # 4. candidates per layer: enough everywhere?
    layer_of = torch.searchsorted(offset_t, candidates, right=True) - 1
    counts = torch.bincount(layer_of, minlength=layers)
    count_list = counts.tolist()                                            # sync 2
    if any(c < k for c, k in zip(count_list, ks)):
        return None
    # 5. one sort by (layer, decreasing magnitude); the first k_l of each layer's run
    bits = mags.index_select(0, candidates).view(torch.int32).to(torch.int64)
    key = (layer_of << _MAG_BITS) + ((1 << _MAG_BITS) - 1 - bits)
    order = torch.sort(key).indices
    run_start, take_start = [0], [0]
    for c, k in zip(count_list[:-1], ks[:-1]):
        run_start.append(run_start[-1] + c)
        take_start.append(take_start[-1] + k)
    shift = torch.tensor([r - t for r, t in zip(run_start, take_start)],
                         dtype=torch.int64).to(device, non_blocking=True)
    k_t = torch.tensor(ks, dtype=torch.int64).to(device, non_blocking=True)
    rank_pos = repeat_by_counts(shift, k_t, kept) + torch.arange(kept, device=device)
    chosen = candidates.index_select(0, order.index_select(0, rank_pos))
    local = chosen - repeat_by_counts(offset_t, k_t, kept)
    return list(local.split(ks))
