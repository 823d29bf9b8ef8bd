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

With ``index_coding`` (the ``allgather_coded`` exchange, docs/ALGORITHM.md §14) the
indices section holds one ``index_codec`` field per layer instead of int32s: the layer's
indices ascending as block counts and low bits, about 1.1-2 bytes an index instead of 4,
each field sized by ``index_codec.plan(numel, count)`` from the header's counts (so a
receiver finds every field without more header), and the values in that same order. Such
a chunk starts with ``MAGIC_CODED``.

The sizes (header, padding, index dtype, fields) are ``sizes.py``'s, which the cost model
(``benchmarks/scaling/``) prices a step with: ``sizes.sparse_chunk_bytes`` is the length
of the buffer ``pack`` returns.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np
import torch

from . import index_codec
from ..util.sizes import CHUNK_HEADER_FIELDS as _HEADER_FIELDS
from ..util.sizes import chunk_header_bytes, pad8, plain_index_bytes
from ..util.segments import shift_by_segment

MAGIC = 0x6772617661630001  # "gravac" + format version 1
MAGIC_CODED = 0x6772617661630002  # version 2: coded index fields (``index_coding``)
_WIRE_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
#: bytes of an index (``sizes.plain_index_bytes``) -> its dtype in a plain chunk
_INDEX_DTYPES = {4: torch.int32, 8: torch.int64}


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
    index_coding: bool = False


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

    def __init__(self, layers: Sequence[SparseLayer], device: torch.device | str = "cpu",
                 index_coding: bool = False):
        self.index_coding = bool(index_coding)
        self.layers = tuple(layers)
        dtypes = {layer.dtype for layer in self.layers}
        self.wire_dtype = dtypes.pop() if len(dtypes) == 1 else torch.float32
        if self.wire_dtype not in _WIRE_DTYPES:
            raise ValueError(f"sparse layers must be floating point, got {self.wire_dtype}")
        self.index_dtype = _INDEX_DTYPES[plain_index_bytes([l.numel for l in self.layers])]
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
        # sizes.chunk_layout's sections (the coded fields are planned here once, since
        # encoding needs them too).
        header_bytes = chunk_header_bytes(len(self.layers))
        values_bytes = pad8(total * wire_size)
        if self.index_coding:
            fields = self._fields(counts)
            selections = [_ascending_pair(v, i) for v, i in selections]
            index_bytes = sum(f.nbytes for f in fields)
        else:
            index_bytes = pad8(total * index_size)
        chunk_bytes = header_bytes + values_bytes + index_bytes
        magic = MAGIC_CODED if self.index_coding else MAGIC
        header = torch.tensor([magic, chunk_bytes, _WIRE_DTYPES.index(self.wire_dtype),
                               len(self.layers), *counts], dtype=torch.int64)
        buffer = torch.empty(chunk_bytes, dtype=torch.uint8, device=self.device)
        # The header is made on the host (the counts are host ints); to a GPU it goes
        # without a device sync (a blocking host-to-device copy waits for the stream's
        # queued kernels first; from pageable memory this one is staged at once, so the
        # temporary may go right after).
        buffer[:header_bytes].copy_(_as_bytes(header), non_blocking=True)
        if total:
            # Concatenated first, converted once: a conversion per layer is a launch per
            # layer on a GPU (161 for ResNet-101), and most are no conversion at all.
            values = _cat_as([v for v, _ in selections], self.device, self.wire_dtype)
            buffer[header_bytes:header_bytes + total * wire_size].copy_(_as_bytes(values))
            start = header_bytes + values_bytes
            if self.index_coding:
                section = buffer[start:start + index_bytes]
                section.zero_()          # the fields' padding: the same bytes every time
                for field, (_, idx) in zip(fields, selections):
                    index_codec.encode(field, idx, section[:field.nbytes])
                    section = section[field.nbytes:]
            else:
                indices = _cat_as([i for _, i in selections], self.device, self.index_dtype)
                buffer[start:start + total * index_size].copy_(_as_bytes(indices))
        return buffer, self.context()

    def context(self) -> PackContext:
        """What ``unpack`` needs to read this codec's chunks."""
        return PackContext(self.layers, self.wire_dtype, self.index_dtype, self.device,
                           self.index_coding)

    def _fields(self, counts: Sequence[int]) -> list[index_codec.IndexField]:
        """Each layer's coded index field for ``counts`` indices (``index_coding``)."""
        return [index_codec.plan(layer.numel, c) for layer, c in zip(self.layers, counts)]

    # -- unpacking ----------------------------------------------------------------------
    def unpack(self, gathered: torch.Tensor, ctx: PackContext, chunks: int | None = None):
        """Yield (counts, values, indices) of each rank's chunk, in rank order.

        Each chunk's header is read on the host (its counts say where the next chunk
        starts): on a GPU a device-to-host copy, a sync, per chunk. ``chunks``: the
        number of chunks when the caller knows they all have one size (an exact-count
        compressor: ``same_size``); their headers then come over in one copy."""
        if gathered.dtype != torch.uint8 or gathered.dim() != 1:
            raise ValueError("gathered buffer must be a 1-D uint8 tensor")
        wire_size = torch.tensor([], dtype=ctx.wire_dtype).element_size()
        index_size = torch.tensor([], dtype=ctx.index_dtype).element_size()
        n_layers = len(ctx.layers)
        header_bytes = chunk_header_bytes(n_layers)
        pos, end = 0, gathered.numel()
        headers = _equal_chunk_headers(gathered, header_bytes, chunks)
        while pos < end:
            if headers:
                header = headers.pop(0)
            else:
                header = gathered[pos:pos + header_bytes].cpu().view(torch.int64).tolist()
            magic, chunk_bytes, dtype_code, layers_in_chunk = header[:_HEADER_FIELDS]
            expected = MAGIC_CODED if ctx.index_coding else MAGIC
            if magic != expected or layers_in_chunk != n_layers or chunk_bytes < header_bytes \
                    or not 0 <= dtype_code < len(_WIRE_DTYPES) \
                    or _WIRE_DTYPES[dtype_code] != ctx.wire_dtype:
                raise RuntimeError(
                    f"corrupt or mismatched sparse buffer at byte {pos}: ranks packed different "
                    f"layer sets (got {layers_in_chunk} layers, expected {n_layers}) or formats")
            counts = header[_HEADER_FIELDS:]
            total = sum(counts)
            start = pos + header_bytes
            values = gathered[start:start + total * wire_size].view(ctx.wire_dtype)
            start = pos + header_bytes + pad8(total * wire_size)
            if ctx.index_coding:
                indices = self._decode_fields(gathered, start, counts)
            else:
                indices = gathered[start:start + total * index_size].view(ctx.index_dtype)
            yield counts, values, indices
            pos += chunk_bytes

    def _decode_fields(self, gathered: torch.Tensor, start: int,
                       counts: Sequence[int]) -> torch.Tensor:
        """A coded chunk's indices, every layer's decoded into one tensor of the plain
        format's index dtype (int32 unless a layer has 2^31 entries)."""
        indices = torch.empty(sum(counts), dtype=self.index_dtype, device=gathered.device)
        pos = 0
        for field, count in zip(self._fields(counts), counts):
            index_codec.decode(field, gathered[start:start + field.nbytes], count,
                               out=indices[pos:pos + count])
            start += field.nbytes
            pos += count
        return indices

    def aggregate(self, gathered: torch.Tensor, ctx: PackContext, world_size: int,
                  accumulate_dtype: torch.dtype = torch.float32,
                  same_size: bool = False) -> torch.Tensor:
        """Sum every rank's values into one flat buffer over all layers, divide by ranks.

        Duplicate indices (different ranks picking the same entry) are summed. Returns a
        flat tensor of ``self.total_numel`` elements; ``split`` cuts it per layer.
        """
        out = torch.zeros(self.total_numel, dtype=accumulate_dtype, device=ctx.device)
        self.aggregate_into(gathered, ctx, world_size, self.split(out, ctx), same_size)
        return out

    def aggregate_into(self, gathered: torch.Tensor, ctx: PackContext, world_size: int,
                       outs: Sequence[torch.Tensor], same_size: bool = False) -> None:
        """Write each layer's average over ranks into ``outs`` (one flat tensor per layer,
        e.g. the gradients' views; overwritten). ``same_size``: every rank's chunk has
        one size (``Comm.allgather_bytes``' promise), so the headers are read at once.

        Values are summed in the output's dtype when it is float32 or float64 (an entry
        picked by several ranks is summed, then divided), in float32 for fp16/bf16
        outputs. Only the entries some rank sent are divided: the others are zero. No
        buffer of the whole model is allocated or passed over more than once (zeroing).
        """
        if len(outs) != len(self.layers):
            raise ValueError(f"expected {len(self.layers)} output tensors, got {len(outs)}")
        chunks = list(self.unpack(gathered, ctx, world_size if same_size else None))
        if len(chunks) != world_size:
            raise RuntimeError(f"sparse allgather returned {len(chunks)} chunks for {world_size} ranks")
        if _flat_ok(outs):
            self._aggregate_flat(outs, chunks, world_size)
            return
        per_layer: list[tuple[list, list]] = [([], []) for _ in self.layers]
        for counts, values, indices in chunks:
            for (vals, idxs), v, i in zip(per_layer, values.split(counts), indices.split(counts)):
                vals.append(v)
                idxs.append(i)
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

    def _aggregate_flat(self, outs: Sequence[torch.Tensor], chunks: list[tuple],
                        world_size: int) -> None:
        """``aggregate_into`` for outputs on a GPU: every rank's chunk summed into one flat
        buffer by one ``index_add_`` (each index shifted by its layer's offset: the
        chunks' values and indices are used as they came, not split per layer), divided
        there, and copied into the outputs by one multi-tensor copy: a few launches per
        step instead of two or three per layer (ResNet-101 spent 7 ms a step on an H200
        launching them). The same sums: an entry gets the same values added, in rank
        order as layer by layer."""
        out0 = outs[0]
        flat = torch.zeros(self.total_numel, dtype=out0.dtype, device=out0.device)
        counts = [c for chunk_counts, _, _ in chunks for c in chunk_counts]
        if sum(counts):
            values = torch.cat([v for _, v, _ in chunks]).to(flat.dtype)
            local = torch.cat([i for _, _, i in chunks]).to(torch.int64)
            index = shift_by_segment(local, counts, self.offsets[:len(outs)] * len(chunks))
            flat.index_add_(0, index, values)
            if world_size > 1:
                _divide_sent(flat, index, world_size)
        torch._foreach_copy_(list(outs), [flat[self.offsets[j]:self.offsets[j + 1]]
                                          for j in range(len(outs))])

    def split(self, flat: torch.Tensor, ctx: PackContext) -> list[torch.Tensor]:
        """Views of ``flat`` for each layer, in order."""
        return [flat[self.offsets[i]:self.offsets[i + 1]] for i in range(len(ctx.layers))]


def _ascending_pair(values: torch.Tensor, indices: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) reordered so that the indices ascend (int64), as a coded field
    needs them. The CPU's Top-k selections ascend already (``compressors.base.exact_topk``):
    one check; others are sorted with their values. On a GPU, sorted without a check
    (the check would be a host sync)."""
    if indices.device.type == "cpu":
        a = indices.reshape(-1).to(torch.int64).numpy()
        if index_codec.ascends(a):
            return values, torch.from_numpy(a)
        order = torch.from_numpy(np.argsort(a, kind="stable"))
        return values.reshape(-1).index_select(0, order), torch.from_numpy(a[order.numpy()])
    ordered, order = torch.sort(indices.reshape(-1).to(torch.int64), stable=True)
    return values.reshape(-1).index_select(0, order), ordered


def _cat_as(tensors: Sequence[torch.Tensor], device: torch.device,
            dtype: torch.dtype) -> torch.Tensor:
    """The tensors flattened, concatenated, on ``device`` as ``dtype`` (converted once)."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    return flat if flat.device == device and flat.dtype == dtype else \
        flat.to(device=device, dtype=dtype)


#: The one-buffer unpack pays for zeroing and copying a buffer of every layer: on an H200
#: it took ResNet-101's 161 layers from 4.4-5.1 ms to 1.8, but the LSTM's 10 (51M entries)
#: from 0.4-0.5 ms to 1.3 (docs/notes/2026-11-benchmarks.md §7c). From this many layers on it is taken.
FLAT_MIN_LAYERS = 24


def _flat_ok(outs: Sequence[torch.Tensor]) -> bool:
    """Whether ``aggregate_into`` takes the one-buffer path: at least ``FLAT_MIN_LAYERS``
    outputs on one GPU, all of one dtype that sums exactly (float32 or float64),
    contiguous views (the CPU keeps its per-layer path: no launches to save, and one less
    model-sized buffer)."""
    if len(outs) < FLAT_MIN_LAYERS or outs[0].device.type == "cpu":
        return False
    kind = (outs[0].device, outs[0].dtype)
    return kind[1] in (torch.float32, torch.float64) \
        and all((o.device, o.dtype) == kind and o.is_contiguous() for o in outs)


def _equal_chunk_headers(gathered: torch.Tensor, header_bytes: int,
                         chunks: int | None) -> list[list[int]] | None:
    """The headers of ``chunks`` equal chunks of ``gathered``, read in one copy to the host
    (one device sync on a GPU, not one per chunk); None when the buffer is not that (the
    caller then parses chunk by chunk, which reports what is wrong)."""
    n = gathered.numel()
    if not chunks or n % chunks or not gathered.is_contiguous():
        return None
    size = n // chunks
    if size < header_bytes or size % 8:
        return None
    rows = gathered.view(chunks, size)[:, :header_bytes].cpu().contiguous()
    headers = rows.view(torch.int64).tolist()
    if any(h[1] != size for h in headers):
        return None
    return headers


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
