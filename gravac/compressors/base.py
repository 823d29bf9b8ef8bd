"""The compressor contract: pick which entries of a 1-D tensor to send.

A compressor is pure tensor code. It never communicates, never owns residuals and never
touches the global RNG. The same ``select`` serves both levels of multi-level
compression: the first level sees a whole flattened layer, the second level sees the
values the first level kept.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

import numpy as np
import torch

from .blockscan import at_least, count_true, passing_indices, scan_all, true_indices


class SelectContext(NamedTuple):
    """Where a ``select`` call happens; only randomised compressors look at it.

    ``step`` and ``layer`` make the draws of Random-k reproducible and, when configured,
    identical on every rank; ``rank`` lets them differ per rank; ``level`` separates the
    first and second level of multi-level compression.
    """

    step: int = 0
    layer: int = 0
    rank: int = 0
    level: int = 0


_MASK64 = (1 << 64) - 1


def mix_seed(*values: int) -> int:
    """Deterministic 63-bit seed from integers (splitmix64 finaliser over a running hash)."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (int(v) & _MASK64)) & _MASK64
        h = (h * 0xBF58476D1CE4E5B9) & _MASK64
        h ^= h >> 31
        h = (h * 0x94D049BB133111EB) & _MASK64
        h ^= h >> 29
    return h & ((1 << 63) - 1)


def device_path(t: torch.Tensor) -> bool:
    """Whether a selection over ``t`` takes its accelerator path (``t`` not on the CPU).

    The CPU paths are tuned for a few CPU threads (block screening, NumPy scans, reused
    buffers, sampled thresholds that save torch's slow CPU top-k). On a GPU one
    elementwise pass is cheap, a host sync is not, and fresh tensors come from the caching
    allocator without page faults: there each compressor goes straight to device scans
    with as few syncs as its algorithm allows. Tests force the accelerator path onto CPU
    tensors by replacing this function (those paths are plain torch and run anywhere).
    """
    return t.device.type != "cpu"


def sample_generator(seed: int, ctx: SelectContext, device=None) -> torch.Generator:
    """The generator of one ``select`` call's threshold sample, seeded from where the call
    happens (step, layer, level, rank), not from how many calls came before: the samples,
    and so the picks among tied magnitudes, do not depend on the order layers are
    compressed in (backward's order with overlap, forward's without).

    ``device`` (default: the CPU) is where the generator draws: a tensor on a GPU is
    sampled by a generator of its own device, so no index crosses the bus. The same seed
    draws different numbers on a CPU and on a GPU generator."""
    g = torch.Generator() if device is None else torch.Generator(device=device)
    return g.manual_seed(mix_seed(seed, ctx.step, ctx.layer, ctx.level, ctx.rank))


class Compressor(ABC):
    """Base class: subclasses implement ``_select`` for 1 <= k < n.

    ``select(x, k)`` returns distinct int64 indices into ``x`` (a 1-D tensor); the values
    sent are ``x[indices]`` (gather them with ``x.index_select(0, indices)``: on CPU
    advanced indexing costs ~3-10x as much for the same result). ``k >= n`` returns
    every index; ``k < 1`` is an error.
    ``count_bounds(k)`` documents how many indices a call may return.
    ``x`` may live on any device and the indices come back on it: CPU tensors take the
    CPU paths, GPU tensors the accelerator paths (``device_path``), which keep the same
    promises with device-side draws and few host syncs.

    Example::

        comp = gravac.compressors.get("topk")
        idx = comp.select(grad.view(-1), k=gravac.compressors.num_kept(grad.numel(), 100))
        values = grad.view(-1)[idx]
    """

    name = "base"
    #: True when ``select`` depends on SelectContext (randomised compressors).
    uses_context = False
    #: True for the dense pseudo-compressor: the optimizer then allreduces everything.
    is_dense = False
    #: True for low-rank compressors (PowerSGD): no select(); the engine's low-rank path.
    is_lowrank = False
    #: ``select(x, k)`` returns exactly min(k, n) indices (``count_bounds`` is (k, k)), so
    #: every rank's sparse buffer has the same size and the allgather needs no size round.
    exact_count = True
    #: ``select`` ignores the data and returns the same indices on every rank for the same
    #: (step, layer, level) (Random-k with a shared seed): the shared-index exchange then
    #: needs no round to tell the ranks the index set.
    shared_selection = False

    def select(self, x: torch.Tensor, k: int, ctx: SelectContext | None = None) -> torch.Tensor:
        if x.dim() != 1:
            raise ValueError(f"{self.name}.select expects a 1-D tensor, got shape {tuple(x.shape)}; "
                             "flatten the gradient with .view(-1) first")
        k = int(k)
        if k < 1:
            raise ValueError(f"{self.name}.select needs k >= 1, got k={k}")
        n = x.numel()
        if k >= n:
            return torch.arange(n, dtype=torch.int64, device=x.device)
        return self._select(x, k, ctx or SelectContext())

    def select_many(self, xs: list[torch.Tensor], ks: list[int],
                    ctxs: list[SelectContext] | None = None) -> list[torch.Tensor]:
        """``select`` of each tensor of ``xs`` with its own k and context: the same
        indices as one call each (a compressor may batch the calls: Top-k on a GPU).

        Example::

            idx = comp.select_many([g1, g2], [10, 100])    # [select(g1, 10), select(g2, 100)]
        """
        ctxs = ctxs or [SelectContext()] * len(xs)
        return [self.select(x, k, c) for x, k, c in zip(xs, ks, ctxs)]

    @abstractmethod
    def _select(self, x: torch.Tensor, k: int, ctx: SelectContext) -> torch.Tensor:
        """Indices for 1 <= k < n; ``select`` has already checked the arguments."""

    # -- scratch space ------------------------------------------------------------------
    # On CPU a fresh multi-megabyte tensor costs more in page faults than the arithmetic
    # that fills it (x.abs() on 10M floats: ~20 ms allocated, ~3 ms into a reused buffer),
    # so the full-size intermediates of a selection live in buffers kept between calls.
    # On a GPU the caching allocator hands freed blocks back at no cost: intermediates are
    # fresh tensors there, and no compressor holds a layer-sized buffer between steps.
    @staticmethod
    def _on_device(x: torch.Tensor) -> bool:
        """Whether ``x`` takes the accelerator path (``device_path``, looked up at each
        call so that tests can force it)."""
        return device_path(x)

    def _scratch(self, key: str, numel: int, dtype: torch.dtype, device) -> torch.Tensor:
        if torch.device(device).type != "cpu":
            return torch.empty(numel, dtype=dtype, device=device)
        buffers = self.__dict__.setdefault("_buffers", {})
        buf = buffers.get(key)
        if buf is None or buf.numel() < numel or buf.dtype != dtype or buf.device != device:
            buf = torch.empty(numel, dtype=dtype, device=device)
            buffers[key] = buf
        return buf[:numel]

    def _magnitudes(self, x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """|x| in a reused buffer (valid until the next call)."""
        dtype = dtype or x.dtype
        out = self._scratch("magnitudes", x.numel(), dtype, x.device)
        if dtype == x.dtype:
            return torch.abs(x, out=out)
        return torch.abs(out.copy_(x), out=out)

    def _at_least(self, ax: torch.Tensor, threshold) -> torch.Tensor:
        """Mask ax >= threshold in a reused buffer (valid until the next call)."""
        return at_least(ax, threshold, self._scratch("mask", ax.numel(), torch.bool, ax.device))

    def _topk_of_all(self, x: torch.Tensor, k: int) -> torch.Tensor:
        """Exact top-k by magnitude of the whole of ``x`` (values or their magnitudes),
        fast when most entries are zero.

        Error-fed gradients of embeddings are mostly exact zeros (a batch touches few
        rows): a sampled threshold is then 0, every entry is a candidate, and a full
        ``torch.topk`` over millions of entries costs ~20x a pass. Here the nonzero
        entries are found block by block (``blockscan.passing_indices``: only the blocks
        holding a nonzero are compared entry by entry; ``scan_all``, one pass over ``x``,
        when most blocks do); when at most k are nonzero they are all kept and the first zero
        entries fill up to k (zeros are all equally large: any of them is an exact
        answer), else the top-k runs over the nonzeros only.

        On the accelerator path the nonzeros come from one device scan (``x != 0``, then
        a count and ``nonzero``: block screening saves nothing on a GPU), and filling up
        with zeros needs no host sync of its own.
        """
        n = x.numel()
        device = self._on_device(x)
        if device:
            # Count before listing: a dense x (a low CF, a second level over kept values)
            # then skips writing n int64 indices only to learn that it is dense.
            mask = torch.ne(x, 0, out=self._scratch("mask", n, torch.bool, x.device))
            if count_true(mask) > n // 2:
                return exact_topk(self._magnitudes(x), k)
            nonzero = true_indices(mask)
        else:
            nonzero = passing_indices(x, 0)
            if nonzero is None:
                nonzero = scan_all(x, 0, mask=self._scratch("mask", n, torch.bool, x.device))
        nnz = nonzero.numel()
        if nnz > n // 2:
            return exact_topk(self._magnitudes(x), k)
        if nnz > k:
            return nonzero.index_select(0, exact_topk(x.index_select(0, nonzero).abs(), k))
        need = k - nnz
        # The first need + nnz entries hold at least `need` zeros (nonzero is ascending).
        head = need + nnz
        if device:
            if need == 0:
                return nonzero
            # Nonzeros at or past `head` all land on a spare last slot; the head holds at
            # least `need` zeros, so the first `need` of them have a known count: no sync.
            is_zero = torch.ones(head + 1, dtype=torch.bool, device=x.device)
            is_zero.index_fill_(0, nonzero.clamp(max=head), False)
            zeros = torch.nonzero_static(is_zero[:head], size=need).view(-1)
            return torch.cat([nonzero, zeros])
        is_zero = torch.ones(head, dtype=torch.bool, device=x.device)
        is_zero.index_fill_(0, nonzero[:int(torch.searchsorted(nonzero, head))], False)
        zeros = is_zero.nonzero().view(-1)[:need]
        return torch.cat([nonzero, zeros])

    def count_bounds(self, k: int, n: int) -> tuple[int, int]:
        """Inclusive (low, high) bounds on ``len(select(x, k))`` for a tensor of n elements."""
        k = min(k, n)
        return k, k

    def describe(self) -> dict:
        """Name and public options (what every rank must agree on)."""
        return {"name": self.name,
                **{k: v for k, v in sorted(vars(self).items()) if not k.startswith("_")}}

    def state_dict(self) -> dict:
        """Nothing by default: samples are seeded per call (``sample_generator``), so a
        resumed run draws the same ones without saving a generator."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Accepts any state, including the generator state that checkpoints written
        before per-call seeding (commit 8f9c3ca) hold: per-call seeding does not need it."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


#: On CPU, from this many entries on the top-k and k-th largest come from NumPy's
#: introselect (``np.argpartition`` / ``np.partition``): torch's CPU topk of a 1-D tensor
#: is one single-threaded partial sort, 5-8x slower on one core (docs/notes/2026-11-benchmarks.md §4,
#: "The candidates in one read": 83k candidates of the LSTM's output layer at
#: CF 40, 0.76 ms against 0.14; 275k at CF 10, 4.2 ms against 0.6). Below it the two are
#: alike and torch's call is the cheaper one.
NUMPY_SELECT_MIN = 4096


def _numpy_select_ok(values: torch.Tensor, k: int) -> bool:
    return values.device.type == "cpu" and values.dim() == 1 \
        and values.dtype in (torch.float32, torch.float64) and not values.requires_grad \
        and 0 < k < values.numel() and values.numel() >= NUMPY_SELECT_MIN


def exact_topk(magnitudes: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest entries of ``magnitudes`` (exact): ascending on CPU,
    in no particular order on a GPU.

    Half precision on CPU goes through float32: torch's CPU topk for fp16/bf16 is slow
    and the ordering of the upcast values is the same. CUDA's topk takes them as they are.
    On CPU a long tensor takes NumPy's introselect (``NUMPY_SELECT_MIN``): the same set
    of indices up to ties between equal magnitudes (either choice is an exact top-k),
    NaN largest in both.

    Why ascending on CPU (``ascending_positions``): the callers pick among ascending
    candidates, so their selections come out ascending, and everything downstream reads
    and writes a layer in index order: gathering the values, the residual's update, the
    receivers' ``index_add_``. For the LSTM's output layer at CF 10 (256k of 2.56M
    entries, 10 MB) in random order those took 1.7 and 2.4 ms, in index order 1.0 and 1.0
    (one thread); ordering costs ~0.7 ms.
    """
    if magnitudes.device.type == "cpu" and magnitudes.dtype in (torch.float16, torch.bfloat16):
        magnitudes = magnitudes.float()
    if _numpy_select_ok(magnitudes, k):
        m = magnitudes.numel()
        picked = np.argpartition(magnitudes.numpy(), m - k)[m - k:]
        return torch.from_numpy(ascending_positions(picked, m))
    picked = torch.topk(magnitudes, k, sorted=False).indices
    return picked.sort().values if picked.device.type == "cpu" else picked


def ascending_positions(picked: np.ndarray, m: int) -> np.ndarray:
    """The distinct positions ``picked`` (of ``range(m)``) in ascending order, int64:
    marked in a mask of m flags and read back (~1 ns a flag, ~1.5 ns a mark) where k is
    at least 1/8 of m, as a sampled Top-k's are (about 1.3k candidates); NumPy's sort of
    the k positions (~10 ns each) otherwise."""
    if 8 * picked.size < m:
        return np.sort(picked.astype(np.int64, copy=False))
    mask = np.zeros(m, dtype=bool)
    mask[picked] = True
    return np.flatnonzero(mask)


def sample_magnitudes(ax: torch.Tensor, size: int, generator: torch.Generator) -> torch.Tensor:
    """A uniform random sample (with replacement) of ``size`` entries of ``ax``.

    The indices are drawn where ``generator`` lives (``sample_generator(..., device)``):
    with a generator on ``ax``'s GPU nothing crosses the bus; a CPU generator still works
    with a GPU ``ax`` (its indices are copied over)."""
    idx = torch.randint(0, ax.numel(), (size,), generator=generator, device=generator.device)
    if idx.device != ax.device:
        idx = idx.to(ax.device)
    return ax.index_select(0, idx)


def kth_largest(values: torch.Tensor, k: int) -> torch.Tensor:
    """The k-th largest entry of ``values`` as a 0-d tensor on their device, with no host
    sync (k is clamped to [1, n]; fp16/bf16 values come back as float32, exactly)."""
    k = max(1, min(int(k), values.numel()))
    if values.dtype in (torch.float16, torch.bfloat16):
        values = values.float()
    if _numpy_select_ok(values, k):
        m = values.numel()
        return torch.tensor(np.partition(values.numpy(), m - k)[m - k], dtype=values.dtype)
    return torch.topk(values, k, sorted=False).values.min()
