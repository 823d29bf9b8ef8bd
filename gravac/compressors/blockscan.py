"""The few entries of a long tensor that pass a magnitude threshold, found block by block.

On CPU, torch's ``nonzero`` costs ~2 ns an entry and a comparison into a bool mask ~1 ns,
where a max-reduction costs ~0.3 ns: scanning an embedding's error-fed gradient (2.56M
entries, ~16k of them nonzero, in ~120 rows) entry by entry took ~8 ms. Here blocks of
``BLOCK`` entries are screened first by their largest and smallest entry (two vectorised
reductions, ~1.3 ms for 2.56M), and only the blocks that can hold a passing entry are
compared entry by entry. The answer is the same as the entry-by-entry scan's (the same
indices in the same ascending order, NaN handled alike); when most blocks pass, the
screening is wasted and ``passing_indices`` says so (None) for the caller to scan it all.

``scan_all`` is the entry-by-entry scan. On CPU, for float32 and float64, with at most
``NUMPY_MAX_THREADS`` torch threads, it runs through NumPy on the same memory: NumPy's
comparison and ``flatnonzero`` cost ~0.1 and ~0.5 ns an entry against torch's ~0.8 and
~1.5 on one thread (the output layer, 2.56M entries: 3.3 ms against 7.3-8.8).

Where gravac's native kernel is built (``gravac.native``: one read of x, 64 entries
compared at a time into a bit mask) ``scan_all`` takes it for float32/float64, and
``passing_indices`` answers None: the kernel's one pass over 2.56M entries costs less than
the block screening's two reductions. Same indices either way.

Both tricks are for the CPU. On a GPU one comparison pass and ``nonzero`` are cheap and
every extra launch or host sync is not: ``passing_indices`` answers None there (scan it
all), and the helpers below run torch's own ops on the device (never NumPy).

Example::

    idx = passing_indices(grad.view(-1), threshold=0)       # the nonzero entries, or None
    idx = passing_indices(grad.view(-1), threshold=1e-3)    # |grad| >= 1e-3, or None
    idx = scan_all(grad.view(-1), threshold=1e-3)           # the same, entry by entry
"""
from __future__ import annotations

import numpy as np
import torch

from .. import native

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
    blocks hold such an entry (then a scan of every entry is the cheaper one), and always
    None off the CPU (on a GPU one device scan is the cheap path)."""
    n = x.numel()
    blocks = n // BLOCK
    if blocks == 0 or x.device.type != "cpu" or native.scan_ok(x):
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


#: NumPy's scans run on one thread, torch's on its intra-op threads: with 2 threads torch's
#: abs + comparison + nonzero over 2.56M entries took 4.5 ms against NumPy's 3.4 (1 thread:
#: 8.8 ms), so from 3 threads on torch is expected to be the faster one.
NUMPY_MAX_THREADS = 2


def _numpy_ok(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" and t.is_contiguous() and not t.requires_grad \
        and t.dtype in (torch.float32, torch.float64, torch.bool) \
        and torch.get_num_threads() <= NUMPY_MAX_THREADS


def at_least(ax: torch.Tensor, threshold, out: torch.Tensor) -> torch.Tensor:
    """``out`` (bool, like ``ax``) := ``ax >= threshold``, the threshold taken in ax's dtype
    as torch takes it. Returns ``out``."""
    if _numpy_ok(ax) and _numpy_ok(out):
        an = ax.numpy()
        np.greater_equal(an, an.dtype.type(float(threshold)), out=out.numpy())
        return out
    return torch.ge(ax, threshold, out=out)


def count_true(mask: torch.Tensor) -> int:
    """The number of True entries of a bool tensor."""
    if _numpy_ok(mask):
        return int(np.count_nonzero(mask.numpy()))
    return int(torch.count_nonzero(mask))


def true_indices(mask: torch.Tensor) -> torch.Tensor:
    """Ascending int64 indices of the True entries of a 1-D bool tensor."""
    if _numpy_ok(mask):
        return torch.from_numpy(np.flatnonzero(mask.numpy()))
    return mask.nonzero().view(-1)


def scan_all(x: torch.Tensor, threshold, magnitudes: torch.Tensor | None = None,
             mask: torch.Tensor | None = None) -> torch.Tensor:
    """Ascending int64 indices of the entries of the 1-D ``x`` with ``|x| >= threshold``
    (threshold > 0) or ``x != 0`` (threshold 0), entry by entry. ``magnitudes`` (like x)
    and ``mask`` (bool) are optional scratch buffers of x's length, overwritten."""
    found = native.scan(x, threshold)
    if found is not None:
        return found
    zero = _is_zero(threshold)
    if _numpy_ok(x) and x.dtype != torch.bool:
        xn = x.numpy()
        out = None if mask is None else mask.numpy()
        if zero:
            passed = np.not_equal(xn, 0, out=out)
        else:
            ax = np.abs(xn, out=None if magnitudes is None else magnitudes.numpy())
            # The threshold in x's dtype, as torch compares it (a float32 0-d tensor).
            passed = np.greater_equal(ax, xn.dtype.type(float(threshold)), out=out)
        return torch.from_numpy(np.flatnonzero(passed))
    if zero:
        passed = torch.ne(x, 0) if mask is None else torch.ne(x, 0, out=mask)
    else:
        ax = x.abs() if magnitudes is None else torch.abs(x, out=magnitudes)
        passed = ax >= threshold if mask is None else torch.ge(ax, threshold, out=mask)
    return passed.nonzero().view(-1)
