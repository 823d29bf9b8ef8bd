"""The few entries of a long tensor that pass a magnitude threshold, found block by block.

On CPU, torch's ``nonzero`` costs ~2 ns an entry and a comparison into a bool mask ~1 ns,
where a max-reduction costs ~0.3 ns: scanning an embedding's error-fed gradient (2.56M
entries, ~16k of them nonzero, in ~120 rows) entry by entry took ~8 ms. Here blocks of
``BLOCK`` entries are screened first by their largest and smallest entry (two vectorised
reductions, ~1.3 ms for 2.56M), and only the blocks that can hold a passing entry are
compared entry by entry. The answer is the same as the entry-by-entry scan's (the same
indices in the same ascending order, NaN handled alike); when most blocks pass, the
screening is wasted and ``passing_indices`` says so (None) for the caller to scan it all.

Example::

    idx = passing_indices(grad.view(-1), threshold=0)       # the nonzero entries, or None
    idx = passing_indices(grad.view(-1), threshold=1e-3)    # |grad| >= 1e-3, or None
"""
from __future__ import annotations

import torch

#: Entries per block: an embedding row (128 here) spans whole blocks; smaller blocks cost
#: a longer block list, larger ones pass more dead entries.
BLOCK = 64
#: Above this fraction of passing blocks the entry-wise scan of the whole tensor is cheaper.
MAX_PASSING = 0.5


def _passes(t: torch.Tensor, threshold) -> torch.Tensor:
    """Entry-wise: ``t != 0`` for threshold 0, else ``|t| >= threshold`` (NaN fails both
    ``>=`` and passes ``!=``, as in the callers' full scans)."""
    if _is_zero(threshold):
        return t != 0
    return t.abs() >= threshold


def _is_zero(threshold) -> bool:
    return not bool(threshold != 0)


def passing_indices(x: torch.Tensor, threshold,
                    max_passing: float = MAX_PASSING) -> torch.Tensor | None:
    """Ascending int64 indices of the entries of the 1-D ``x`` with ``x != 0`` (threshold
    0) or ``|x| >= threshold`` (threshold > 0); None when more than ``max_passing`` of the
    blocks hold such an entry (then a scan of every entry is the cheaper one)."""
    n = x.numel()
    blocks = n // BLOCK
    if blocks == 0:
        return None
    body = x[:blocks * BLOCK].view(blocks, BLOCK)
    hi, lo = body.amax(1), body.amin(1)
    if _is_zero(threshold):
        live = (hi != 0) | (lo != 0)          # a NaN entry makes hi NaN: the block stays
    else:
        live = ~((hi < threshold) & (lo > -threshold))
    live = live.nonzero().view(-1)
    if live.numel() > max_passing * blocks:
        return None
    pos = _passes(body.index_select(0, live), threshold).view(-1).nonzero().view(-1)
    found = live.index_select(0, torch.div(pos, BLOCK, rounding_mode="floor")) * BLOCK \
        + torch.remainder(pos, BLOCK)
    if blocks * BLOCK < n:
        tail = _passes(x[blocks * BLOCK:], threshold).nonzero().view(-1) + blocks * BLOCK
        found = torch.cat([found, tail])
    return found
