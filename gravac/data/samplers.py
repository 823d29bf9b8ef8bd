"""Rank sharding: a seeded sampler per rank and in-memory batches by indexing."""
from __future__ import annotations

import math
from typing import Callable, Iterable, Iterator

import torch


def check_rank(rank: int, world_size: int) -> None:
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}) for world_size={world_size}, got {rank}")


class ShardedSampler:
    """Per-rank sample indices, like ``torch.utils.data.DistributedSampler``, resumable.

    Each epoch, the ``num_samples`` indices are permuted by a generator seeded with
    ``seed + epoch`` (the same permutation on every rank, so nothing is exchanged), cut to
    a multiple of ``world_size`` and dealt round-robin: rank ``r`` gets positions
    ``r, r + world_size, ...``. With ``drop_last`` the tail is dropped and shards are
    disjoint; without it the permutation is padded by repeating its start so that no
    sample is skipped (a few are then seen twice). All shards have ``shard_size`` samples.

    ``set_epoch(e)`` selects the permutation and rewinds to the start; ``set_start(p)``
    then skips the first ``p`` samples of this rank's shard, to resume mid-epoch exactly.
    ``len()`` is the number of samples still to come.

    Example::

        sampler = ShardedSampler(50000, rank, world_size, seed=0)
        for epoch in range(start_epoch, epochs):
            sampler.set_epoch(epoch)
            if epoch == start_epoch:
                sampler.set_start(batches_done * batch_size)   # resume mid-epoch
            for x, y in TensorBatches(images, labels, batch_size, sampler): ...
    """

    def __init__(self, num_samples: int, rank: int = 0, world_size: int = 1, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = True):
        check_rank(rank, world_size)
        if num_samples < 1:
            raise ValueError(f"ShardedSampler: num_samples must be >= 1, got {num_samples}")
        if drop_last and num_samples < world_size:
            raise ValueError(f"ShardedSampler: num_samples={num_samples} < world_size={world_size} "
                             f"with drop_last=True leaves every rank empty; use drop_last=False")
        self.num_samples = int(num_samples)
        self.rank = rank
        self.world_size = world_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        if drop_last:
            self.shard_size = num_samples // world_size
        else:
            self.shard_size = math.ceil(num_samples / world_size)
        self.epoch = 0
        self.start = 0

    def set_epoch(self, epoch: int) -> None:
        """Use the permutation of ``epoch`` and start from its beginning."""
        self.epoch = int(epoch)
        self.start = 0

    def set_start(self, position: int) -> None:
        """Skip the first ``position`` samples of this rank's shard (mid-epoch resume)."""
        if not 0 <= position <= self.shard_size:
            raise ValueError(f"ShardedSampler: start position must be in [0, {self.shard_size}] "
                             f"(this rank's shard size), got {position}")
        self.start = int(position)

    def shard_indices(self) -> torch.Tensor:
        """This rank's whole shard for the current epoch (ignores ``set_start``), int64."""
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.num_samples, generator=g)
        else:
            order = torch.arange(self.num_samples)
        total = self.shard_size * self.world_size
        if total > self.num_samples:
            reps = math.ceil(total / self.num_samples)
            order = order.repeat(reps)
        return order[:total][self.rank::self.world_size]

    def __iter__(self) -> Iterator[int]:
        return iter(self.shard_indices()[self.start:].tolist())

    def __len__(self) -> int:
        return self.shard_size - self.start

    def state_dict(self) -> dict:
        """``epoch`` and ``start``; combine with how far the epoch got to resume."""
        return {"epoch": self.epoch, "start": self.start}

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` returned."""
        self.set_epoch(state["epoch"])
        self.set_start(state["start"])


class TensorBatches:
    """Batches of in-memory ``(images, labels)`` for one pass over ``sampler``'s indices.

    ``sampler`` is any sized iterable of indices (a ``ShardedSampler``; ``None`` means all
    samples in order). ``transform`` is applied to each image batch (e.g. ``CifarAugment``).
    The last batch may be smaller unless ``drop_last``. Iterating again starts a new pass
    in the sampler's current order.

    Example::

        for x, y in TensorBatches(images, labels, 128, sampler, transform=augment):
            loss = F.cross_entropy(model(x), y)
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, batch_size: int,
                 sampler: Iterable[int] | None = None,
                 transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 drop_last: bool = False):
        if len(images) != len(labels):
            raise ValueError(f"TensorBatches: {len(images)} images but {len(labels)} labels")
        if batch_size < 1:
            raise ValueError(f"TensorBatches: batch_size must be >= 1, got {batch_size}")
        self.images = images
        self.labels = labels
        self.batch_size = batch_size
        self.sampler = sampler
        self.transform = transform
        self.drop_last = drop_last

    def _num_indices(self) -> int:
        return len(self.images) if self.sampler is None else len(self.sampler)  # type: ignore[arg-type]

    def __len__(self) -> int:
        n = self._num_indices()
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self.sampler is None:
            order = torch.arange(len(self.images))
        else:
            order = torch.as_tensor(list(self.sampler), dtype=torch.int64)
        for b in range(len(self)):
            idx = order[b * self.batch_size:(b + 1) * self.batch_size]
            x = self.images[idx.to(self.images.device)]
            if self.transform is not None:
                x = self.transform(x)
            yield x, self.labels[idx.to(self.labels.device)]
