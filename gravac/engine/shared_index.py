"""The shared-index exchange: every rank sends its values at ONE index set, by allreduce.

With the allgather exchange a rank receives N − 1 selections, so its traffic grows with
the number of ranks N; here every rank sends values at the same indices, and the values
are averaged by a ring allreduce whose traffic per rank is ≈ 2·(N−1)/N·k values, whatever
N (``../shared/ALGORITHM.md``, "Exchanges"; docs/ALGORITHM.md §13). The index set is
ScaleCom's cyclic local top-k (Chen et al., NeurIPS 2020), rotated per layer: each layer
has a leader, whose own selection of its error-fed gradient is the set everyone sends for
that layer. ScaleCom gives every layer the same leader, rank s mod N at step s; here the
layers are first spread over the ranks by size (``hierarchical.shard_layers``: the
largest first, each to the least-loaded rank) and layer i's leader at step s is
(base_i + s) mod N. Every rank still leads every layer once in N steps, and the selection
the others wait for is split over the ranks instead of done by one (docs/ALGORITHM.md
§13). Per step, on every rank:

1. error feedback: g_ef = grad + residual (every rank keeps its own residual);
2. each rank runs both levels' selection on its g_ef for the layers it leads (the
   compressor as configured, so DGC's and RedSync's thresholds work too); ONE allreduce
   (sum) of a byte buffer tells every rank every leader's indices (each rank writes its
   layers' fields, zeros elsewhere: a broadcast whose traffic does not grow with N). A
   field holds a layer's indices ascending in ~1-2 bytes each (``index_codec.py``). The
   layout is fixed by the plan and the compressor's ``count_bounds``, so no round is
   needed to learn sizes. Random-k with a shared seed
   draws the same indices on every rank and skips this round;
3. each rank takes its own values at the shared indices, for both levels; the gains are
   measured on them and agreed as always (one tiny allreduce, the NaN/Inf flags in it),
   so GraVAC's decision is the same on every rank;
4. ONE grouped allreduce (average) of the values of the level sent, all layers together,
   and the dense layers' grouped allreduce;
5. the gradient is the averaged values at the shared indices, zero elsewhere; each rank's
   residual = its g_ef − what it sent (its own values at the shared indices).

Example::

    engine = StepEngine(layers, TopK(), Static(cf=100), comm, exchange="shared_index")
    stats = engine.synchronize(step=0, lr_decayed=False, t_compute=None)
"""
from __future__ import annotations

import torch

from ..compressors import num_kept
from ..controllers import SENT_DENSE
from . import index_codec
from .hierarchical import shard_layers
from .phases import PhaseClock
from .selection import Selection, apply_decision


class SharedIndexStep:
    """The step of ``StepEngine`` with ``exchange="shared_index"`` (see the module doc)."""

    kind = "shared_index"

    def __init__(self, engine):
        self.engine = engine

    def bind(self, comm) -> None:
        """Nothing to build: the leaders follow from the step and the group's size."""

    def describe(self) -> dict:
        return {"kind": self.kind, "index_set": "cyclic_local_topk_per_layer"}

    def leaders(self, step: int) -> dict[str, int]:
        """The rank whose selection every rank sends, per compressed layer, at ``step``."""
        size = self.engine.comm.size
        if getattr(self, "_base_size", None) != size:      # first step, or an elastic reset
            # Spread by size (selection costs about linearly in it) as the hierarchical
            # exchange spreads its shards; the rotation keeps the spread. Every compressible
            # layer counts, whatever the plan sends dense: a layer's place does not move.
            layers = [l for l in self.engine.layers if l.compressible]
            self._base = dict(zip((l.name for l in layers), shard_layers(layers, size)))
            self._base_size = size
        return {name: (base + step) % size for name, base in self._base.items()}

    # -- the step -------------------------------------------------------------------------
    def synchronize(self, plan, step: int, clock: PhaseClock, t_compute,
                    local_bad: bool | None):
        e = self.engine
        dense = [l for l in e.layers if not l.compressible]
        fed = []                               # (layer, g_ef, cf) of the compressed layers
        for layer in e.layers:
            if not layer.compressible:
                continue
            cf = plan.cf_of(layer.name)
            if cf <= 1:
                e.memory.flush_into(layer.name, layer.param.grad)
                dense.append(layer)
            else:
                fed.append((layer, e.memory.compensate(layer.name, layer.param.grad), cf))
        clock.lap("t_feedback")
        with_candidate = [plan.theta_c is not None and plan.theta_c > cf for _, _, cf in fed]
        index_sets = self._index_sets(fed, with_candidate, plan.theta_c, step, clock)
        selections = []
        for (layer, g_ef, _), (idx_min, idx_c) in zip(fed, index_sets):
            sel = Selection(layer, g_ef, idx_min, g_ef.index_select(0, idx_min))
            if idx_c is not None:
                sel.idx_c, sel.val_c = idx_c, g_ef.index_select(0, idx_c)
            selections.append(sel)
        clock.lap("t_select")

        d = e.decide(plan, selections, clock, local_bad)
        if d.bad_ranks:
            return e.skip(step, d.bad_ranks, clock, t_compute)
        sent, gain_min, gain_c, local_bad = d.sent, d.gain_min, d.gain_c, d.local_bad
        t_discarded = 0.0
        if sent == SENT_DENSE and selections:
            t_discarded = sum(clock.times[p] for p in ("t_select", "t_norms", "t_wait_gains",
                                                       "t_wait_exchange"))
        # (layer, values, indices); the values are copies, which the allreduce averages in place
        payload = apply_decision(e.memory, selections, sent)
        if sent == SENT_DENSE:
            dense.extend(s.layer for s in selections)
        clock.lap("t_residual")
        # One grouped allreduce per values dtype (fp32 and fp64 cannot share a buffer).
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for _, v, _ in payload:
            by_dtype.setdefault(v.dtype, []).append(v)
        values = [e.comm.grouped_allreduce_async_(
            by_dtype[d], op="average",
            name=f"{e.prefix}.shared" + ("" if len(by_dtype) == 1 else f".{d}"))
            for d in sorted(by_dtype, key=str)]
        pending = e.exchange.start(None, dense)
        flags = e.start_flags(local_bad)
        for handle in values:
            handle.wait()
        pending.wait()
        bad = e.finish_flags(flags)
        clock.lap("t_wait_exchange", sync=True)
        if bad:
            e.memory.rollback_step()
            return e.skip(step, bad, clock, t_compute)
        pending.unpack()
        for layer, val, idx in payload:
            grad = layer.param.grad.view(-1)
            grad.zero_()
            grad.index_copy_(0, idx, val.to(grad.dtype))
        clock.lap("t_unpack", sync=True)
        sparse = [(layer, int(v.numel())) for layer, v, _ in payload]
        kept = sum(n for _, n in sparse)
        index_bytes = 0 if e.compressor.shared_selection else self._index_bytes
        value_bytes = sum(v.numel() * v.element_size() for _, v, _ in payload)
        stats = e.sent_stats(step, plan, sent, sparse, dense,
                             pending.bytes_sent + value_bytes + index_bytes, gain_min, gain_c,
                             clock, t_compute, t_discarded)
        # Values only: the indices travel once, from the leader, not from every rank.
        stats.floats_sent = kept + sum(l.numel for l in dense)
        return stats

    def _index_sets(self, fed, with_candidate, theta_c, step: int, clock: PhaseClock):
        """[(idx_min, idx_c or None)] per fed layer: its leader's selection, on every rank."""
        e = self.engine
        self._index_bytes = 0
        if e.compressor.shared_selection:
            # Same draws everywhere: each rank makes the leader's selection itself.
            return [self._select(layer, g_ef, cf, theta_c if c else None, step)
                    for (layer, g_ef, cf), c in zip(fed, with_candidate)]
        leaders = self.leaders(step)
        # The byte buffer: the counts of each level per layer (int32), then per layer a
        # field per level as large as the compressor may need (count_bounds), its indices
        # ascending in fewer bytes than int32 (index_codec.py), zeros where unused.
        fields = []
        for (layer, _, cf), c in zip(fed, with_candidate):
            high_min = e.compressor.count_bounds(num_kept(layer.numel, cf), layer.numel)[1]
            high_c = e.compressor.count_bounds(num_kept(layer.numel, theta_c),
                                               high_min)[1] if c else 0
            fields.append((index_codec.plan(layer.numel, high_min),
                           index_codec.plan(layer.numel, high_c) if c else None))
        n_layers = len(fed)
        starts, total = [], 8 * n_layers                 # the header: 2 int32 per layer
        for field_min, field_c in fields:
            starts.append(total)
            total += field_min.nbytes + (field_c.nbytes if field_c else 0)
        device = fed[0][1].device if fed else torch.device("cpu")
        buf = torch.zeros(total, dtype=torch.uint8, device=device)
        mine = [i for i, (layer, _, _) in enumerate(fed) if leaders[layer.name] == e.comm.rank]
        if mine:
            # Both levels of every layer this rank leads, in one select_all (the compressor
            # may batch them); the second level where θc > the layer's CF.
            chosen = e.select_all([fed[i] for i in mine], theta_c, step)
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
        self._index_bytes = total                                # what each rank sends
        if total:
            # Summed as int32 (both transports reduce it; one rank wrote each byte, the
            # others zeros, so the sum is that rank's bytes exactly).
            buf = e.comm.allreduce(buf.view(torch.int32), op="sum",
                                   name=f"{e.prefix}.indices").view(torch.uint8)
        clock.lap("t_wait_exchange", sync=True)
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
        return out

    def _select(self, layer, g_ef, cf, theta_c, step):
        sel = self.engine.select(layer, g_ef, cf, theta_c, step)
        return sel.idx_min, sel.idx_c
