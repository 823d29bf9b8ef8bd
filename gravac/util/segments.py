"""Each value repeated a count of times, as ``torch.repeat_interleave`` does, in kernels
whose work is spread over the output.

Why not ``repeat_interleave`` on a GPU: its CUDA kernel gives each *value* one thread,
which writes that value's whole run alone. For few long runs that is a serial loop: on an
H200, spreading the LSTM's 10 layer offsets over 5.1M selected indices took 0.73 ms (0.14
here) and ResNet-101's 161 per-layer thresholds over its 42.5M entries 1.71 ms (0.50 here;
docs/notes/2026-11-benchmarks.md §7c). Here the output is a gather by a segment number that one
``cumsum`` over the output computes: every kernel runs one thread per output entry.

Example::

    repeat_by_counts(torch.tensor([7, 8, 9]), torch.tensor([2, 0, 3]), total=5)
    # tensor([7, 7, 9, 9, 9])
"""
from __future__ import annotations

import torch


def repeat_by_counts(values: torch.Tensor, counts: torch.Tensor, total: int) -> torch.Tensor:
    """``values.repeat_interleave(counts, output_size=total)`` for a 1-D ``values`` and
    non-negative int64 ``counts`` on its device that add up to ``total`` (the caller knows
    it: no host sync). Zero counts are allowed (their value does not appear)."""
    if values.device.type == "cpu":
        return values.repeat_interleave(counts, output_size=total)  # no such cost there
    return repeat_by_cumsum(values, counts, total)


def repeat_by_cumsum(values: torch.Tensor, counts: torch.Tensor, total: int) -> torch.Tensor:
    """``repeat_by_counts``'s GPU path, on any device (the tests run it on the CPU)."""
    # Entry e belongs to segment s when s segment ends are <= e: mark each end (two
    # segments may end at one place: empty ones), a running sum counts them.
    ends = torch.cumsum(counts, 0)
    marks = torch.zeros(total + 1, dtype=torch.int64, device=values.device)
    marks.index_add_(0, ends, torch.ones_like(ends))
    segment = torch.cumsum(marks[:total], 0)
    return values.index_select(0, segment)


def shift_by_segment(local: torch.Tensor, counts: list[int], offsets: list[int]) -> torch.Tensor:
    """Concatenated per-segment indices (int64, ``counts[j]`` of them for segment j, in
    order) as indices of one flat buffer: each shifted by its segment's offset. What lets
    one ``index_add_`` serve every layer of a step (the residual update, the sparse
    aggregation). The counts and offsets are the host's: no sync.

    Example::

        shift_by_segment(torch.tensor([0, 1, 0]), [2, 1], [0, 10])   # tensor([0, 1, 10])
    """
    device = local.device
    shift = torch.tensor(offsets, dtype=torch.int64).to(device, non_blocking=True)
    count_t = torch.tensor(counts, dtype=torch.int64).to(device, non_blocking=True)
    return local + repeat_by_counts(shift, count_t, local.numel())


def views_of_one(tensors) -> torch.Tensor | None:
    """The 1-D tensor every one of ``tensors`` is a contiguous 1-D view of, or None."""
    if not tensors or tensors[0] is None:
        return None
    base = tensors[0]._base
    if base is None or base.dim() != 1:
        return None
    for t in tensors:
        if t is None or t._base is not base or t.dim() != 1 or not t.is_contiguous():
            return None
    return base


def offsets_in(base: torch.Tensor, views) -> list[int]:
    """Where each 1-D view of ``base`` starts in it (elements): the segment offsets
    ``shift_by_segment`` takes for views of one flat buffer."""
    start = base.storage_offset()
    return [v.storage_offset() - start for v in views]


def gather_segments(sources: list[torch.Tensor], indices: list[torch.Tensor]) -> list[torch.Tensor]:
    """``sources[j].index_select(0, indices[j])`` of every j (1-D sources of one device and
    dtype), by ONE ``index_select`` over one flat buffer: the sources' own base where they
    are views of one (the error-fed gradients on a GPU, ``ResidualMemory.compensate_all``;
    the values a first level kept), else their concatenation. Each index shifted by its
    source's offset (``shift_by_segment``); the result split per source (views of one
    tensor, which a second gather of the same kind then reads without a copy). The same
    values as one ``index_select`` per source, without a launch per layer.

    Example::

        a, b = torch.arange(10.).split([4, 6])
        gather_segments([a, b], [torch.tensor([3]), torch.tensor([0, 5])])
        # [tensor([3.]), tensor([4., 9.])]
    """
    counts = [int(i.numel()) for i in indices]
    base = views_of_one(sources)
    if base is not None:
        offsets = offsets_in(base, sources)
    else:
        base = torch.cat([s if s.dim() == 1 else s.reshape(-1) for s in sources])
        offsets, at = [], 0
        for s in sources:
            offsets.append(at)
            at += s.numel()
    local = torch.cat([i if i.dim() == 1 else i.reshape(-1) for i in indices]).to(torch.int64)
    return list(base.index_select(0, shift_by_segment(local, counts, offsets)).split(counts))
