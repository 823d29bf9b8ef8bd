"""Exchanges: how a step's selected values and dense layers travel between ranks.

An exchange gets, per step, the sparse payload (per layer: values and flat indices this
rank sends) and the layers that go dense, starts the collectives; after ``wait()``,
``unpack()`` writes the averaged gradients into the parameters' ``.grad``. It issues a
constant number of collectives per step, whatever the number of layers, in the same order
on every rank.

``AllgatherExchange`` (the paper's): ONE allgather of all sparse layers packed into one
byte buffer (``SparseCodec``; with ``index_coding`` its indices in coded fields, the
``allgather_coded`` exchange), ONE grouped allreduce per dense dtype. The hierarchical,
shared-index and low-rank steps build on it.

Example::

    exchange = AllgatherExchange(comm, prefix="gravac")
    pending = exchange.start(exchange.pack([(layer, values, indices), ...]), dense=[layer, ...])
    pending.wait()                      # the communication
    pending.unpack()                    # grads written; pending.bytes_sent: this rank's bytes
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..comm import Comm
from ..memory import ResidualMemory
from .codec import SparseCodec, SparseLayer
from .layers import Layer
from .selection import flagged_ranks

#: How sparse layers travel between ranks (docs/ALGORITHM.md §13, §14).
EXCHANGES = ("allgather", "allgather_coded", "hierarchical", "shared_index")
#: The exchanges that are the paper's allgather (``allgather_coded``: with its indices in
#: coded fields, ``SparseCodec(index_coding=True)``); they take every compressor and overlap.
ALLGATHER_EXCHANGES = ("allgather", "allgather_coded")


def check_exchange(exchange: str, compressor) -> str:
    """``exchange`` if it is one of ``EXCHANGES`` and applies to ``compressor``."""
    if exchange not in EXCHANGES:
        raise ValueError(f"exchange must be one of {', '.join(EXCHANGES)}, got {exchange!r}")
    if exchange not in ALLGATHER_EXCHANGES and (compressor.is_dense or compressor.is_lowrank):
        what = "everything" if compressor.is_dense else "low-rank factors"
        raise ValueError(f"exchange={exchange!r} moves sparse selections; compressor "
                         f"{compressor.name!r} sends {what} by allreduce already: use "
                         f"exchange='allgather' (the default)")
    return exchange


#: How dense layers travel: as they are, or cast to fp16 (Horovod's Compression.fp16).
DENSE_WIRE = ("native", "fp16")


class PendingExchange:
    """Collectives in flight; ``wait()`` then ``unpack()`` writes the averaged gradients."""

    def __init__(self, exchange, sparse_layers, codec, ctx, gather, reductions, nbytes,
                 flags=None, same_size=False):
        self._exchange = exchange
        self._sparse_layers, self._codec, self._ctx = sparse_layers, codec, ctx
        self._gather, self._reductions = gather, reductions
        self.bytes_sent = nbytes
        self._flags = flags
        self._same_size = same_size

    @property
    def carries_flags(self) -> bool:
        """Whether the NaN/Inf flags given to ``start`` ride in a dense group."""
        return self._flags is not None

    def flagged_ranks(self) -> list[int]:
        """After ``wait()``: the ranks whose flag was set (``carries_flags`` only)."""
        return flagged_ranks(self._flags)

    def wait(self) -> None:
        """Wait for every collective of the step (the communication phase)."""
        self._gathered = self._gather.wait() if self._gather is not None else None
        for handle, _, _ in self._reductions:
            handle.wait()

    def unpack(self) -> None:
        """Write the averaged gradients: dense wire copies back, sparse values summed."""
        for _, layers, wire in self._reductions:
            for layer, averaged in zip(layers, wire):
                if averaged is not layer.param.grad:
                    layer.param.grad.copy_(averaged)
        if self._gathered is None:
            return
        # Equal chunks (same_size): their headers reach the host in one copy, not one per rank.
        self._codec.aggregate_into(self._gathered, self._ctx, self._exchange.comm.size,
                                   [layer.param.grad.view(-1) for layer in self._sparse_layers],
                                   same_size=self._same_size)


class AllgatherExchange:
    """Sparse layers by one fused allgather, dense layers by grouped allreduces (average)."""

    def __init__(self, comm: Comm, prefix: str = "gravac", dense_wire: str = "native",
                 index_coding: bool = False):
        if dense_wire not in DENSE_WIRE:
            raise ValueError(f"dense_wire must be one of {', '.join(DENSE_WIRE)}, got {dense_wire!r}")
        self.comm, self.prefix, self.dense_wire = comm, prefix, dense_wire
        self.index_coding = bool(index_coding)
        self._codecs: dict[tuple[str, ...], SparseCodec] = {}

    def _codec(self, layers: Sequence[Layer]) -> SparseCodec:
        # The wire buffer is made on the gradients' device (a GPU's for nccl, or Horovod
        # built with NCCL); keyed by it too, should the model move.
        device = layers[0].param.device
        key = (tuple(l.name for l in layers), device)
        codec = self._codecs.get(key)
        if codec is None:
            specs = [SparseLayer(l.name, l.numel, ResidualMemory.dtype_for(l.param.grad.dtype))
                     for l in layers]
            codec = SparseCodec(specs, device=device, index_coding=self.index_coding)
            self._codecs[key] = codec
        return codec

    def pack(self, sparse: Sequence[tuple[Layer, torch.Tensor, torch.Tensor]]):
        """The byte buffer of this rank's sparse values (None when nothing is sparse)."""
        if not sparse:
            return None
        codec = self._codec([layer for layer, _, _ in sparse])
        buffer, ctx = codec.pack([(values, indices) for _, values, indices in sparse])
        return [layer for layer, _, _ in sparse], codec, ctx, buffer

    def start(self, packed, dense: Sequence[Layer], tag: str = "",
              same_size: bool = False, flags: torch.Tensor | None = None) -> PendingExchange:
        """Start the allgather of ``packed`` (from ``pack``) and the dense reductions.
        ``tag`` ends the collectives' names: exchanges in flight at once (the buckets of
        an overlapped step) need different ones. ``same_size``: every rank packed the same
        number of values per layer (an exact-count compressor), so the buffers' sizes are
        equal and need not be exchanged first.

        ``flags``: this rank's NaN/Inf flags (``StepEngine.flags``, a one-hot vector).
        They ride in the first floating-point dense group as one more tensor of its
        dtype, averaged with it (a flagged rank's entry arrives as 1/N), so they need no
        collective of their own, nor, under Horovod, a background cycle of their own
        after the last bucket. ``PendingExchange.carries_flags`` says whether a group
        took them (the same on every rank: the dense layers and dtypes are); if none
        could, the caller agrees them itself."""
        gather = sparse_layers = codec = ctx = None
        nbytes = 0
        if packed is not None:
            sparse_layers, codec, ctx, buffer = packed
            gather = self.comm.allgather_bytes_async(buffer, name=f"{self.prefix}.sparse{tag}",
                                                     same_size=same_size)
            nbytes += buffer.numel()
        reductions, carried = [], None
        # One grouped allreduce per dtype (fp32 and fp64 cannot share a fused buffer), in a
        # fixed order so that every rank issues the same ones.
        by_dtype: dict[torch.dtype, list[Layer]] = {}
        for layer in sorted(dense, key=lambda l: l.index):
            by_dtype.setdefault(layer.param.grad.dtype, []).append(layer)
        for dtype in sorted(by_dtype, key=str):
            layers = by_dtype[dtype]
            if self.dense_wire == "fp16" and dtype.is_floating_point:
                wire = [l.param.grad.to(torch.float16) for l in layers]
            else:
                wire = [l.param.grad for l in layers]
            group = wire
            if flags is not None and carried is None and dtype.is_floating_point:
                carried = flags.to(device=wire[0].device, dtype=wire[0].dtype)
                group = [*wire, carried]
            name = f"{self.prefix}.dense{tag}" + ("" if len(by_dtype) == 1 else f".{dtype}")
            handle = self.comm.grouped_allreduce_async_(group, op="average", name=name)
            reductions.append((handle, layers, wire))
            nbytes += sum(w.numel() * w.element_size() for w in wire)
        return PendingExchange(self, sparse_layers, codec, ctx, gather, reductions, nbytes,
                               carried, same_size=same_size)
