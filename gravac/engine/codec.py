"""Transport format of one step's sparse layers: one uint8 buffer per rank.

Sparse layers travel by an allgather, and in one collective for all layers rather than
one per layer, so ``SparseCodec.pack`` takes every sparse layer of the step and packs
them into a single byte buffer; ``aggregate`` takes the concatenation of all ranks'
buffers (what ``Comm.allgather_bytes`` returns) and gives the averaged dense gradients.
Plain tensor code: no transport is imported here.

Chunk layout (one per rank; every section starts at a multiple of 8 bytes)::

    int64[4 + L] header: MAGIC, chunk bytes, wire dtype code, L, count of each layer
    values       total values, in the wire dtype (the layers' common dtype)
    indices      total indices, int32 (int64 when a layer has 2**31 elements or more)

Counts may differ per rank (DGC, RedSync), so chunks are self-describing and the
gathered buffer is parsed chunk by chunk. Every rank must pack the same layers in the
same order (the optimizer guarantees it: the set follows agreed decisions).
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

MAGIC = 0x6772617661630001  # "gravac" + format version 1
_WIRE_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
_HEADER_FIELDS = 4


class SparseLayer(NamedTuple):
    """A layer taking part in the sparse allgather: its flat size and dtype."""

    name: str
    numel: int
    dtype: torch.dtype


class PackContext(NamedTuple):
    layers: tuple[SparseLayer, ...]
    wire_dtype: torch.dtype
    index_dtype: torch.dtype
    device: torch.device


def _pad8(nbytes: int) -> int:
    return (nbytes + 7) // 8 * 8


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1).view(torch.uint8)


class SparseCodec:
    """Packs (values, indices) of all sparse layers of a step into one uint8 buffer.

    Example::

        codec = SparseCodec(layers)                        # layers: [SparseLayer, ...]
        buffer, ctx = codec.pack([(values, indices), ...])
        gathered = comm.allgather_bytes(buffer, name="gravac.sparse")
        flat = codec.aggregate(gathered, ctx, world_size=comm.size)
        grads = codec.split(flat, ctx)                     # one flat dense tensor per layer
    """

    def __init__(self, layers: Sequence[SparseLayer], device: torch.device | str = "cpu"):
        self.layers = tuple(layers)
        dtypes = {layer.dtype for layer in self.layers}
        self.wire_dtype = dtypes.pop() if len(dtypes) == 1 else torch.float32
        if self.wire_dtype not in _WIRE_DTYPES:
            raise ValueError(f"sparse layers must be floating point, got {self.wire_dtype}")
        big = any(layer.numel >= 2**31 for layer in self.layers)
        self.index_dtype = torch.int64 if big else torch.int32
        self.device = torch.device(device)
        offsets = [0]
        for layer in self.layers:
            offsets.append(offsets[-1] + layer.numel)
        self.offsets = offsets
        self.total_numel = offsets[-1]
        self._offsets_tensor = torch.tensor(offsets[:-1], dtype=torch.int64, device=self.device)

    # -- packing ------------------------------------------------------------------------
    def pack(self, selections: Sequence[tuple[torch.Tensor, torch.Tensor]]):
        """Pack one (values, indices) pair per layer (in ``self.layers`` order)."""
        if len(selections) != len(self.layers):
            raise ValueError(f"expected {len(self.layers)} (values, indices) pairs, got {len(selections)}")
        counts = [int(idx.numel()) for _, idx in selections]
        total = sum(counts)
        wire_size = torch.tensor([], dtype=self.wire_dtype).element_size()
        index_size = torch.tensor([], dtype=self.index_dtype).element_size()
        header_bytes = 8 * (_HEADER_FIELDS + len(self.layers))
        values_bytes = _pad8(total * wire_size)
        index_bytes = _pad8(total * index_size)
        chunk_bytes = header_bytes + values_bytes + index_bytes
        header = torch.tensor([MAGIC, chunk_bytes, _WIRE_DTYPES.index(self.wire_dtype),
                               len(self.layers), *counts], dtype=torch.int64)
        buffer = torch.empty(chunk_bytes, dtype=torch.uint8, device=self.device)
        buffer[:header_bytes].copy_(_as_bytes(header))
        if total:
            values = torch.cat([v.reshape(-1).to(self.wire_dtype) for v, _ in selections])
            indices = torch.cat([i.reshape(-1).to(self.index_dtype) for _, i in selections])
            buffer[header_bytes:header_bytes + total * wire_size].copy_(_as_bytes(values))
            start = header_bytes + values_bytes
            buffer[start:start + total * index_size].copy_(_as_bytes(indices))
        ctx = PackContext(self.layers, self.wire_dtype, self.index_dtype, self.device)
        return buffer, ctx

    # -- unpacking ----------------------------------------------------------------------
    def unpack(self, gathered: torch.Tensor, ctx: PackContext):
        """Yield (counts, values, indices) of each rank's chunk, in rank order."""
        if gathered.dtype != torch.uint8 or gathered.dim() != 1:
            raise ValueError("gathered buffer must be a 1-D uint8 tensor")
        wire_size = torch.tensor([], dtype=ctx.wire_dtype).element_size()
        index_size = torch.tensor([], dtype=ctx.index_dtype).element_size()
        n_layers = len(ctx.layers)
        header_bytes = 8 * (_HEADER_FIELDS + n_layers)
        pos, end = 0, gathered.numel()
        while pos < end:
            header = gathered[pos:pos + header_bytes].cpu().view(torch.int64).tolist()
            magic, chunk_bytes, dtype_code, layers_in_chunk = header[:_HEADER_FIELDS]
            if magic != MAGIC or layers_in_chunk != n_layers or _WIRE_DTYPES[dtype_code] != ctx.wire_dtype:
                raise RuntimeError(
                    f"corrupt or mismatched sparse buffer at byte {pos}: ranks packed different "
                    f"layer sets (got {layers_in_chunk} layers, expected {n_layers}) or formats")
            counts = header[_HEADER_FIELDS:]
            total = sum(counts)
            start = pos + header_bytes
            values = gathered[start:start + total * wire_size].view(ctx.wire_dtype)
            start = pos + header_bytes + _pad8(total * wire_size)
            indices = gathered[start:start + total * index_size].view(ctx.index_dtype)
            yield counts, values, indices
            pos += chunk_bytes

    def aggregate(self, gathered: torch.Tensor, ctx: PackContext, world_size: int,
                   accumulate_dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Sum every rank's values into one flat buffer over all layers, divide by ranks.

        Duplicate indices (different ranks picking the same entry) are summed. Returns a
        flat tensor of ``self.total_numel`` elements; ``split`` cuts it per layer.
        """
        out = torch.zeros(self.total_numel, dtype=accumulate_dtype, device=ctx.device)
        all_values, all_indices = [], []
        chunks = 0
        for counts, values, indices in self.unpack(gathered, ctx):
            chunks += 1
            counts_t = torch.tensor(counts, dtype=torch.int64, device=ctx.device)
            layer_offset = torch.repeat_interleave(self._offsets_tensor, counts_t)
            all_indices.append(indices.to(torch.int64) + layer_offset)
            all_values.append(values.to(accumulate_dtype))
        if chunks != world_size:
            raise RuntimeError(f"sparse allgather returned {chunks} chunks for {world_size} ranks")
        if all_indices:
            out.index_add_(0, torch.cat(all_indices), torch.cat(all_values))
        return out.div_(world_size)

    def split(self, flat: torch.Tensor, ctx: PackContext) -> list[torch.Tensor]:
        """Views of ``flat`` for each layer, in order."""
        return [flat[self.offsets[i]:self.offsets[i + 1]] for i in range(len(ctx.layers))]
