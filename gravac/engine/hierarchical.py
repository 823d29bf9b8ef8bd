"""The hierarchical exchange: dense inside a host, sparse across hosts, work shared by shard.

With N ranks on H hosts of S ranks each, the allgather exchange has every rank receive the
selections of N − 1 others; here each host sends ONE selection of the host's average
gradient across hosts, so the sparse traffic on the slow link is that of H ranks
(``../shared/ALGORITHM.md``, "Exchanges"; docs/ALGORITHM.md §13). As in Horovod's and
NCCL's hierarchical allreduce, the host's ranks split the work: the layers are cut into S
shards (the same cut on every host, balanced by size), and the rank with local index j
compresses and exchanges shard j only. Per step, on every rank:

1. the host's ranks average their gradients densely (one grouped allreduce per dtype over
   the host's group: loopback or shared memory, not the slow link);
2. each rank runs error feedback and both levels' selection on its shard of the host
   average: a layer's residual lives on the rank owning its shard (with one rank per host,
   every rank owns everything: the allgather exchange);
3. ONE gains allreduce over all ranks (each adds its shard's rows; every rank's NaN/Inf
   flag rides in it): the sums are those of one selection per host over every layer, so
   every rank takes the same decision and the controller's state stays the same everywhere;
4. the ranks with local index j, one per host, exchange shard j among themselves as the
   allgather exchange does (sparse allgather + dense grouped allreduce): S exchanges of H
   ranks, in parallel. Each host's average weighs its ranks equally, so the average over
   hosts is the average over all ranks (every host must have as many ranks);
5. the host's ranks share their shards' results: ONE byte allgather over the host's group.

Collectives: host average, gains (all ranks), NaN flags when the gains did not carry them
(all ranks), shard exchange, host allgather: each chosen from the plan and agreed values
only, and never two groups' collectives in flight at once (a 2x2 Horovod run hung, a Gloo
recv timeout, when the world's flags ran beside a shard group's exchange). Host and shard
groups cross (each rank is in one of each); under Horovod they are process sets, which its
background loop negotiates one after another every cycle: sound, and measured to run (150
steps on 2 sandbox hosts x 2 ranks with sleeping and with spinning waits, docs/BENCHMARKS.md
§6), but each of their collectives costs a few Horovod cycles.

Example::

    engine = StepEngine(layers, TopK(), Static(cf=100), comm, exchange="hierarchical")
    stats = engine.synchronize(step=0, lr_decayed=False, t_compute=None)
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..comm import Comm
from ..compressors import num_kept
from ..controllers import SENT_CANDIDATE, SENT_DENSE
from .exchange import AllgatherExchange
from .layers import Layer
from .phases import PhaseClock
from .selection import apply_decision


def host_groups(comm: Comm, host_of_rank: Sequence[int] | None = None,
                name: str = "gravac.hosts") -> list[list[int]]:
    """The ranks of each host, hosts ordered by their lowest rank. Collective (one
    ``allgather_object``) unless ``host_of_rank`` gives every rank's host (tests, or a
    layout the launcher does not tell). Refuses hosts with different numbers of ranks."""
    hosts = list(host_of_rank) if host_of_rank is not None else \
        comm.allgather_object(comm.node, name=name)
    if len(hosts) != comm.size:
        raise ValueError(f"host_of_rank names {len(hosts)} ranks; the group has {comm.size}")
    groups: dict = {}
    for rank, host in enumerate(hosts):
        groups.setdefault(host, []).append(rank)
    ordered = sorted(groups.values(), key=lambda ranks: ranks[0])
    sizes = sorted({len(g) for g in ordered})
    if len(sizes) > 1:
        layout = ", ".join(f"host {i}: ranks {g}" for i, g in enumerate(ordered))
        raise ValueError(f"the hierarchical exchange needs the same number of ranks on every "
                         f"host (the average over hosts weighs hosts alike); got "
                         f"{layout}. Give every host the same slots, or use "
                         f"compression.exchange=allgather")
    return ordered


def shard_layers(layers: Sequence[Layer], shards: int) -> list[int]:
    """The shard (0 .. shards−1) of each layer: largest first onto the lightest shard, so
    the shards' element counts are balanced; the same answer on every rank."""
    owner = [0] * len(layers)
    load = [0] * shards
    for i in sorted(range(len(layers)), key=lambda i: (-layers[i].numel, i)):
        j = min(range(shards), key=lambda j: (load[j], j))
        owner[i] = j
        load[j] += layers[i].numel
    return owner


class HierarchicalStep:
    """The step of ``StepEngine`` with ``exchange="hierarchical"`` (see the module doc)."""

    kind = "hierarchical"

    def __init__(self, engine, host_of_rank: Sequence[int] | None = None):
        self.engine = engine
        self._host_of_rank = None if host_of_rank is None else list(host_of_rank)
        self._bound = None            # the Comm the groups were built from

    def bind(self, comm: Comm) -> None:
        """Forget the groups: they are built over ``comm`` at the next step (collective
        there, on every rank, so that building the optimizer issues none: Horovod Elastic
        builds it on a joining worker while the others wait)."""
        self._bound = None

    def _build(self, comm: Comm) -> None:
        """Host groups, shard peer groups and the shards (collective on every rank)."""
        e = self.engine
        if self._host_of_rank is not None and len(self._host_of_rank) != comm.size:
            self._host_of_rank = None      # an elastic reset changed the ranks: ask again
        groups = host_groups(comm, self._host_of_rank, name=f"{e.prefix}.hosts")
        self.hosts = groups
        slots = len(groups[0])
        self.host_comm = None
        for k, ranks in enumerate(groups):   # every rank makes every group, same order
            sub = comm.subgroup(ranks, name=f"{e.prefix}.host{k}")
            if sub is not None:
                self.host_comm, self.local = sub, ranks.index(comm.rank)
        self.peer_comm = None
        for j in range(slots):               # the j-th rank of every host
            sub = comm.subgroup([g[j] for g in groups], name=f"{e.prefix}.shard{j}")
            if sub is not None:
                self.peer_comm = sub
        owner = shard_layers(e.layers, slots)
        self.shards = [[l for l, o in zip(e.layers, owner) if o == j] for j in range(slots)]
        self.mine = self.shards[self.local]
        self.exchange = AllgatherExchange(self.peer_comm, f"{e.prefix}.x{self.local}",
                                          e.exchange.dense_wire)
        self._bound = comm

    def describe(self) -> dict:
        return {"kind": self.kind}

    def owner(self, name: str) -> int:
        """The local index of the rank (on every host) that compresses layer ``name``."""
        return next(j for j, shard in enumerate(self.shards) if any(l.name == name
                                                                     for l in shard))

    # -- the step -------------------------------------------------------------------------
    def synchronize(self, plan, step: int, clock: PhaseClock, t_compute,
                    local_bad: bool | None):
        e = self.engine
        if self._bound is not e.comm:
            self._build(e.comm)
        self._host_average(clock)
        # Decided on the whole model (every rank alike), worked on this rank's shard.
        compressed = [l for l in e.layers if l.compressible and plan.cf_of(l.name) > 1]
        candidate_planned = bool(compressed) and all(
            plan.theta_c is not None and plan.theta_c > plan.cf_of(l.name) for l in compressed)
        selections, mine_dense = e.feed_and_select_all(self.mine, plan, step, clock)
        d = e.decide(plan, selections, clock, local_bad, bool(compressed), candidate_planned)
        if d.bad_ranks:
            return e.skip(step, d.bad_ranks, clock, t_compute)
        sent, gain_min, gain_c, local_bad = d.sent, d.gain_min, d.gain_c, d.local_bad
        t_discarded = 0.0
        if sent == SENT_DENSE and compressed:
            t_discarded = sum(clock.times[p] for p in ("t_select", "t_norms", "t_wait_gains"))
        payload = apply_decision(e.memory, selections, sent)
        if sent == SENT_DENSE:
            mine_dense += [s.layer for s in selections]
        clock.lap("t_residual")
        if local_bad is not None:
            # The flags' round of its own, before the shard exchange, not beside it: on
            # Horovod, collectives of different process sets in flight at once (the world's
            # flags, a shard group's exchange) hung a run (a Gloo recv timeout after 87
            # steps on 2 sandbox hosts).
            bad = e._agree_flags(local_bad, clock)
            if bad:
                e.memory.rollback_step()
                return e.skip(step, bad, clock, t_compute)
        packed = self.exchange.pack(payload)
        clock.lap("t_pack", sync=True)
        pending = self.exchange.start(packed, mine_dense, same_size=e.compressor.exact_count)
        pending.wait()
        clock.lap("t_wait_exchange", sync=True)
        pending.unpack()
        clock.lap("t_unpack", sync=True)
        self._host_share(clock)
        # Exact counts for this rank's shard; the others' as planned (exact for Top-k and
        # Random-k; DGC/RedSync keep about k). bytes_sent: this rank's across hosts.
        own = {layer.name: int(v.numel()) for layer, v, _ in payload}
        level = plan.theta_c if sent == SENT_CANDIDATE else None
        if sent == SENT_DENSE:
            sparse, dense = [], list(e.layers)
        else:
            sparse = [(l, own.get(l.name, num_kept(l.numel, level or plan.cf_of(l.name))))
                      for l in compressed]
            names = {l.name for l in compressed}
            dense = [l for l in e.layers if l.name not in names]
        return e.sent_stats(step, plan, sent, sparse, dense, pending.bytes_sent, gain_min,
                            gain_c, clock, t_compute, t_discarded)

    # -- inside a host --------------------------------------------------------------------
    def _by_dtype(self) -> list[list[Layer]]:
        groups: dict[torch.dtype, list[Layer]] = {}
        for layer in self.engine.layers:
            groups.setdefault(layer.param.grad.dtype, []).append(layer)
        return [groups[d] for d in sorted(groups, key=str)]

    def _host_average(self, clock: PhaseClock) -> None:
        hc = self.host_comm
        if hc.size == 1:
            return
        clock.lap("t_check", sync=True)
        handles = [hc.grouped_allreduce_async_([l.param.grad for l in layers], op="average",
                                               name=f"{self.engine.prefix}.host_avg{i}")
                   for i, layers in enumerate(self._by_dtype())]
        for h in handles:
            h.wait()
        clock.lap("t_wait_exchange", sync=True)

    def _host_share(self, clock: PhaseClock) -> None:
        """Every rank's shard of averaged gradients to the other ranks of its host: one
        allgather of bytes (each shard's layers in order, as they are in memory)."""
        hc = self.host_comm
        if hc.size == 1:
            return
        mine = [l.param.grad.reshape(-1).view(torch.uint8) for l in self.mine]
        # An empty shard sends an empty buffer on the gradients' device all the same: the
        # host's other ranks send theirs from there (Horovod wants one device for all).
        buffer = torch.cat(mine) if mine else \
            torch.zeros(0, dtype=torch.uint8, device=self.engine.device)
        gathered = hc.allgather_bytes(buffer, name=f"{self.engine.prefix}.host_share")
        clock.lap("t_wait_exchange", sync=True)
        pos = 0
        for j, shard in enumerate(self.shards):
            for layer in shard:
                grad = layer.param.grad
                nbytes = grad.numel() * grad.element_size()
                if j != self.local:
                    raw = gathered[pos:pos + nbytes]
                    if pos % grad.element_size():    # after a layer of a smaller dtype
                        raw = raw.clone()
                    grad.view(-1).copy_(raw.view(grad.dtype))
                pos += nbytes
        clock.lap("t_unpack", sync=True)
