"""Exact Top-k: the k entries of largest magnitude.

``torch.topk`` over millions of entries is slow on CPU (a partial sort of the whole
tensor). Instead we estimate a magnitude threshold from a small random sample that keeps
slightly more than k candidates, then run the exact top-k over the candidates only. The
result is still exact: every entry outside the candidates is smaller than the threshold,
and the threshold is at most the k-th largest magnitude whenever at least k candidates
pass it. When fewer than k pass (an unlucky sample, heavy ties), we fall back to a full topk.
When the sampled threshold is 0 (mostly zeros, as in an embedding's gradient), the
candidates are the nonzero entries (``Compressor._topk_of_all``).
"""
from __future__ import annotations

import math

import torch

from .base import (Compressor, SelectContext, exact_topk, kth_largest, sample_generator,
                   sample_magnitudes)


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
        ax = self._magnitudes(x)
        candidates = self._at_least(ax, threshold).nonzero().view(-1)
        if candidates.numel() < k:
            return self._topk_of_all(x, k)
        if candidates.numel() == k:
            return candidates
        return candidates[exact_topk(ax[candidates], k)]
