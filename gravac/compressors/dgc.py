"""DGC sparsification (Lin et al., ICLR 2018): a threshold estimated from a sample.

The magnitude threshold is the sample's top-k threshold, from a random sample of
``sample_fraction`` of the entries. If the full tensor then selects more than
``(1 + tolerance)·k`` or fewer than ``(1 - tolerance)·k`` entries, the threshold is
re-estimated (up to ``max_retries`` times); a selection still above k is trimmed to k by
exact top-k among the selected, and one still below ``(1 - tolerance)·k`` falls back to
exact top-k. So the count always lies in ``[ceil((1 - tolerance)·k), k]``.

On a GPU (``base.device_path``) the algorithm is the same (the same 1% sample, drawn on the
device) with fewer host syncs: the first probe's ``nonzero`` gives the count and the
indices together (one sync where the CPU path counts and then scans again), a zero
sample threshold is only looked at when that probe came back short, and retries count
without writing indices. Common case: one sync per call.
"""
from __future__ import annotations

import math

import torch

from .. import native
from .base import (Compressor, SelectContext, exact_topk, kth_largest, sample_generator,
                   sample_magnitudes)
from .blockscan import count_true, true_indices


class DGC(Compressor):
    """Sampled-threshold sparsifier of Deep Gradient Compression.

    Args:
        sample_fraction: fraction of entries sampled (DGC uses 1%).
        tolerance: accepted relative deviation of the count from k (0.3: [0.7k, 1.3k]).
        max_retries: threshold re-estimations before trimming / falling back.
        seed: base seed of the threshold samples (each call seeds from it and the call's
            step, layer, level and rank: ``sample_generator``).

    Example::

        idx = DGC().select(grad.view(-1), k=grad.numel() // 100)
    """

    name = "dgc"
    exact_count = False       # about k: counts differ per rank

    def __init__(self, sample_fraction: float = 0.01, tolerance: float = 0.3,
                 max_retries: int = 3, seed: int = 0):
        if not 0 < sample_fraction <= 1:
            raise ValueError(f"dgc: sample_fraction must be in (0, 1], got {sample_fraction}")
        if not 0 <= tolerance < 1:
            raise ValueError(f"dgc: tolerance must be in [0, 1), got {tolerance}")
        if max_retries < 0:
            raise ValueError(f"dgc: max_retries must be >= 0, got {max_retries}")
        self.sample_fraction = sample_fraction
        self.tolerance = tolerance
        self.max_retries = int(max_retries)
        self._seed = int(seed)

    def count_bounds(self, k: int, n: int) -> tuple[int, int]:
        k = min(k, n)
        return min(k, math.ceil((1 - self.tolerance) * k)), k

    def _sample_size(self, n: int, k: int) -> int:
        # Enough samples that the sample's own top-k holds several entries.
        return min(n, max(math.ceil(n * self.sample_fraction), math.ceil(8 * n / k)))

    def _retry(self, sample, s, rank, threshold, count, k, high):
        """The next (rank, threshold) after a count outside the band."""
        # Correct the sample rank by how far the count missed; when the sample
        # cannot resolve a finer threshold, scale the threshold itself.
        new_rank = max(1, min(s, round(rank * k / max(count, 1))))
        if new_rank != rank:
            return new_rank, kth_largest(sample, new_rank)
        return rank, threshold * (1.3 if count > high else 0.7)

    def _select(self, x: torch.Tensor, k: int, ctx: SelectContext) -> torch.Tensor:
        if self._on_device(x):
            return self._select_on_device(x, k, ctx)
        # With gravac's native kernel a probe at a positive threshold is one read of x
        # that returns the indices (the count is their number); otherwise |x| is written
        # once and a probe is a mask and its count, the indices listed at the end. The
        # same selection either way (the kernel's threshold 0 would mean x != 0, not
        # |x| >= 0: a retry that lands on 0 takes the mask).
        scan = native.scan_ok(x)
        ax = None if scan else self._magnitudes(x)     # |x|, written only when a mask needs it
        n = x.numel()
        s = self._sample_size(n, k)
        sample = sample_magnitudes(x if scan else ax, s, sample_generator(self._seed, ctx))
        if scan:
            sample = sample.abs()
        rank = math.ceil(k * s / n)
        low, high = (1 - self.tolerance) * k, (1 + self.tolerance) * k
        threshold = kth_largest(sample, rank)
        if not threshold > 0:
            # Mostly zeros: no threshold separates k entries; keep the exact top-k.
            return self._topk_of_all(x, k)

        def probe(t):
            """(count of |x| >= t, a function listing their indices)"""
            nonlocal ax
            if scan and t > 0:
                found = native.scan(x, t)
                return found.numel(), lambda: found
            if ax is None:
                ax = self._magnitudes(x)
            mask = self._at_least(ax, t)
            return count_true(mask), lambda: true_indices(mask)

        count, listed = probe(threshold)
        for _ in range(self.max_retries):
            if low <= count <= high:
                break
            rank, threshold = self._retry(sample, s, rank, threshold, count, k, high)
            count, listed = probe(threshold)
        if count < low:
            return self._topk_of_all(x, k)
        selected = listed()
        if count > k:
            selected = selected.index_select(
                0, exact_topk(x.index_select(0, selected).abs_(), k))
        return selected

    def _select_on_device(self, x: torch.Tensor, k: int, ctx: SelectContext) -> torch.Tensor:
        """The same selection as the CPU path's for the same sample, with one host sync in
        the common case (the first probe's ``nonzero``); retries add one count each."""
        ax = self._magnitudes(x)
        n = ax.numel()
        s = self._sample_size(n, k)
        sample = sample_magnitudes(ax, s, sample_generator(self._seed, ctx, ax.device))
        rank = math.ceil(k * s / n)
        low, high = (1 - self.tolerance) * k, (1 + self.tolerance) * k
        threshold = kth_largest(sample, rank)
        # A zero threshold probes at +inf instead (nothing passes but inf and the count
        # comes back short); whether it was zero is asked only then.
        probe = torch.where(threshold > 0, threshold, torch.full_like(threshold, math.inf))
        mask = ax >= probe
        selected = true_indices(mask)
        count = selected.numel()
        if count < low and not bool(threshold > 0):
            # Mostly zeros: no threshold separates k entries; keep the exact top-k.
            return self._topk_of_all(ax, k)
        for _ in range(self.max_retries):
            if low <= count <= high:
                break
            rank, threshold = self._retry(sample, s, rank, threshold, count, k, high)
            mask = ax >= threshold
            selected, count = None, count_true(mask)
        if count < low:
            return self._topk_of_all(ax, k)
        if selected is None:
            selected = true_indices(mask)
        if count > k:
            selected = selected.index_select(0, exact_topk(ax.index_select(0, selected), k))
        return selected
