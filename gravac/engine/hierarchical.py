"""The hierarchical exchange: dense inside a host, sparse among one leader per host.

With N ranks on H hosts, the allgather exchange has every rank receive the selections of
N − 1 others; here only the H host leaders exchange, so the sparse traffic across hosts is
that of H ranks (``../shared/ALGORITHM.md``, "Exchanges"; docs/ALGORITHM.md §13). Per step,
on every rank:

1. the host's ranks average their gradients densely (one grouped allreduce per dtype over
   the host's group: loopback or shared memory, not the slow link);
2. the leader (the host's lowest rank) runs error feedback and both levels' selection on
   the host average: residuals live on the leaders only (of the host-averaged gradient);
3. ONE gains allreduce over all ranks (the others add zeros, and every rank's NaN/Inf
   flag rides in it), so every rank takes the same decision and the controller's state
   stays the same everywhere;
4. the leaders exchange as the allgather exchange does, among themselves (sparse allgather
   + dense grouped allreduce); each host's average weighs its ranks equally, so the
   average over leaders is the average over all ranks (every host must have as many ranks);
5. the leader shares the result inside its host: one broadcast per dtype of the flat
   gradients.

Collectives: host average, gains (all ranks), leaders' exchange, NaN flags when not agreed
yet (all ranks), host broadcast: each chosen from the plan and agreed values only.

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
from .selection import apply_decision, gain_row


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
                         f"host (the average over host leaders weighs hosts alike); got "
                         f"{layout}. Give every host the same slots, or use "
                         f"compression.exchange=allgather")
    return ordered


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
        """The host and leader groups (collective on every rank of ``comm``)."""
        e = self.engine
        if self._host_of_rank is not None and len(self._host_of_rank) != comm.size:
            self._host_of_rank = None      # an elastic reset changed the ranks: ask again
        groups = host_groups(comm, self._host_of_rank, name=f"{e.prefix}.hosts")
        self.hosts = groups
        self.host_comm = None
        for k, ranks in enumerate(groups):   # every rank makes every group, same order
            sub = comm.subgroup(ranks, name=f"{e.prefix}.host{k}")
            if sub is not None:
                self.host_comm = sub
        self.leaders = [g[0] for g in groups]
        self.leader_comm = comm.subgroup(self.leaders, name=f"{e.prefix}.leaders")
        self.is_leader = self.leader_comm is not None
        self.exchange = None if not self.is_leader else \
            AllgatherExchange(self.leader_comm, f"{e.prefix}.x", e.exchange.dense_wire)
        self._bound = comm

    def describe(self) -> dict:
        return {"kind": self.kind}

    # -- the step -------------------------------------------------------------------------
    def synchronize(self, plan, step: int, clock: PhaseClock, t_compute,
                    local_bad: bool | None):
        e = self.engine
        if self._bound is not e.comm:
            self._build(e.comm)
        self._host_average(clock)
        compressed = [l for l in e.layers if l.compressible and plan.cf_of(l.name) > 1]
        dense = [l for l in e.layers if not l.compressible or plan.cf_of(l.name) <= 1]
        candidate_planned = bool(compressed) and all(
            plan.theta_c is not None and plan.theta_c > plan.cf_of(l.name) for l in compressed)
        selections = []
        if self.is_leader:
            for layer in e.layers:
                if layer.compressible:
                    sel = e.feed_and_select(layer, plan, step, clock)
                    if sel is not None:
                        selections.append(sel)
        sent, gain_min, gain_c, bad = e.decide(
            plan, [gain_row(s, plan.gain_measure) for s in selections] if plan.needs_gains
            else [], clock, local_bad, bool(compressed), candidate_planned)
        if bad:
            e.memory.rollback_step()
            return e.skip(step, bad, clock, t_compute)
        if plan.needs_gains:
            local_bad = None
        t_discarded = 0.0
        if sent == SENT_DENSE and compressed:
            t_discarded = sum(clock.times[p] for p in ("t_select", "t_norms", "t_wait_gains"))
        payload = apply_decision(e.memory, selections, sent)   # leaders' selections only
        if sent == SENT_DENSE:
            dense, compressed = dense + compressed, []
        clock.lap("t_residual")
        pending = None
        if self.is_leader:
            packed = self.exchange.pack(payload)
            clock.lap("t_pack", sync=True)
            pending = self.exchange.start(packed, dense, same_size=e.compressor.exact_count)
        flags = e.start_flags(local_bad)
        if pending is not None:
            pending.wait()
        bad = e.finish_flags(flags)
        clock.lap("t_wait_exchange", sync=True)
        if bad:
            e.memory.rollback_step()
            return e.skip(step, bad, clock, t_compute)
        if pending is not None:
            pending.unpack()
            clock.lap("t_unpack", sync=True)
        self._host_share(clock)
        # The leader's record is exact; the other ranks sent nothing across hosts and count
        # what their leader planned (exact for Top-k/Random-k; DGC/RedSync vary a little).
        if self.is_leader:
            sparse = [(layer, int(v.numel())) for layer, v, _ in payload]
        else:
            level = plan.theta_c if sent == SENT_CANDIDATE else None
            sparse = [(l, num_kept(l.numel, level or plan.cf_of(l.name))) for l in compressed]
        return e.sent_stats(step, plan, sent, sparse, dense,
                            pending.bytes_sent if pending is not None else 0, gain_min,
                            gain_c, clock, t_compute, t_discarded)

    # -- inside a host --------------------------------------------------------------------
    def _by_dtype(self) -> list[list[Layer]]:
        groups: dict[torch.dtype, list[Layer]] = {}
        for layer in self.engine.layers:
            groups.setdefault(layer.param.grad.dtype, []).append(layer)
        return [groups[d] for d in sorted(groups, key=str)]

    def _host_average(self, clock: PhaseClock) -> None:
        hc = self.host_comm
        if hc is None or hc.size == 1:
            return
        clock.lap("t_check", sync=True)
        handles = [hc.grouped_allreduce_async_([l.param.grad for l in layers], op="average",
                                               name=f"{self.engine.prefix}.host_avg{i}")
                   for i, layers in enumerate(self._by_dtype())]
        for h in handles:
            h.wait()
        clock.lap("t_wait_exchange", sync=True)

    def _host_share(self, clock: PhaseClock) -> None:
        """The leader's averaged gradients to the other ranks of its host."""
        hc = self.host_comm
        if hc is None or hc.size == 1:
            return
        for i, layers in enumerate(self._by_dtype()):
            grads = [l.param.grad for l in layers]
            flat = torch.cat([g.reshape(-1) for g in grads]) if self.is_leader else \
                torch.empty(sum(g.numel() for g in grads), dtype=grads[0].dtype,
                            device=grads[0].device)
            hc.broadcast_(flat, root=0, name=f"{self.engine.prefix}.host_share{i}")
            if not self.is_leader:
                offset = 0
                for g in grads:
                    g.view(-1).copy_(flat[offset:offset + g.numel()])
                    offset += g.numel()
        clock.lap("t_wait_exchange", sync=True)
