"""Exact Top-k: the k entries of largest magnitude.

``torch.topk`` over millions of entries is slow on CPU (a partial sort of the whole
tensor). Instead we estimate a magnitude threshold from a small random sample that keeps
slightly more than k candidates, then run the exact top-k over the candidates only. The
result is still exact: every entry outside the candidates is smaller than the threshold,
and the threshold is at most the k-th largest magnitude whenever at least k candidates
pass it. When fewer than k pass (an unlucky sample, heavy ties), we fall back to a full topk.
When the sampled threshold is 0 (mostly zeros, as in an embedding's gradient), the
candidates are the nonzero entries (``Compressor._topk_of_all``). Candidates that
cluster in a few blocks of the tensor (an embedding's rows) are found without comparing
every entry (``blockscan.py``).
"""
from __future__ import annotations

import math

import torch

from .base import (Compressor, SelectContext, exact_topk, kth_largest, sample_generator,
                   sample_magnitudes)
from .blockscan import passing_indices, scan_all

#: Calls a layer whose candidates filled most blocks is scanned without block screening.
BLOCK_RETRY = 32


class TopK(Compressor):
    """Exact Top-k by magnitude.

    Args:
        sample_fraction: fraction of entries sampled to estimate the threshold.
        min_sample: the sample never has fewer entries than this (capped at n).
        direct_below: tensors with at most this many entries use ``torch.topk`` directly.
        seed: seed of the private generator used for sampling (results do not depend
            on it: only the speed does).

    Example::

        idx = TopK().select(torch.tensor([0.1, -3.0, 2.0, 0.5]), 2)   # {1, 2}
    """

    name = "topk"

    def __init__(self, sample_fraction: float = 0.01, min_sample: int = 10_000,
                 direct_below: int = 65_536, seed: int = 0):
        if not 0 < sample_fraction <= 1:
            raise ValueError(f"topk: sample_fraction must be in (0, 1], got {sample_fraction}")
        self.sample_fraction = sample_fraction
        self.min_sample = int(min_sample)
        self.direct_below = int(direct_below)
        self._seed = int(seed)

    def _select(self, x: torch.Tensor, k: int, ctx: SelectContext) -> torch.Tensor:
        n = x.numel()
        if n <= self.direct_below:
            return exact_topk(self._magnitudes(x), k)
        # k so large that candidates would not be much fewer than n.
        if 8 * k >= n:
            return self._topk_of_all(x, k)
        s = min(n, max(self.min_sample, math.ceil(n * self.sample_fraction)))
        # The sample's magnitudes only: |x| of the whole tensor is needed only when the
        # threshold is above zero.
        sample = sample_magnitudes(x, s, sample_generator(self._seed, ctx)).abs()
        # The number of sample entries at or above the true k-th largest magnitude is
        # Binomial(s, k/n). Taking the threshold at that mean plus 4 standard deviations
        # (+2) leaves at least k candidates except with probability ~3e-5 (then the
        # fallback below keeps the result exact) while keeping the candidates near k.
        expected = k * s / n
        rank = math.ceil(expected + 4 * math.sqrt(expected) + 2)
        threshold = kth_largest(sample, rank)
        if not threshold > 0:
            # Mostly zeros (an embedding's gradient): every entry would be a candidate.
            return self._topk_of_all(x, k)
        candidates = self._candidates(x, threshold, (ctx.layer, ctx.level, n))
        if candidates.numel() < k:
            return self._topk_of_all(x, k)
        if candidates.numel() == k:
            return candidates
        # index_select, not candidates[...]: advanced indexing costs ~10x more on CPU.
        return candidates.index_select(
            0, exact_topk(x.index_select(0, candidates).abs(), k))

    def _candidates(self, x: torch.Tensor, threshold, site: tuple) -> torch.Tensor:
        """Ascending indices of |x| >= threshold. Block by block (``blockscan``) where the
        candidates cluster (an embedding's rows); a layer whose candidates were spread
        over most blocks last time (a dense layer) is scanned entry by entry for the next
        ``BLOCK_RETRY`` calls without screening blocks first. Either way the same indices."""
        skips = self.__dict__.setdefault("_skip_block_scan", {})
        if skips.get(site, 0) > 0:
            skips[site] -= 1
        else:
            found = passing_indices(x, threshold)
            if found is not None:
                return found
            skips[site] = BLOCK_RETRY
        n = x.numel()
        return scan_all(x, threshold, self._scratch("magnitudes", n, x.dtype, x.device),
                        self._scratch("mask", n, torch.bool, x.device))
