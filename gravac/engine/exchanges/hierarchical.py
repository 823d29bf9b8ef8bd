"""The hierarchical exchange: dense inside a host, sparse across hosts, work shared by shard.

Each host sends ONE selection of its average gradient across hosts, so the sparse traffic
on the slow link is that of H hosts, not N ranks (docs/ALGORITHM.md §13). The layers are
cut into S shards (S ranks per host, balanced by size); the rank with local index j
selects and exchanges shard j only. ``begin``: the host's ranks average their gradients
densely (over the host's group); ``mine``: this rank's shard, whose residuals live here;
the pipeline's one gains allreduce sums one selection per host over every layer, so every
rank decides alike; ``start``: the j-th ranks of the hosts exchange shard j as the
allgather does; ``end``: the host's ranks share their shards (one byte allgather).

Never two groups' collectives in flight at once (``world_beside = False``: a 2x2 Horovod
run hung when the world's flags ran beside a shard group's exchange): the pipeline agrees
the gains and flags before the shard exchange starts. Under Horovod the host and shard
groups are process sets (``HOROVOD_DYNAMIC_PROCESS_SETS=1``).

Example::

    opt = wrap_optimizer(sgd, model.named_parameters(), comm, exchange="hierarchical")
"""
from __future__ import annotations

from typing import Sequence

import torch

from ...comm import Comm
from ...controllers import SENT_CANDIDATE
from ...util.sizes import num_kept
from ..layers import Layer
from ..phases import PhaseClock
from .allgather import AllgatherExchange
from .base import Exchange, SentLayer, grouped_average
from .shared_index import shard_layers


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


class HierarchicalExchange(Exchange):
    """Host average, shard exchange across hosts, host share (see the module doc)."""

    kind = "hierarchical"
    world_beside = False
    selects_every_layer = False

    def __init__(self, comm, prefix, dense_wire, compressor, host_of_rank=None):
        super().__init__(comm, prefix, dense_wire, compressor)
        self._host_of_rank = None if host_of_rank is None else list(host_of_rank)
        self._bound = None            # the Comm the groups were built from

    def bind(self, comm: Comm) -> None:
        """Forget the groups: they are built over ``comm`` at the next step (collective
        there, on every rank, so that building the optimizer issues none: Horovod Elastic
        builds it on a joining worker while the others wait)."""
        self.comm = comm
        self._bound = None

    def _build(self, layers: Sequence[Layer]) -> None:
        """Host groups, shard peer groups and the shards (collective on every rank)."""
        comm = self.comm
        if self._host_of_rank is not None and len(self._host_of_rank) != comm.size:
            self._host_of_rank = None      # an elastic reset changed the ranks: ask again
        groups = host_groups(comm, self._host_of_rank, name=f"{self.prefix}.hosts")
        self.hosts = groups
        slots = len(groups[0])
        self.host_comm = None
        for k, ranks in enumerate(groups):   # every rank makes every group, same order
            sub = comm.subgroup(ranks, name=f"{self.prefix}.host{k}")
            if sub is not None:
                self.host_comm, self.local = sub, ranks.index(comm.rank)
        self.peer_comm = None
        for j in range(slots):               # the j-th rank of every host
            sub = comm.subgroup([g[j] for g in groups], name=f"{self.prefix}.shard{j}")
            if sub is not None:
                self.peer_comm = sub
        owner = shard_layers(layers, slots)
        self.shards = [[l for l, o in zip(layers, owner) if o == j] for j in range(slots)]
        self._mine = {l.name for l in self.shards[self.local]}
        self.exchange = AllgatherExchange(self.peer_comm, f"{self.prefix}.x{self.local}",
                                          self.dense_wire, self.compressor)
        self._layers = list(layers)
        self._bound = comm

    def describe(self) -> dict:
        return {"kind": self.kind}

    def owner(self, name: str) -> int:
        """The local index of the rank (on every host) that compresses layer ``name``."""
        return next(j for j, shard in enumerate(self.shards) if any(l.name == name
                                                                     for l in shard))

    # -- the step -------------------------------------------------------------------------
    def begin(self, layers, clock: PhaseClock) -> None:
        if self._bound is not self.comm:
            self._build(layers)
        hc = self.host_comm
        if hc.size == 1:
            return
        clock.lap("t_check", sync=True)
        handles, _ = grouped_average(hc, f"{self.prefix}.host_avg",
                                     [l.param.grad for l in self._layers])
        for h in handles:
            h.wait()
        clock.lap("t_wait_exchange", sync=True)

    def mine(self, planned: Sequence[Layer]) -> list[Layer]:
        return [l for l in planned if l.name in self._mine]

    def start(self, sent, dense, tag="", flags=None, same_size=False):
        # The flags were agreed before (world_beside = False): never in a shard group.
        return self.exchange.start(sent, dense, tag, same_size=same_size)

    def remote(self, planned, level: str) -> list[SentLayer]:
        # The other shards' layers as planned (exact for Top-k and Random-k; DGC and
        # RedSync keep about k): every rank of a host counts the host's values alike.
        out = []
        for layer, cf, cf_c in planned:
            if layer.name not in self._mine:
                n = num_kept(layer.numel, cf_c if level == SENT_CANDIDATE else cf)
                out.append(SentLayer(layer, None, None, n, n))
        return out

    def end(self, clock: PhaseClock) -> None:
        """Every rank's shard of averaged gradients to the other ranks of its host: one
        allgather of bytes (each shard's layers in order, as they are in memory)."""
        hc = self.host_comm
        if hc.size == 1:
            return
        mine = [l.param.grad.reshape(-1).view(torch.uint8) for l in self.shards[self.local]]
        # An empty shard sends an empty buffer on the gradients' device all the same: the
        # host's other ranks send theirs from there (Horovod wants one device for all).
        device = self._layers[0].param.device if self._layers else torch.device("cpu")
        buffer = torch.cat(mine) if mine else torch.zeros(0, dtype=torch.uint8, device=device)
        gathered = hc.allgather_bytes(buffer, name=f"{self.prefix}.host_share")
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
