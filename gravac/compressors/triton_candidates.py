"""Top-k's candidates on a GPU in two passes of one Triton kernel: the entries at or above
a threshold, with their indices (ascending) and magnitudes, from two reads of the tensor.

Top-k's device path (``topk.py``) finds its candidates with torch's kernels: a pass that
writes ``trunc(x / t)`` as 2-byte floats, then ``nonzero``, which reads that mask twice
and syncs for its count. On an H200 that took 0.48 ms at 100M entries, 2.5 times one pass
over the tensor (docs/notes/2026-11-benchmarks.md §7b), and the top-k among the candidates then gathers
their values from x once more. Here:

1. counting (``WRITE=False``): each block of ``BLOCK`` entries counts its passing entries
   (one read of x, one int32 per block written);
2. an inclusive ``cumsum`` of the counts (one small torch kernel) gives every block the
   place of its first candidate, and its last entry the total: the one host sync, for the
   size of the output;
3. writing (``WRITE=True``): each block compares again, ranks its passing entries by a
   prefix sum within the block, and writes their indices and magnitudes there (a second
   read of x).

The threshold is read by the kernel from a 1-element device tensor, so the sampled
threshold needs no host sync of its own (the torch path needs it as a host scalar). The
output is ascending and the same for every run: no atomics, so it is deterministic.

The test is ``|x| >= t`` (in t's dtype: float32, or float64 for float64 x; an exact,
monotone upcast) or NaN, the set torch's path would pass up to where ``trunc(x / t)``
rounds: upward closed in |x| either way, which is all Top-k's exactness needs (see
``topk.py``). Triton compiles each pass once per dtype and block size (about a second,
the first time, then from its cache on disk).

Without a GPU the kernels run in Triton's interpreter on CPU tensors
(``TRITON_INTERPRET=1`` in the environment before Triton is first imported): that is how
the CPU tests check them (tests/triton).

Example::

    t = torch.tensor([2.0], device="cuda")
    idx, mags = candidates_at_or_above(x, t)     # x: 1-D, on the GPU
    # idx: int64 ascending indices with |x[idx]| >= 2 or NaN; mags = |x[idx]| (float32)
"""
from __future__ import annotations

import importlib.util
import os

import torch

#: Entries per Triton program. 4096 float32 entries are 16 KB a block: enough work per
#: program to hide its latency, few enough blocks' counts (25k at 100M) for one cumsum.
BLOCK = 4096
#: Warps per program (128 threads x 8 warps: 16 entries a thread at ``BLOCK``).
NUM_WARPS = 8

_KERNELS: dict[bool, tuple] = {}


def available() -> bool:
    """Whether Triton can be imported here (a CUDA build of torch brings it; on CPU it is
    installed for the interpreter's tests)."""
    return importlib.util.find_spec("triton") is not None


def runs_on(device) -> bool:
    """Whether the kernels can run on tensors of ``device``: Triton is installed and the
    device is a GPU, or Triton interprets (any device: CPU tensors)."""
    return available() and (torch.device(device).type == "cuda" or interpreting())


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _kernels():
    """The kernel (its counting and its writing pass), decorated at first use (Triton is
    imported only when it runs): ``triton.jit`` decides at decoration time whether a
    kernel is compiled or interpreted, from ``TRITON_INTERPRET``."""
    mode = interpreting()
    if mode not in _KERNELS:
        import triton
        import triton.language as tl

        @triton.jit
        def candidates_kernel(x_ptr, t_ptr, counts_ptr, ends_ptr, idx_ptr, mag_ptr, n,
                              BLOCK: tl.constexpr, WRITE: tl.constexpr):
            # WRITE is a compile-time flag: two kernels from one source, the same test.
            pid = tl.program_id(0)
            offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            inside = offs < n
            x = tl.load(x_ptr + offs, mask=inside, other=0.0)
            t = tl.load(t_ptr)
            xt = x.to(t.dtype)
            passing = ((tl.abs(xt) >= t) | (xt != xt)) & inside
            ones = passing.to(tl.int32)
            if WRITE:
                # The block's first slot: its inclusive end minus its own count.
                first = tl.load(ends_ptr + pid) - tl.load(counts_ptr + pid)
                slot = first + (tl.cumsum(ones, axis=0) - ones).to(tl.int64)
                tl.store(idx_ptr + slot, offs, mask=passing)
                tl.store(mag_ptr + slot, tl.abs(xt), mask=passing)
            else:
                tl.store(counts_ptr + pid, tl.sum(ones, axis=0))

        _KERNELS[mode] = (triton, candidates_kernel)
    return _KERNELS[mode]


def threshold_dtype(x_dtype: torch.dtype) -> torch.dtype:
    """The dtype the test runs in (and the magnitudes come back in): float64 for float64
    tensors, float32 for float32, float16 and bfloat16 (an exact upcast)."""
    return torch.float64 if x_dtype == torch.float64 else torch.float32


def candidates_at_or_above(x: torch.Tensor, threshold: torch.Tensor
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices (int64, ascending) and magnitudes (``threshold_dtype``) of the entries of
    the 1-D tensor ``x`` with ``|x| >= threshold`` or NaN. ``threshold``: one element on
    x's device (any float dtype; it is cast to ``threshold_dtype``, exactly for the
    thresholds Top-k takes, which are magnitudes of x). One host sync (the count)."""
    if x.dim() != 1 or not x.is_floating_point():
        raise ValueError(f"candidates_at_or_above: expected a 1-D float tensor, got "
                         f"{x.dim()}-D {x.dtype}")
    if x.device.type == "cpu" and not interpreting():
        raise ValueError("candidates_at_or_above: a CPU tensor needs Triton's interpreter "
                         "(TRITON_INTERPRET=1); on CPU use Top-k's own CPU path")
    triton, kernel = _kernels()
    x = x.contiguous()
    n = x.numel()
    t = threshold.reshape(1).to(device=x.device, dtype=threshold_dtype(x.dtype))
    blocks = max(1, triton.cdiv(n, BLOCK))
    counts = torch.empty(blocks, dtype=torch.int32, device=x.device)
    # count: one int32 per block (the pointers it does not use: any tensor)
    kernel[(blocks,)](x, t, counts, counts, counts, counts, n, BLOCK=BLOCK, WRITE=False,
                      num_warps=NUM_WARPS)
    ends = torch.cumsum(counts, 0, dtype=torch.int64)
    total = int(ends[-1])                                                  # the sync
    idx = torch.empty(total, dtype=torch.int64, device=x.device)
    mags = torch.empty(total, dtype=t.dtype, device=x.device)
    if total:
        kernel[(blocks,)](x, t, counts, ends, idx, mags, n, BLOCK=BLOCK, WRITE=True,
                          num_warps=NUM_WARPS)
    return idx, mags
