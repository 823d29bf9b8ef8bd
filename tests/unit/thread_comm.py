"""N ranks in one process, one thread each, for unit tests of multi-rank exchanges.

``run_ranks(n, fn)`` runs ``fn(comm)`` on n threads with a ``ThreadComm`` each and returns
their results in rank order (re-raising the first failure). Collectives complete when
called (every member blocks until all members called the same one), so a rank that
issues a different collective than the others makes the test fail with a clear
mismatch instead of hanging: each collective checks its name and kind across members.

Example::

    sums = run_ranks(4, lambda comm: comm.allreduce(torch.ones(2), "sum", "x"))
"""
from __future__ import annotations

import copy
import threading
from typing import Any, Callable, Sequence

import torch

from gravac.comm.base import Comm, Done, check_op, check_ranks

_TIMEOUT_S = 300   # a hang guard: a mismatched collective fails instead of blocking forever


class _World:
    def __init__(self, n: int):
        self.n = n
        self.lock = threading.Condition()
        self.slots: dict[tuple, dict] = {}


class ThreadComm(Comm):
    """One thread's view of a group of ranks in this process."""

    backend = "thread"

    def __init__(self, world: _World, members: Sequence[int], rank: int,
                 node: int | None = None, local: tuple[int, int] | None = None,
                 gid: str = "world"):
        self._world, self._members, self._gid = world, tuple(members), gid
        local_rank, local_size = local or (rank, len(members))
        super().__init__(rank, len(members), local_rank, local_size, node=node)
        self._seq = 0

    def _collective(self, kind: str, name: str, value, combine: Callable[[list], Any]):
        w, key = self._world, (self._gid, self._seq)
        self._seq += 1
        with w.lock:
            slot = w.slots.setdefault(key, {"values": {}, "kinds": {}, "done": None})
            slot["values"][self.rank] = value
            slot["kinds"][self.rank] = (kind, name)
            if len(slot["values"]) == self.size:
                kinds = set(slot["kinds"].values())
                if len(kinds) > 1:
                    slot["done"] = RuntimeError(f"ranks issued different collectives: {kinds}")
                else:
                    slot["done"] = ("ok", combine([slot["values"][r] for r in range(self.size)]))
                w.lock.notify_all()
            elif not w.lock.wait_for(lambda: slot["done"] is not None, timeout=_TIMEOUT_S):
                raise RuntimeError(f"collective {kind} {name!r} never completed")
            done = slot["done"]
            slot.setdefault("taken", 0)
            slot["taken"] += 1
            if slot["taken"] == self.size:
                del w.slots[key]
        if isinstance(done, Exception):
            raise done
        return done[1]

    def allreduce_async(self, tensor, op, name):
        check_op(op)

        def combine(values):
            # in the input's dtype, as Horovod and torch.distributed return it (torch's sum
            # of int32 would give int64)
            total = torch.stack(values).sum(0, dtype=values[0].dtype)
            return total / len(values) if op == "average" else total
        return Done(self._collective("allreduce", name, tensor.clone(), combine).clone())

    def grouped_allreduce_async_(self, tensors, op, name):
        check_op(op)
        tensors = list(tensors)
        flat = torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.zeros(0)

        def combine(values):
            total = torch.stack(values).sum(0)
            return total / len(values) if op == "average" else total
        out = self._collective("grouped", name, flat.clone(), combine)
        offset = 0
        for t in tensors:
            t.copy_(out[offset:offset + t.numel()].view_as(t))
            offset += t.numel()
        return Done(tensors)

    def allgather_bytes_async(self, buffer, name, same_size=False):
        out = self._collective("allgather", name, buffer.clone(), lambda v: torch.cat(v))
        return Done(out.clone())

    def broadcast_(self, tensor, root, name):
        check_ranks([root], self.size)
        out = self._collective("broadcast", name, tensor.clone(), lambda v: v[root])
        tensor.copy_(out)

    def broadcast_object(self, obj: Any, name: str, root: int = 0) -> Any:
        return copy.deepcopy(self._collective("bobject", name, obj, lambda v: v[root]))

    def allgather_object(self, obj: Any, name: str) -> list:
        return copy.deepcopy(self._collective("gobject", name, obj, list))

    def subgroup(self, ranks, name):
        ranks = sorted(check_ranks(ranks, self.size))
        self._collective("subgroup", name, tuple(ranks), lambda v: None)
        if self.rank not in ranks:
            return None
        members = tuple(self._members[r] for r in ranks)
        return ThreadComm(self._world, members, ranks.index(self.rank), gid=f"{self._gid}/{name}")


def run_ranks(n: int, fn: Callable[[ThreadComm], Any], hosts: Sequence[int] | None = None):
    """``fn(comm)`` on ``n`` threads; ``hosts``: each rank's node (default: all on node 0)."""
    world = _World(n)
    hosts = list(hosts) if hosts is not None else [0] * n
    results: list = [None] * n
    errors: list = []

    def body(rank):
        same = [r for r in range(n) if hosts[r] == hosts[rank]]
        comm = ThreadComm(world, range(n), rank, node=hosts[rank],
                          local=(same.index(rank), len(same)))
        try:
            results[rank] = fn(comm)
        except BaseException as exc:   # noqa: BLE001 - re-raised in the caller
            errors.append((rank, exc))
            with world.lock:
                world.lock.notify_all()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        rank, exc = sorted(errors, key=lambda e: e[0])[0]
        raise AssertionError(f"rank {rank} failed: {exc!r}") from exc
    return results
