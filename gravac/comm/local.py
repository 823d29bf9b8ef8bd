"""``Comm`` of a single process: every collective returns its input. For unit tests and
for using gravac's optimizer without a distributed launcher.

Example::

    comm = LocalComm()
    comm.allreduce(torch.ones(2), op="average", name="x")     # tensor([1., 1.])
"""
from __future__ import annotations

from typing import Any, Sequence

import copy

from .base import Comm, Done, Handle, check_op, check_ranks


class LocalComm(Comm):
    """One rank: rank 0 of a group of 1."""

    backend = "local"

    def __init__(self):
        super().__init__(rank=0, size=1, local_rank=0, local_size=1)

    def allreduce_async(self, tensor, op, name) -> Handle:
        check_op(op)
        return Done(tensor.clone())

    def grouped_allreduce_async_(self, tensors: Sequence, op, name) -> Handle:
        check_op(op)
        return Done(list(tensors))

    def allgather_bytes_async(self, buffer, name, same_size=False) -> Handle:
        return Done(buffer.clone())

    def broadcast_(self, tensor, root, name) -> None:
        check_ranks([root], 1)

    def broadcast_object(self, obj: Any, name: str, root: int = 0) -> Any:
        check_ranks([root], 1)
        # A copy, as every other backend returns: the caller may mutate what it gets.
        return copy.deepcopy(obj)

    def allgather_object(self, obj: Any, name: str) -> list:
        return [copy.deepcopy(obj)]

    def subgroup(self, ranks: Sequence[int], name: str) -> "LocalComm":
        check_ranks(ranks, 1)
        return self
