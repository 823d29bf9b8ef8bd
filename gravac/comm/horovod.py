"""``Comm`` on Horovod: named collectives over a process set.

Example::

    import horovod.torch as hvd
    hvd.init()
    comm = HorovodComm()                      # all ranks; HorovodComm(process_set) for a set
    comm.grouped_allreduce_async_(grads, op="average", name="gravac.dense").wait()
"""
from __future__ import annotations

import os
import pickle
import time
from typing import Any, Sequence

import horovod.torch as hvd
import torch

from . import HOROVOD_WAITS, WAIT_MODES
from .base import Comm, Handle, _one_hot, check_op, check_ranks

_OPS = {"sum": hvd.Sum, "average": hvd.Average}
_PROCESS_SETS: dict[tuple[int, ...], object] = {}   # sub-groups made so far, by ranks


#: Sleeps between polls of an unfinished collective, seconds: short first (a collective
#: that is nearly done costs little latency), then WAIT_POLL_MAX_S, under Horovod's 5 ms
#: crowded-host cycle (``horovod_cycle.py``) and a fraction of its 1 ms default.
WAIT_POLL_FIRST_S = 50e-6
WAIT_POLL_MAX_S = 500e-6


def wait_sleeping(handle, poll=None, sleep=time.sleep) -> int:
    """Return once Horovod's ``handle`` has finished, sleeping between polls; the number
    of sleeps. Why not ``hvd.synchronize`` alone: Horovod 0.28.1 waits by yielding in a
    loop, so a rank waiting for a late one keeps a core busy in sched_yield (measured: a
    waiting rank used 1.0 s of user and 5.2 s of system CPU time in 5 s, two ranks on
    two cores). Where ranks share cores, the waiters take CPU from the ranks they are
    waiting for: with 4 ranks on 2 cores every step's skew grows. ``hvd.synchronize`` is
    still called afterwards, and then returns at once.

    Example::

        h = hvd.allreduce_async(t, name="x")
        wait_sleeping(h)          # the core is free meanwhile
        out = hvd.synchronize(h)
    """
    poll = hvd.poll if poll is None else poll
    delay, sleeps = WAIT_POLL_FIRST_S, 0
    while not poll(handle):
        sleep(delay)
        sleeps += 1
        delay = min(2 * delay, WAIT_POLL_MAX_S)
    return sleeps


# How gravac waits for its Horovod collectives (``run.horovod_wait``, WAIT_MODES): "sleep"
# (``wait_sleeping``) or "spin" (``hvd.synchronize`` alone, Horovod's own yield loop);
# "auto" picks one of them (``resolve_wait_mode``).
_wait = {"mode": "sleep", "why": "default"}


def resolve_wait_mode(setting: str, hostnames: Sequence[str], rank: int,
                      cpu_count: int) -> tuple[str, str]:
    """(mode, reason) for ``run.horovod_wait``. "auto": "sleep" where more ranks share this
    machine than it has cores (a spinning waiter then takes a core another rank needs:
    1.4-2.4x slower steps with 4 ranks on 2 cores, docs/notes/2026-11-benchmarks.md §6), else "spin"
    (Horovod's own wait; with a core per rank it measured a few percent faster). Ranks
    on one machine are those reporting its host name (``socket.gethostname()``), which
    network namespaces share: the sandbox's "hosts" on one machine count together.

    >>> resolve_wait_mode("auto", ["a", "a", "a", "a"], 0, 2)
    ('sleep', 'auto: 4 ranks on 2 cores')
    >>> resolve_wait_mode("auto", ["a", "a", "b", "b"], 3, 2)
    ('spin', 'auto: 2 ranks on 2 cores')
    """
    if setting in WAIT_MODES:
        return setting, "run.horovod_wait"
    if setting not in HOROVOD_WAITS:
        raise ValueError(f"horovod_wait must be one of {', '.join(HOROVOD_WAITS)}, "
                         f"got {setting!r}")
    here = sum(1 for h in hostnames if h == hostnames[rank])
    mode = "sleep" if here > cpu_count else "spin"
    return mode, f"auto: {here} ranks on {cpu_count} cores"


def set_wait_mode(mode: str, why: str = "set") -> None:
    """Choose how every ``HorovodComm`` handle waits from now on (``gravac.comm.init``
    calls it with what ``resolve_wait_mode`` chose)."""
    if mode not in WAIT_MODES:
        raise ValueError(f"horovod_wait must be one of {', '.join(WAIT_MODES)}, got {mode!r}")
    _wait.update(mode=mode, why=why)


def wait_mode() -> tuple[str, str]:
    """(the mode handles wait in now, why)."""
    return _wait["mode"], _wait["why"]


class _HorovodHandle(Handle):
    def __init__(self, handle, finish=None):
        self._handle, self._finish = handle, finish

    def ready(self) -> bool:
        return bool(hvd.poll(self._handle))

    def wait(self):
        if _wait["mode"] == "sleep":
            wait_sleeping(self._handle)
        out = hvd.synchronize(self._handle)
        return self._finish(out) if self._finish is not None else out


class HorovodComm(Comm):
    """A Horovod process set (default: every rank) as a ``Comm``."""

    backend = "horovod"

    def __init__(self, process_set=None):
        self.process_set = process_set or hvd.global_process_set
        world = self.process_set is hvd.global_process_set
        rank, size = self.process_set.rank(), self.process_set.size()
        super().__init__(rank, size, hvd.local_rank() if world else rank,
                         hvd.local_size() if world else size,
                         node=hvd.cross_rank() if world else 0)

    def live_size(self) -> int:
        return self.process_set.size()

    def allreduce_async(self, tensor, op, name) -> Handle:
        return _HorovodHandle(hvd.allreduce_async(tensor, op=_OPS[check_op(op)], name=name,
                                                  process_set=self.process_set))

    def grouped_allreduce_async_(self, tensors: Sequence[torch.Tensor], op, name) -> Handle:
        tensors = list(tensors)
        # Horovod's torch binding has no bfloat16: such tensors travel as float32 copies.
        wire = [t.float() if t.dtype == torch.bfloat16 else t for t in tensors]
        handle = hvd.grouped_allreduce_async_(wire, op=_OPS[check_op(op)], name=name,
                                              process_set=self.process_set)

        def copy_back(_):
            for t, w in zip(tensors, wire):
                if w is not t:
                    t.copy_(w)
            return tensors
        return _HorovodHandle(handle, copy_back)

    def allgather_bytes_async(self, buffer, name, same_size=False) -> Handle:
        # Horovod's allgather negotiates sizes in its own coordination round anyway.
        if buffer.dtype != torch.uint8 or buffer.dim() != 1:
            raise ValueError("allgather_bytes takes a 1-D uint8 tensor")
        return _HorovodHandle(hvd.allgather_async(buffer, name=name, process_set=self.process_set))

    def _global(self, root: int) -> int:
        """Horovod names a broadcast's root by its GLOBAL rank, also within a process set
        (hvd.broadcast_ refuses set-relative roots that are not members)."""
        check_ranks([root], self.size)
        members = self.process_set.ranks
        return root if members is None else sorted(members)[root]

    def broadcast_(self, tensor, root, name) -> None:
        _HorovodHandle(hvd.broadcast_async_(tensor, root_rank=self._global(root), name=name,
                                            process_set=self.process_set)).wait()

    def broadcast_object(self, obj: Any, name: str, root: int = 0) -> Any:
        return hvd.broadcast_object(obj, root_rank=self._global(root), name=name,
                                    process_set=self.process_set)

    def allgather_object(self, obj: Any, name: str) -> list:
        # hvd.allgather_object has no process_set in 0.28.1: pickle over the byte allgather.
        data = pickle.dumps(obj)
        sizes = self.allreduce(_one_hot(len(data), self), op="sum", name=f"{name}.sizes")
        flat = self.allgather_bytes(torch.frombuffer(bytearray(data), dtype=torch.uint8)
                                    if data else torch.zeros(0, dtype=torch.uint8),
                                    name=f"{name}.data")
        out, pos = [], 0
        for size in sizes.tolist():
            out.append(pickle.loads(flat[pos:pos + int(size)].numpy().tobytes()))
            pos += int(size)
        return out

    def subgroup(self, ranks: Sequence[int], name: str) -> "HorovodComm | None":
        if self.process_set is not hvd.global_process_set:
            raise ValueError("Horovod sub-groups are made from the global group only "
                             "(hvd.add_process_set must run on every Horovod process)")
        ranks = check_ranks(ranks, self.size)
        if os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS", "0") in ("", "0"):
            raise RuntimeError("Horovod sub-groups need dynamic process sets: export "
                               "HOROVOD_DYNAMIC_PROCESS_SETS=1 before the job starts")
        key = tuple(sorted(ranks))
        # Horovod refuses a second process set over the same ranks (the global one too):
        # reuse what exists, so asking twice for one sub-group is harmless.
        if len(key) == self.size:
            process_set = hvd.global_process_set
        else:
            process_set = _PROCESS_SETS.get(key)
            if process_set is None:
                process_set = _PROCESS_SETS[key] = hvd.add_process_set(list(key))
        if self.rank not in ranks:
            return None
        return HorovodComm(process_set)
