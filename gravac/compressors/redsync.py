"""RedSync trimmed-threshold sparsification (Fang et al., 2019).

The threshold is ``mean + r·(max − mean)`` of the magnitudes, with r found by binary
search on [0, 1] until the selected count lies in ``[ceil(k/2), 2k]``. To keep the search
cheap on large tensors, it first runs on a random sample (counts scaled by n/sample) and
then continues on the full tensor from the sample's answer, which usually needs one or
two full counts. If the search ends (interval below ``min_interval`` or ``max_iters``
full counts) with the count still outside the band, exact top-k of k is returned. So the
count always lies in ``[ceil(k/2), 2k]`` (capped at n).
"""
from __future__ import annotations

import math

import torch

from .base import Compressor, SelectContext, sample_generator, sample_magnitudes
from .blockscan import count_true, true_indices


class RedSync(Compressor):
    """Binary-searched mean/max threshold of RedSync.

    Args:
        max_iters: full-tensor counts allowed in the search.
        min_interval: the search stops when the r-interval is this small.
        sample_fraction, min_sample: size of the sample searched first.
        seed: base seed of the threshold samples (each call seeds from it and the call's
            step, layer, level and rank: ``sample_generator``).

    Example::

        idx = RedSync().select(grad.view(-1), k=grad.numel() // 100)
    """

    name = "redsync"
    exact_count = False       # about k: counts differ per rank

    def __init__(self, max_iters: int = 12, min_interval: float = 1e-7,
                 sample_fraction: float = 0.01, min_sample: int = 10_000, seed: int = 0):
        if max_iters < 1:
            raise ValueError(f"redsync: max_iters must be >= 1, got {max_iters}")
        if not 0 < sample_fraction <= 1:
            raise ValueError(f"redsync: sample_fraction must be in (0, 1], got {sample_fraction}")
        self.max_iters = int(max_iters)
        self.min_interval = float(min_interval)
        self.sample_fraction = sample_fraction
        self.min_sample = int(min_sample)
        self._seed = int(seed)

    def count_bounds(self, k: int, n: int) -> tuple[int, int]:
        k = min(k, n)
        return math.ceil(k / 2), min(n, 2 * k)

    def _search(self, ax, mean, spread, low, high, lo, hi, max_iters):
        """Binary search of r in [lo, hi]; returns (r, lo, hi, count) of the last probe."""
        r, count = lo, None
        for _ in range(max_iters):
            r = (lo + hi) / 2
            count = count_true(self._at_least(ax, mean + r * spread))
            if count > high:
                lo = r
            elif count < low:
                hi = r
            else:
                break
            if hi - lo < self.min_interval:
                break
        return r, lo, hi, count

    def _select(self, x: torch.Tensor, k: int, ctx: SelectContext) -> torch.Tensor:
        # fp16/bf16: the threshold arithmetic needs more than 8-11 bits
        wide = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
        ax = self._magnitudes(x, wide)
        n = ax.numel()
        low, high = math.ceil(k / 2), 2 * k
        mean = float(ax.mean())
        spread = float(ax.max()) - mean
        lo, hi = 0.0, 1.0
        s = min(n, max(self.min_sample, math.ceil(n * self.sample_fraction), math.ceil(32 * n / k)))
        if s < n:
            sample = sample_magnitudes(ax, s, sample_generator(self._seed, ctx))
            scale = s / n
            # Aim the sample at the middle of the band (in log terms, at k).
            r, _, _, _ = self._search(sample, mean, spread, max(1.0, 0.7 * k * scale),
                                      1.4 * k * scale, lo, hi, 40)
            count = count_true(self._at_least(ax, mean + r * spread))
            if count > high:
                lo = r
            elif count < low:
                hi = r
            else:
                return true_indices(self._at_least(ax, mean + r * spread))
        r, lo, hi, count = self._search(ax, mean, spread, low, high, lo, hi, self.max_iters)
        if low <= count <= high:
            return true_indices(self._at_least(ax, mean + r * spread))
        return self._topk_of_all(ax, k)
