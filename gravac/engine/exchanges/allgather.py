"""The paper's exchange: every rank receives every other's values and indices.

ONE allgather of all sparse layers of a bucket packed into one byte buffer
(``SparseCodec``), ONE grouped allreduce per dense dtype; after ``wait()``, ``unpack()``
sums every rank's values into the gradients (duplicates added) and divides by the ranks.
``allgather_coded`` is the same with each layer's indices in a coded field of ~1.1-2
bytes instead of 4 (``index_codec.py``, docs/ALGORITHM.md §14).

Example::

    exchange = AllgatherExchange(comm, "gravac", "native", TopK())
    pending = exchange.start([SentLayer(layer, values, indices, k, k)], dense=[bias])
    pending.wait()                      # the communication
    pending.unpack()                    # grads written; pending.bytes_sent: this rank's bytes
"""
from __future__ import annotations

from typing import Sequence

import torch

from ...memory import ResidualMemory
from ..codec import SparseCodec, SparseLayer
from ..layers import Layer
from .base import Exchange, Pending, SentLayer, add_dense


class AllgatherExchange(Exchange):
    """Sparse layers by one fused allgather, dense layers by grouped allreduces (average)."""

    kind = "allgather"
    overlaps = True
    index_coding = False

    def __init__(self, comm, prefix, dense_wire, compressor, host_of_rank=None):
        super().__init__(comm, prefix, dense_wire, compressor)
        self._codecs: dict[tuple, SparseCodec] = {}

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

    def start(self, sent: list[SentLayer], dense: list[Layer], tag: str = "",
              flags: torch.Tensor | None = None, same_size: bool = False) -> Pending:
        """``same_size``: every rank packed the same number of values per layer (an
        exact-count compressor), so the buffers' sizes need not be exchanged first and
        their headers reach the host in one copy. ``tag`` ends the collectives' names:
        buckets in flight at once need different ones."""
        pending = Pending()
        if sent:
            layers = [s.layer for s in sent]
            codec = self._codec(layers)
            buffer, ctx = codec.pack([(s.val, s.idx) for s in sent])
            handle = self.comm.allgather_bytes_async(buffer, name=f"{self.prefix}.sparse{tag}",
                                                     same_size=same_size)
            size = self.comm.size

            def aggregate(gathered):
                codec.aggregate_into(gathered, ctx, size,
                                     [l.param.grad.view(-1) for l in layers], same_size=same_size)
            pending.add(handle, aggregate, buffer.numel())
        add_dense(pending, self.comm, self.prefix, self.dense_wire, dense, tag, flags)
        return pending


class AllgatherCodedExchange(AllgatherExchange):
    """The allgather with each layer's indices in a coded field (opt-in)."""

    kind = "allgather_coded"
    index_coding = True
