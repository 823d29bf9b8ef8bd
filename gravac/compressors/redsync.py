"""RedSync trimmed-threshold sparsification (Fang et al., 2019).

The threshold is ``mean + r·(max − mean)`` of the magnitudes, with r found by binary
search on [0, 1] until the selected count lies in ``[ceil(k/2), 2k]``. To keep the search
cheap on large tensors, it first runs on a random sample (counts scaled by n/sample) and
then continues on the full tensor from the sample's answer, which usually needs one or
two full counts. If the search ends (interval below ``min_interval`` or ``max_iters``
full counts) with the count still outside the band, exact top-k of k is returned. So the
count always lies in ``[ceil(k/2), 2k]`` (capped at n).

On a GPU (``base.device_path``) each count of the search would be a host sync (up to 40 on
the sample). There the sample is sorted once on the device and the search runs on the
host from two of its order statistics: a probe's count is above the band exactly when
the sample entry at rank floor(high) + 1 passes its threshold, and below it exactly when
the one at rank ceil(low) does not, so the host search takes the same steps and ends at
the same r as counting would. Mean, max and those two entries come over in one sync;
the first full-tensor probe's ``nonzero`` gives count and indices together. Common case:
two syncs per call; each further full-tensor probe adds one.
"""
from __future__ import annotations

import math

import numpy as np
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

    def _search_by_order_stats(self, above_at, below_at, threshold_of, lo, hi, max_iters):
        """``_search`` on a sample without counting it: ``above_at`` is the sample entry at
        rank floor(high) + 1 (None when the sample is smaller: never above), ``below_at``
        the one at rank ceil(low) (None: always below), both as Python floats in the
        sample's dtype; ``threshold_of(r)`` is the threshold as the comparison sees it
        (rounded to that dtype). count > high exactly when ``above_at`` passes, count < low
        exactly when ``below_at`` does not: the same steps and the same final r."""
        r = lo
        for _ in range(max_iters):
            r = (lo + hi) / 2
            t = threshold_of(r)
            if above_at is not None and above_at >= t:
                lo = r
            elif below_at is None or not below_at >= t:
                hi = r
            else:
                break
            if hi - lo < self.min_interval:
                break
        return r

    def _select(self, x: torch.Tensor, k: int, ctx: SelectContext) -> torch.Tensor:
        if self._on_device(x):
            return self._select_on_device(x, k, ctx)
        # fp16/bf16: the threshold arithmetic needs more than 8-11 bits
        wide = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
        ax = self._magnitudes(x, wide)
        n = ax.numel()
        low, high = math.ceil(k / 2), 2 * k
        mean = float(ax.mean())
        spread = float(ax.max()) - mean
        lo, hi = 0.0, 1.0
        s = self._sample_size(n, k)
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

    def _sample_size(self, n: int, k: int) -> int:
        return min(n, max(self.min_sample, math.ceil(n * self.sample_fraction),
                          math.ceil(32 * n / k)))

    def _select_on_device(self, x: torch.Tensor, k: int, ctx: SelectContext) -> torch.Tensor:
        """The CPU path's selection for the same sample, with two host syncs in the common
        case: mean, max and the sample's two deciding order statistics together, then the
        first full-tensor probe's ``nonzero``."""
        wide = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
        ax = self._magnitudes(x, wide)
        n = ax.numel()
        low, high = math.ceil(k / 2), 2 * k
        lo, hi = 0.0, 1.0
        s = self._sample_size(n, k)
        stats = [ax.mean(), ax.max()]
        picks = []
        if s < n:
            sample = sample_magnitudes(ax, s, sample_generator(self._seed, ctx, ax.device))
            scale = s / n
            # The CPU path's sample band, max(1, 0.7·k·scale) <= count <= 1.4·k·scale, as
            # 0-based positions in the sample sorted in descending order.
            above = math.floor(1.4 * k * scale)
            below = math.ceil(max(1.0, 0.7 * k * scale)) - 1
            picks = [j for j in (above, below) if j < s]
            if picks:
                ranked = torch.sort(sample, descending=True).values
                stats += [ranked[j] for j in picks]
        values = torch.stack(stats).tolist()             # the one sync before the probes
        mean, spread = values[0], values[1] - values[0]
        at = dict(zip(picks, values[2:]))
        if wide == torch.float32:
            def threshold_of(r):                         # as torch.ge(ax, float) rounds it
                return float(np.float32(mean + r * spread))
        else:
            def threshold_of(r):
                return mean + r * spread
        if s < n:
            r = self._search_by_order_stats(at.get(above), at.get(below), threshold_of,
                                            lo, hi, 40)
            mask = ax >= mean + r * spread
            selected = true_indices(mask)
            count = selected.numel()
            if low <= count <= high:
                return selected
            if count > high:
                lo = r
            else:
                hi = r
        r, lo, hi, count = self._search(ax, mean, spread, low, high, lo, hi, self.max_iters)
        if low <= count <= high:
            return true_indices(ax >= mean + r * spread)
        return self._topk_of_all(ax, k)
