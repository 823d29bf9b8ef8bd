"""Index sets in fewer bytes: how shared_index's leaders tell every rank their indices.

A layer's index set is ascending, so an index is (its block, its place in the block): with
blocks of 2^L entries, the low L bits of every index go in 1 or 2 bytes each, and the high
part as one count per block (how many indices fall in it). Every rank rebuilds the same
ascending indices from those counts (``repeat_by_counts``) and low bits, so nothing is
lost. At CF 10 an index costs ~1.08 bytes with L = 8 instead of 4 (int32); at CF 1000,
~2.06 with L = 16. The size of a field depends only on the layer's size and the most
indices it may hold, so every rank computes the same layout without a round
(``plan``); the smallest of raw int32 (int64 for layers of 2^31+ entries), L = 8 and
L = 16 is taken, raw on a tie (the cheapest to decode).

Layout of a field (``nbytes``, a multiple of 8 so that every field and view is aligned;
its size is ``sizes.index_field_layout``'s, shared with the cost model):
raw: ``capacity`` int32/int64 indices; L = 8: ceil(numel / 256) int16 block counts, then
``capacity`` uint8 low bytes; L = 16: ceil(numel / 65536) int32 block counts, then
``capacity`` int16 low halves (two's complement of the low 16 bits), each part padded to
8 bytes. Unused slots stay zero, which is what lets the fields of every leader share one
buffer summed by an allreduce (docs/ALGORITHM.md §13).

Example::

    field = plan(numel=2_560_000, capacity=256_000)       # low_bits 8: 276,000 bytes
    data = torch.zeros(field.nbytes, dtype=torch.uint8)
    encode(field, ascending(idx), data)
    assert torch.equal(decode(field, data, idx.numel()), ascending(idx))
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..util.segments import repeat_by_counts
from ..util.sizes import index_field_blocks, index_field_layout, pad8, raw_index_bytes

#: low_bits -> (dtype of a block count, dtype of a low part): the dtypes of
#: ``sizes.INDEX_FIELD_PARTS``' byte sizes (signed: the block counts feed repeat_by_counts,
#: a low int16 is masked back to 16 bits when decoded).
_PARTS = {8: (torch.int16, torch.uint8), 16: (torch.int32, torch.int16)}
_RAW_DTYPES = {4: torch.int32, 8: torch.int64}
_pad8 = pad8          # the name tests/unit/test_index_codec.py builds fields with


@dataclass(frozen=True)
class IndexField:
    """Where one layer's index set lives in the shared buffer: ``low_bits`` 0 is raw."""
    numel: int
    capacity: int
    low_bits: int
    nbytes: int

    @property
    def blocks(self) -> int:
        return index_field_blocks(self.numel, self.low_bits)

    @property
    def raw_dtype(self) -> torch.dtype:
        return _RAW_DTYPES[raw_index_bytes(self.numel)]

    @property
    def _counts_bytes(self) -> int:
        return pad8(self.blocks * _PARTS[self.low_bits][0].itemsize)


def plan(numel: int, capacity: int) -> IndexField:
    """The smallest field for up to ``capacity`` ascending indices of a layer of ``numel``
    (``sizes.index_field_layout``: raw, L = 16 or L = 8)."""
    low_bits, nbytes = index_field_layout(numel, capacity)
    return IndexField(numel, capacity, low_bits, nbytes)


def ascending(idx: torch.Tensor) -> torch.Tensor:
    """``idx`` sorted ascending (int64). On CPU through NumPy, whose sort of int64 is ~6x
    torch's here (256k indices: 2.4 against 15.7 ms), and not at all when ``idx`` is
    ascending already, as the CPU's Top-k selections are (the check: ~0.1 ms for 256k)."""
    idx = idx.to(torch.int64)
    if idx.device.type == "cpu":
        a = idx.contiguous().numpy()
        return idx if ascends(a) else torch.from_numpy(np.sort(a))
    return torch.sort(idx).values


def ascends(a: np.ndarray) -> bool:
    """Whether the 1-D array ``a`` is strictly ascending (one pass; ~0.1 ms for 256k)."""
    return a.size < 2 or bool(np.all(a[1:] > a[:-1]))


def encode(field: IndexField, idx: torch.Tensor, out: torch.Tensor) -> None:
    """Write the ascending int64 ``idx`` (at most ``field.capacity``, each < numel) into
    ``out``: ``field.nbytes`` zeroed uint8 entries (the caller's slice of the buffer)."""
    count = idx.numel()
    if count > field.capacity:
        raise ValueError(f"{count} indices do not fit a field of {field.capacity}")
    if not field.low_bits:
        out[:count * field.raw_dtype.itemsize].view(field.raw_dtype).copy_(idx)
        return
    bits, blocks = field.low_bits, field.blocks
    counts_dtype, low_dtype = _PARTS[bits]
    start = field._counts_bytes
    counts_out = out[:blocks * counts_dtype.itemsize].view(counts_dtype)
    low_out = out[start:start + count * low_dtype.itemsize].view(low_dtype)
    if idx.device.type == "cpu":
        # NumPy's bincount: ~0.6 ms for 256k indices against torch's ~0.8 here.
        x = idx.contiguous().numpy()
        counts_out.numpy()[:] = np.bincount(x >> bits, minlength=blocks)
        # int16 takes 32768..65535 as their two's complement; decode masks them back.
        low_out.numpy()[:] = (x & ((1 << bits) - 1)).astype(low_out.numpy().dtype)
        return
    # Not torch.bincount: on a GPU it reads the largest value back to the host (a sync
    # per layer); the blocks are known, and integer adds are exact in any order.
    per_block = torch.zeros(blocks, dtype=torch.int64, device=idx.device)
    counts_out.copy_(per_block.index_add_(0, idx >> bits, torch.ones_like(idx)))
    low_out.copy_(idx & ((1 << bits) - 1))


def decode(field: IndexField, data: torch.Tensor, count: int,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """The ``count`` ascending indices that ``encode`` wrote into ``data``: int64, or
    written into ``out`` (``count`` int32 or int64 entries on data's device; int32 holds
    any index of a layer under 2^31 entries, and halves the bytes the decoding writes)."""
    if out is not None and (out.numel() != count or out.dtype not in (torch.int32, torch.int64)):
        raise ValueError(f"out must hold {count} int32 or int64 indices, got "
                         f"{out.numel()} {out.dtype}")
    if not field.low_bits:
        raw = data[:count * field.raw_dtype.itemsize].view(field.raw_dtype)
        return raw.to(torch.int64) if out is None else out.copy_(raw)
    bits, blocks = field.low_bits, field.blocks
    counts_dtype, low_dtype = _PARTS[bits]
    per_block = data[:blocks * counts_dtype.itemsize].view(counts_dtype)
    start = field._counts_bytes
    low = data[start:start + count * low_dtype.itemsize].view(low_dtype)
    mask = (1 << bits) - 1
    if data.device.type == "cpu":
        # np.repeat: 0.2 ms for 256k indices from 10k blocks, torch's repeat_interleave 2 ms
        counts = per_block.numpy()
        if int(counts.sum()) != count:
            raise ValueError(f"the block counts add up to {int(counts.sum())}, not {count}")
        result = torch.empty(count, dtype=torch.int64) if out is None else out
        o = result.numpy()
        o[:] = low.numpy()                # int16 lows sign-extend: the mask takes them back
        o &= mask
        o += np.repeat(np.arange(blocks, dtype=o.dtype) << bits, counts)
        return result
    starts = torch.arange(blocks, dtype=torch.int64, device=data.device) << bits
    high = repeat_by_counts(starts, per_block.to(torch.int64), count)
    decoded = high + (low.to(torch.int64) & mask)
    return decoded if out is None else out.copy_(decoded)
