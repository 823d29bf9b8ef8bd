"""Random-k: k distinct indices drawn uniformly without replacement.

Values are not rescaled by n/k (the GraVAC paper does not; error feedback carries what
was not sent). Draws come from a private generator seeded from (seed, step, layer, level)
and, unless ``same_across_ranks``, the rank; the global RNG is never touched.

The generator lives on the tensor's device and every draw happens there: on a GPU no
index list is drawn on the CPU and copied over. A CPU generator and a CUDA generator
draw different numbers from the same seed, and CUDA's draws of large tensors can also
depend on the GPU model (torch sizes their grid by its number of multiprocessors): with
``same_across_ranks`` every rank must run on the same kind of device (all on CPUs, or all
on the same GPU model under the same torch version) to draw the same indices.
"""
from __future__ import annotations

import torch

from .base import Compressor, SelectContext, mix_seed
from .blockscan import count_true, true_indices


class RandomK(Compressor):
    """Uniform random selection of k distinct indices (returned sorted).

    Args:
        seed: base seed of the draws.
        same_across_ranks: draw the same indices on every rank for the same
            (step, layer, level); otherwise the rank is mixed into the seed. The draws
            are made on the tensor's device: ranks agree only when they all run on the
            same kind of device (see the module docstring).

    Example::

        comp = RandomK(seed=1)
        idx = comp.select(grad.view(-1), 1000, SelectContext(step=5, layer=2))
    """

    name = "randomk"
    uses_context = True

    def __init__(self, seed: int = 0, same_across_ranks: bool = True):
        self.seed = int(seed)
        self.same_across_ranks = bool(same_across_ranks)

    @property
    def shared_selection(self) -> bool:
        return self.same_across_ranks

    def __repr__(self) -> str:
        return f"RandomK(seed={self.seed}, same_across_ranks={self.same_across_ranks})"

    def _bitmap(self, n: int, m: int, g: torch.Generator) -> torch.Tensor:
        """A bitmap of exactly m distinct uniform positions out of n, on ``g``'s device
        (a reused buffer on CPU).

        Each round draws as many positions as are still missing, so the count never
        overshoots; the process treats all positions alike, so the final m-set is uniform.
        """
        dev = g.device
        mask = self._scratch("mask", n, torch.bool, dev).zero_()
        mask.index_fill_(0, torch.randint(0, n, (m,), generator=g, device=dev), True)
        count = count_true(mask)
        while count < m:
            more = torch.randint(0, n, (m - count,), generator=g, device=dev)
            fresh = torch.unique(more[~mask[more]])
            mask[fresh] = True
            count += fresh.numel()
        return mask

    def _select(self, x: torch.Tensor, k: int, ctx: SelectContext) -> torch.Tensor:
        n = x.numel()
        rank = 0 if self.same_across_ranks else ctx.rank + 1
        dev = x.device
        # A generator of x's device: on a GPU every draw below runs there (host syncs:
        # one per unique() / nonzero(), no index list crosses the bus).
        g = torch.Generator(device=dev).manual_seed(
            mix_seed(self.seed, ctx.step, ctx.layer, ctx.level, rank))
        if 32 * k >= n:
            # Dense-ish draws: mark a bitmap instead of sorting k random integers. For
            # k > n/2 draw the n - k entries to leave out (CF 1.5 keeps two thirds).
            drop = 2 * k > n
            mask = self._bitmap(n, n - k if drop else k, g)
            if drop:
                torch.logical_not(mask, out=mask)
            idx = true_indices(mask)
        else:
            # Sparse draws: draw with replacement and drop duplicates. The distinct set is a
            # uniform subset given its size (the draw is exchangeable over indices), and a
            # uniform k-subset of it is a uniform k-subset of [0, n).
            idx = torch.unique(torch.randint(0, n, (k + k // 8 + 16,), generator=g, device=dev))
            while idx.numel() < k:
                more = torch.randint(0, n, (2 * (k - idx.numel()) + 16,), generator=g,
                                     device=dev)
                idx = torch.unique(torch.cat([idx, more]))
            if idx.numel() > k:
                keep = torch.randperm(idx.numel(), generator=g, device=dev)[:k].sort().values
                idx = idx.index_select(0, keep)
        return idx
