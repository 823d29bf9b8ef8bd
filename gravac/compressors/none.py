"""The dense pseudo-compressor: CF 1, everything is sent with an allreduce."""
from __future__ import annotations

import torch

from .base import Compressor, SelectContext


class NoCompression(Compressor):
    """Selects every index, whatever k; the optimizer sends such layers dense.

    Example::

        gravac.DistributedOptimizer(opt, model.named_parameters(), compressor="none")
    """

    name = "none"
    is_dense = True

    def select(self, x: torch.Tensor, k: int, ctx: SelectContext | None = None) -> torch.Tensor:
        if x.dim() != 1:
            raise ValueError(f"none.select expects a 1-D tensor, got shape {tuple(x.shape)}")
        return torch.arange(x.numel(), dtype=torch.int64, device=x.device)

    def _select(self, x: torch.Tensor, k: int, ctx: SelectContext) -> torch.Tensor:
        return torch.arange(x.numel(), dtype=torch.int64, device=x.device)

    def count_bounds(self, k: int, n: int) -> tuple[int, int]:
        return n, n
