"""The shared-index exchange: every rank sends its values at ONE index set, by allreduce.

The values are averaged by a ring allreduce whose traffic per rank does not grow with the
number of ranks (docs/ALGORITHM.md §13). The index set is ScaleCom's cyclic local top-k,
rotated per layer: layer i's leader at step s is (base_i + s) mod N, the bases spread
over the ranks by size (``shard_layers``), so every rank leads every layer once in N steps
and the selection the others wait for is split over the ranks. ``select``: each rank
selects both levels of the layers it leads (the configured compressor), ONE allreduce
(sum) of a byte buffer gives every rank every leader's indices (ascending, in coded
fields of ~1-2 bytes: ``index_codec.py``; its layout follows from the plan and
``count_bounds``, so no round learns sizes; Random-k with a shared seed skips it), and
each rank takes its own values there. ``start``: ONE grouped allreduce (average) of the
values sent, beside the dense layers'. The gradient is the averaged values at the shared
indices, zero elsewhere; each rank's residual is its g_ef − its own values sent.

Example::

    opt = wrap_optimizer(sgd, model.named_parameters(), comm, exchange="shared_index")
"""
from __future__ import annotations

import torch

from ...util.sizes import num_kept
from .. import index_codec
from ..layers import Layer
from ..phases import PhaseClock
from ..selection import Selection, select_levels
from .base import Exchange, Pending, SentLayer


def shard_layers(layers, shards: int) -> list[int]:
    """The shard (0 .. shards−1) of each layer: largest first onto the lightest shard, so
    the shards' element counts are balanced; the same answer on every rank."""
    owner = [0] * len(layers)
    load = [0] * shards
    for i in sorted(range(len(layers)), key=lambda i: (-layers[i].numel, i)):
        j = min(range(shards), key=lambda j: (load[j], j))
        owner[i] = j
        load[j] += layers[i].numel
    return owner


class SharedIndexExchange(Exchange):
    """Values at each layer's leader's indices, averaged by allreduce (see the module)."""

    kind = "shared_index"

    def __init__(self, comm, prefix, dense_wire, compressor, host_of_rank=None):
        super().__init__(comm, prefix, dense_wire, compressor)
        self._base_size = None

    def describe(self) -> dict:
        return {"kind": self.kind, "index_set": "cyclic_local_topk_per_layer"}

    def leaders(self, layers: list[Layer], step: int) -> dict[str, int]:
        """The rank whose selection every rank sends, per layer of ``layers`` (every
        compressible layer: a layer's place does not move whatever the plan sends), at
        ``step``."""
        size = self.comm.size
        if self._base_size != size:        # first step, or an elastic reset
            # Spread by size (selection costs about linearly in it) as the hierarchical
            # exchange spreads its shards; the rotation keeps the spread.
            self._base = dict(zip((l.name for l in layers), shard_layers(layers, size)))
            self._base_size = size
        return {name: (base + step) % size for name, base in self._base.items()}

    def begin(self, layers, clock: PhaseClock) -> None:
        self._compressible = [l for l in layers if l.compressible]

    def select(self, fed, step: int, clock: PhaseClock):
        rank = self.comm.rank
        if self.compressor.shared_selection:
            # Same draws everywhere: each rank makes the leader's selection itself.
            chosen = select_levels(self.compressor, fed, step, rank)
            index_sets, nbytes = [(s.idx_min, s.idx_c) for s in chosen], 0
        else:
            index_sets, nbytes = self._index_sets(fed, step, clock)
        selections = []
        for (layer, g_ef, _, _), (idx_min, idx_c) in zip(fed, index_sets):
            sel = Selection(layer, g_ef, idx_min, g_ef.index_select(0, idx_min))
            if idx_c is not None:
                sel.idx_c, sel.val_c = idx_c, g_ef.index_select(0, idx_c)
            selections.append(sel)
        clock.lap("t_select")
        return selections, nbytes

    def settle(self, memory, selections: list[Selection], level: str) -> list[SentLayer]:
        sent = super().settle(memory, selections, level)
        for s in sent:
            s.index_floats = 0      # the indices travel once, from the leader
        return sent

    def start(self, sent: list[SentLayer], dense: list[Layer], tag: str = "",
              flags: torch.Tensor | None = None, same_size: bool = False) -> Pending:
        def scatter():
            for s in sent:
                grad = s.layer.param.grad.view(-1)
                grad.zero_()
                grad.index_copy_(0, s.idx, s.val.to(grad.dtype))
        # The values are copies: the allreduce averages them in place.
        return self.average_values("shared", sent, dense, tag, flags, scatter)

    def _index_sets(self, fed, step: int, clock: PhaseClock):
        """[(idx_min, idx_c or None)] per fed layer: its leader's selection, on every
        rank; and the bytes this rank sent for them."""
        rank = self.comm.rank
        leaders = self.leaders(self._compressible, step)
        # The byte buffer: the counts of each level per layer (int32), then per layer a
        # field per level as large as the compressor may need (count_bounds), its indices
        # ascending in fewer bytes than int32 (index_codec.py), zeros where unused.
        fields = []
        for layer, _, cf, cf_c in fed:
            high_min = self.compressor.count_bounds(num_kept(layer.numel, cf), layer.numel)[1]
            high_c = self.compressor.count_bounds(num_kept(layer.numel, cf_c),
                                                  high_min)[1] if cf_c is not None else 0
            fields.append((index_codec.plan(layer.numel, high_min),
                           index_codec.plan(layer.numel, high_c) if cf_c is not None else None))
        n_layers = len(fed)
        starts, total = [], 8 * n_layers                 # the header: 2 int32 per layer
        for field_min, field_c in fields:
            starts.append(total)
            total += field_min.nbytes + (field_c.nbytes if field_c else 0)
        device = fed[0][1].device if fed else torch.device("cpu")
        buf = torch.zeros(total, dtype=torch.uint8, device=device)
        mine = [i for i, (layer, _, _, _) in enumerate(fed) if leaders[layer.name] == rank]
        if mine:
            # Both levels of every layer this rank leads, in one select_levels.
            chosen = select_levels(self.compressor, [fed[i] for i in mine], step, rank)
            # The counts are known on the host: written into the buffer with one copy at
            # the end (an element written at a time is a host-to-device copy each on a GPU).
            counts = [0] * (2 * n_layers)
            for i, sel in zip(mine, chosen):
                field_min, field_c = fields[i]
                pos = starts[i]
                counts[i] = sel.idx_min.numel()
                index_codec.encode(field_min, index_codec.ascending(sel.idx_min),
                                   buf[pos:pos + field_min.nbytes])
                if sel.idx_c is not None:
                    pos += field_min.nbytes
                    counts[n_layers + i] = sel.idx_c.numel()
                    index_codec.encode(field_c, index_codec.ascending(sel.idx_c),
                                       buf[pos:pos + field_c.nbytes])
            buf[:8 * n_layers].view(torch.int32).copy_(torch.tensor(counts, dtype=torch.int32))
        clock.lap("t_select", sync=True)
        if total:
            # Summed as int32 (both transports reduce it; one rank wrote each byte, the
            # others zeros, so the sum is that rank's bytes exactly).
            buf = self.comm.allreduce(buf.view(torch.int32), op="sum",
                                      name=f"{self.prefix}.indices").view(torch.uint8)
        clock.lap("t_wait_select", sync=True)
        counts = buf[:8 * n_layers].view(torch.int32).tolist()
        out = []
        for i, ((field_min, field_c), pos) in enumerate(zip(fields, starts)):
            idx_min = index_codec.decode(field_min, buf[pos:pos + field_min.nbytes], counts[i])
            idx_c = None
            if field_c is not None:
                pos += field_min.nbytes
                idx_c = index_codec.decode(field_c, buf[pos:pos + field_c.nbytes],
                                           counts[n_layers + i])
            out.append((idx_min, idx_c))
        return out, total
