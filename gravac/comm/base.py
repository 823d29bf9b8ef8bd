"""The transport interface: everything gravac asks of the ranks it runs on.

The step engine, the trainer and the checkpoints talk to other ranks only through a
``Comm``; ``gravac/comm/horovod.py``, ``torchdist.py`` and ``local.py`` implement it on
Horovod, torch.distributed and a single process. Collectives carry an explicit,
deterministic ``name``; backends that name collectives (Horovod) use it, the others ignore
it, and every caller issues the same collectives in the same order on every rank.

Example::

    comm = gravac.comm.init("torch")          # or "horovod", "local", "auto"
    total = comm.allreduce(torch.ones(3), op="sum", name="demo.sum")   # [size]*3
    chunks = comm.allgather_bytes(buffer, name="demo.gather")         # rank order, concatenated
    plan = comm.broadcast_object(plan if comm.rank == 0 else None, name="demo.plan")
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Sequence

import torch

#: Reduction operations every backend offers.
OPS = ("sum", "average")


def check_op(op: str) -> str:
    if op not in OPS:
        raise ValueError(f"reduction op must be one of {', '.join(OPS)}, got {op!r}")
    return op


class Handle(ABC):
    """An asynchronous collective in flight; ``wait()`` returns its result."""

    @abstractmethod
    def wait(self) -> Any:
        """Block until the collective finished on this rank; return its result."""

    def ready(self) -> bool:
        """Whether ``wait()`` would return at once (a transport that cannot tell: True)."""
        return True


class Done(Handle):
    """A collective that already finished (single process, or a backend without async)."""

    def __init__(self, result: Any):
        self._result = result

    def wait(self) -> Any:
        return self._result


class Comm(ABC):
    """A group of ranks and the collectives gravac needs over them.

    ``rank``/``size`` are this process's position in the group; ``local_rank``/``local_size``
    its position among the group's processes on the same host (for threads and for the
    hierarchical exchange); ``node`` the index of its host as the launcher numbered them
    (Horovod's cross rank, torchrun's node rank), which tells hosts apart where host
    names do not (network namespaces share one). ``backend`` names the implementation
    (``"horovod"``, ``"torch"``, ``"local"``).
    """

    backend = "abstract"

    def __init__(self, rank: int, size: int, local_rank: int, local_size: int,
                 node: int | None = None):
        # Fixed for the life of a Comm: a new set of ranks (an elastic reset) is a new Comm.
        self._rank, self._size = rank, size
        self._local_rank, self._local_size = local_rank, local_size
        # Launchers place a host's ranks next to each other: the fallback when none says.
        self._node = rank // max(local_size, 1) if node is None else int(node)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    @property
    def local_rank(self) -> int:
        return self._local_rank

    @property
    def local_size(self) -> int:
        return self._local_size

    @property
    def node(self) -> int:
        return self._node

    def live_size(self) -> int:
        """How many ranks the transport has now: ``size`` unless the launcher can change
        the set of ranks under a running process (Horovod Elastic), where a ``Comm`` built
        before the change still says the old size."""
        return self._size

    # -- tensors ---------------------------------------------------------------------------
    @abstractmethod
    def allreduce_async(self, tensor: torch.Tensor, op: str, name: str) -> Handle:
        """Start an allreduce of ``tensor`` (not modified); ``wait()`` gives the result."""

    def allreduce(self, tensor: torch.Tensor, op: str, name: str) -> torch.Tensor:
        return self.allreduce_async(tensor, op, name).wait()

    @abstractmethod
    def grouped_allreduce_async_(self, tensors: Sequence[torch.Tensor], op: str,
                                 name: str) -> Handle:
        """Start ONE fused allreduce of all ``tensors``, written back in place on ``wait()``.

        The tensors may differ in shape; all must share one dtype and device.
        """

    @abstractmethod
    def allgather_bytes_async(self, buffer: torch.Tensor, name: str,
                              same_size: bool = False) -> Handle:
        """Start an allgather of a 1-D uint8 ``buffer`` whose length may differ per rank
        (even 0); ``wait()`` gives every rank's buffer concatenated in rank order.
        ``same_size=True`` promises every rank's buffer has this one's length (the caller
        knows: e.g. Top-k sends exactly k values per layer), which spares transports that
        need one size everywhere (torch.distributed) a blocking round to learn the sizes."""

    def allgather_bytes(self, buffer: torch.Tensor, name: str,
                        same_size: bool = False) -> torch.Tensor:
        return self.allgather_bytes_async(buffer, name, same_size).wait()

    @abstractmethod
    def broadcast_(self, tensor: torch.Tensor, root: int, name: str) -> None:
        """Overwrite ``tensor`` in place with ``root``'s."""

    # -- Python objects --------------------------------------------------------------------
    @abstractmethod
    def broadcast_object(self, obj: Any, name: str, root: int = 0) -> Any:
        """``root``'s ``obj`` (any picklable object) on every rank."""

    @abstractmethod
    def allgather_object(self, obj: Any, name: str) -> list:
        """Every rank's ``obj``, in rank order."""

    def barrier(self, name: str) -> None:
        """Return only when every rank has called it."""
        self.allreduce(torch.zeros(1), op="sum", name=name)

    def close(self) -> None:
        """Collective, once, after the last collective of the job: end the transport in
        order on every rank. Here nothing: a transport that ``init`` started and that
        needs an orderly end (torch.distributed) overrides it."""

    # -- groups ----------------------------------------------------------------------------
    @abstractmethod
    def subgroup(self, ranks: Sequence[int], name: str) -> "Comm | None":
        """Collective on every rank of this group: a ``Comm`` over ``ranks`` (ranks of this
        group) for its members, ``None`` for the others. Members are numbered in rank
        order (the lowest member is rank 0 of the sub-group), as Horovod and
        torch.distributed both do."""

    # -- helpers shared by every backend ---------------------------------------------------
    def broadcast_parameters(self, state: dict, root: int = 0, name: str = "gravac.params") -> None:
        """Overwrite every tensor of a model ``state_dict()`` in place with ``root``'s, in
        the dict's order (the same on every rank: the same model)."""
        for key, tensor in state.items():
            if isinstance(tensor, torch.Tensor):
                self.broadcast_(tensor, root, name=f"{name}.{key}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, size={self.size})"


def check_ranks(ranks: Sequence[int], size: int) -> list[int]:
    """Validate a sub-group's member list against a group of ``size`` ranks."""
    ranks = [int(r) for r in ranks]
    if not ranks:
        raise ValueError("a sub-group needs at least one rank")
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"sub-group ranks must be distinct, got {ranks}")
    bad = [r for r in ranks if not 0 <= r < size]
    if bad:
        raise ValueError(f"sub-group ranks {bad} are outside this group of {size} ranks")
    return ranks


def _one_hot(value: int, comm: Comm) -> torch.Tensor:
    """``value`` at this rank's slot, zeros elsewhere: summed over ranks, every rank's
    value (how a rank learns the others' sizes with one allreduce)."""
    t = torch.zeros(comm.size, dtype=torch.float64)
    t[comm.rank] = value
    return t
