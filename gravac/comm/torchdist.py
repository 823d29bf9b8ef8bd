"""``Comm`` on torch.distributed (gloo on CPU, nccl on GPU), as launched by torchrun.

torch.distributed names no collectives: their order is the contract, and gravac issues
the same collectives in the same order on every rank. Gloo has no average: ``"average"``
is a sum divided by the group size afterwards, as DDP does. Every collective runs on one
wire device, and a tensor elsewhere makes a round trip there (``_on_wire``): NCCL's wire is
the current CUDA device (it reduces only GPU tensors; gains and flags live on the CPU),
gloo's is the host, CUDA tensors included.

Example::

    torch.distributed.init_process_group("gloo")      # torchrun set the rendezvous env
    comm = TorchDistComm()
    comm.allgather_bytes(buffer, name="gravac.sparse")   # all ranks' buffers, rank order
"""
from __future__ import annotations

import os
import socket
from typing import Any, Sequence

import torch
import torch.distributed as dist

from .base import Comm, Done, Handle, check_op, check_ranks
from .process_exit import note_gloo


class _Work(Handle):
    def __init__(self, work, finish):
        self._work, self._finish = work, finish

    def ready(self) -> bool:
        return self._work is None or self._work.is_completed()

    def wait(self):
        if self._work is not None:
            self._work.wait()
        return self._finish()


class TorchDistComm(Comm):
    """A torch.distributed process group (default: the world) as a ``Comm``."""

    backend = "torch"

    def __init__(self, group=None, local_rank: int | None = None, local_size: int | None = None,
                 owns_process_group: bool = False):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised: launch with torchrun and "
                               "call torch.distributed.init_process_group (or gravac.comm.init"
                               "('torch')) first")
        self.group = group
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        if local_rank is None:
            # torchrun tells each process its place on the host.
            local_rank = int(os.environ.get("LOCAL_RANK", rank))
            local_size = int(os.environ.get("LOCAL_WORLD_SIZE", size))
        # torchrun's node rank (GROUP_RANK) for the world; a sub-group has no hosts of its own.
        node = int(os.environ["GROUP_RANK"]) if group is None and "GROUP_RANK" in os.environ \
            else None
        super().__init__(rank, size, local_rank, local_size, node=node)
        # init() started the default process group for this Comm: close() ends it.
        self._owns = bool(owns_process_group) and group is None
        self._nccl = dist.get_backend(group) == "nccl"
        if not self._nccl:
            note_gloo()     # gloo's threads outlive the group: see process_exit.py
        self._wire_device = (torch.device("cuda", torch.cuda.current_device()) if self._nccl
                             else torch.device("cpu"))

    def _global(self, rank: int) -> int:
        return rank if self.group is None else dist.get_global_rank(self.group, rank)

    def _on_wire(self, t: torch.Tensor, copy: bool = False) -> torch.Tensor:
        """``t`` on the wire device: itself when it is there already (a fresh copy with
        ``copy``, for a collective that must not write into the caller's tensor), else
        one copy there.

        Why gloo's wire is the host even for CUDA tensors: gloo's CUDA support differs per
        collective (some stage through the host, some take no CUDA tensors at all), so a
        host wire is one predictable path; and two ranks sharing one GPU must run gloo
        (NCCL refuses two ranks on one device), with CUDA tensors."""
        return t.to(self._wire_device, copy=copy)

    # -- tensors ---------------------------------------------------------------------------
    def allreduce_async(self, tensor, op, name) -> Handle:
        check_op(op)
        wire = self._on_wire(tensor, copy=True)     # one copy, on the device or off it
        work = dist.all_reduce(wire, op=dist.ReduceOp.SUM, group=self.group, async_op=True)

        def finish():
            if op == "average":
                wire.div_(self._size)
            return wire.to(tensor.device)
        return _Work(work, finish)

    def grouped_allreduce_async_(self, tensors: Sequence[torch.Tensor], op, name) -> Handle:
        check_op(op)
        tensors = list(tensors)
        if not tensors:
            return Done(tensors)
        dtypes = {t.dtype for t in tensors}
        if len(dtypes) != 1:
            raise ValueError(f"a grouped allreduce takes one dtype, got {sorted(map(str, dtypes))}")
        # One fused buffer, one collective: as DDP's buckets and Horovod's fusion buffer.
        flat = self._on_wire(torch.cat([t.reshape(-1) for t in tensors]))
        work = dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group, async_op=True)

        def finish():
            if op == "average":
                flat.div_(self._size)
            pos = 0
            for t in tensors:
                n = t.numel()
                t.view(-1).copy_(flat[pos:pos + n])
                pos += n
            return tensors
        return _Work(work, finish)

    def allgather_bytes_async(self, buffer, name, same_size=False) -> Handle:
        if buffer.dtype != torch.uint8 or buffer.dim() != 1:
            raise ValueError("allgather_bytes takes a 1-D uint8 tensor")
        if same_size:
            sizes = [buffer.numel()] * self._size       # the caller's promise
        else:
            # Collectives need one size everywhere: exchange sizes (a blocking round),
            # pad to the largest.
            mine = torch.tensor([buffer.numel()], dtype=torch.int64, device=self._wire_device)
            gathered = [torch.zeros_like(mine) for _ in range(self._size)]
            dist.all_gather(gathered, mine, group=self.group)
            sizes = torch.cat(gathered).tolist()   # one copy to the host (nccl), not one per rank
        longest = max(sizes)
        if longest == 0:
            return Done(torch.zeros(0, dtype=torch.uint8, device=buffer.device))
        padded = torch.zeros(longest, dtype=torch.uint8, device=self._wire_device)
        padded[:buffer.numel()].copy_(buffer)
        rows = torch.empty(self._size, longest, dtype=torch.uint8, device=self._wire_device)
        work = dist.all_gather_into_tensor(rows, padded, group=self.group, async_op=True) \
            if self._nccl else dist.all_gather(list(rows.unbind(0)), padded, group=self.group,
                                               async_op=True)

        def finish():
            parts = [rows[r, :sizes[r]] for r in range(self._size)]
            return torch.cat(parts).to(buffer.device)
        return _Work(work, finish)

    def broadcast_(self, tensor, root, name) -> None:
        check_ranks([root], self._size)
        wire = self._on_wire(tensor)
        dist.broadcast(wire, src=self._global(root), group=self.group)
        if wire is not tensor:
            tensor.copy_(wire)

    # -- Python objects --------------------------------------------------------------------
    def broadcast_object(self, obj: Any, name: str, root: int = 0) -> Any:
        check_ranks([root], self._size)
        box = [obj if self._rank == root else None]
        dist.broadcast_object_list(box, src=self._global(root), group=self.group)
        return box[0]

    def allgather_object(self, obj: Any, name: str) -> list:
        out: list = [None] * self._size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def barrier(self, name: str) -> None:
        dist.barrier(group=self.group)

    def close(self) -> None:
        """A barrier, then ``destroy_process_group`` when ``init`` started the group.

        Why: a process that exits with its group alive leaves its peers' sockets to be
        torn down by exit order, and a rank still reading then may fail after the job's
        work is done (a torchrun job across hosts once ended with SIGABRT on a rank after
        its last step). The barrier makes every rank reach the end of its collectives
        first; destroying the group closes them in order. A group the caller started is
        the caller's to end: then nothing happens here."""
        if not self._owns or not dist.is_initialized():
            return
        dist.barrier()
        dist.destroy_process_group()
        self._owns = False

    # -- groups ----------------------------------------------------------------------------
    def subgroup(self, ranks: Sequence[int], name: str) -> "TorchDistComm | None":
        if self.group is not None:
            raise ValueError("torch.distributed sub-groups are made from the world group only "
                             "(new_group must run on every process of the job)")
        ranks = check_ranks(ranks, self._size)
        hosts = self.allgather_object(socket.gethostname(), name=f"{name}.hosts")
        group = dist.new_group(ranks=ranks)
        if self._rank not in ranks:
            return None
        same_host = [r for r in sorted(ranks) if hosts[r] == hosts[self._rank]]
        return TorchDistComm(group, local_rank=same_host.index(self._rank),
                             local_size=len(same_host))
