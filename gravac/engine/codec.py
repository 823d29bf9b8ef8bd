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
        codec.aggregate_into(gathered, ctx, comm.size, [g.view(-1) for g in grads])
        # or, into a new flat buffer of all layers:
        flat = codec.aggregate(gathered, ctx, world_size=comm.size)
        parts = codec.split(flat, ctx)                     # one flat tensor per layer
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
        self.aggregate_into(gathered, ctx, world_size, self.split(out, ctx))
        return out

    def aggregate_into(self, gathered: torch.Tensor, ctx: PackContext, world_size: int,
                       outs: Sequence[torch.Tensor]) -> None:
        """Write each layer's average over ranks into ``outs`` (one flat tensor per layer,
        e.g. the gradients' views; overwritten).

        Values are summed in the output's dtype when it is float32 or float64 (an entry
        picked by several ranks is summed, then divided), in float32 for fp16/bf16
        outputs. Only the entries some rank sent are divided: the others are zero. No
        buffer of the whole model is allocated or passed over more than once (zeroing).
        """
        if len(outs) != len(self.layers):
            raise ValueError(f"expected {len(self.layers)} output tensors, got {len(outs)}")
        per_layer: list[tuple[list, list]] = [([], []) for _ in self.layers]
        chunks = 0
        for counts, values, indices in self.unpack(gathered, ctx):
            chunks += 1
            for (vals, idxs), v, i in zip(per_layer, values.split(counts), indices.split(counts)):
                vals.append(v)
                idxs.append(i)
        if chunks != world_size:
            raise RuntimeError(f"sparse allgather returned {chunks} chunks for {world_size} ranks")
        for out, (vals, idxs) in zip(outs, per_layer):
            exact = out.dtype in (torch.float32, torch.float64)
            acc = out if exact else torch.zeros(out.numel(), dtype=torch.float32, device=out.device)
            if exact:
                acc.zero_()
            # int32 wire indices serve index_add_ and index_select as they are.
            index = torch.cat(idxs) if len(idxs) > 1 else idxs[0]
            if index.numel():
                acc.index_add_(0, index, torch.cat(vals).to(acc.dtype))
                if world_size > 1:
                    _divide_sent(acc, index, world_size)
            if not exact:
                out.copy_(acc)

    def split(self, flat: torch.Tensor, ctx: PackContext) -> list[torch.Tensor]:
        """Views of ``flat`` for each layer, in order."""
        return [flat[self.offsets[i]:self.offsets[i + 1]] for i in range(len(ctx.layers))]


def _divide_sent(acc: torch.Tensor, index: torch.Tensor, world_size: int) -> None:
    """Divide the entries of ``acc`` at ``index`` by ``world_size`` (the others are zero).

    Either way each sent entry is divided once (duplicates write the same quotient) and
    the zeros stay zeros, so the two paths give the same bits. A streaming pass over the
    whole layer costs ~0.2 ns an entry on CPU, gathering and scattering ~8 ns an index:
    the whole layer is divided once the indices are more than 1/32 of it.
    """
    if acc.numel() <= 32 * index.numel():
        acc.div_(world_size)
    else:
        index = index.to(torch.int64)    # index_copy_ takes int64 only
        acc.index_copy_(0, index, acc.index_select(0, index).div_(world_size))
