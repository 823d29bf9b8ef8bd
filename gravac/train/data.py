"""Data loading without torchvision: CIFAR, PTB, digits, synthetic data and rank sharding.

Everything lives in memory as tensors: a data set is small enough (CIFAR is 150 MB of
uint8) and batching by indexing is much faster than a per-sample ``Dataset``. Every random
choice uses an explicit, seeded generator, never the global RNG, so runs are reproducible
and resumable.

Example (one epoch of CIFAR-10 on rank ``r`` of ``w``)::

    images, labels = load_cifar("/data", "cifar10", train=True)
    sampler = ShardedSampler(len(labels), rank=r, world_size=w, seed=0)
    augment = CifarAugment(CIFAR10_MEAN, CIFAR10_STD, seed=r)
    sampler.set_epoch(epoch)
    for x, y in TensorBatches(images, labels, 128, sampler, transform=augment):
        ...
"""
from __future__ import annotations

import math
import os
import pickle
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
from torch.nn import functional as F

__all__ = [
    "CIFAR10_MEAN", "CIFAR10_STD", "CIFAR100_MEAN", "CIFAR100_STD",
    "load_cifar", "Normalize", "CifarAugment", "cifar_transforms",
    "Dictionary", "Corpus", "load_ptb", "batchify", "get_bptt_batch", "shard_tokens",
    "ShardedSampler", "TensorBatches", "load_digits_dataset", "synthetic_text",
    "synthetic_images",
]

# ------------------------------------------------------------------------------ CIFAR

#: Per-channel mean / std of the CIFAR training sets, on pixels scaled to [0, 1].
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)

_CIFAR = {
    # dataset: (folder, train files, test files, label key, download URL)
    "cifar10": ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"],
                "labels", "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"),
    "cifar100": ("cifar-100-python", ["train"], ["test"], "fine_labels",
                 "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"),
}


def _cifar_howto(dataset: str, root: str) -> str:
    folder, _, _, _, url = _CIFAR[dataset]
    tv = "CIFAR10" if dataset == "cifar10" else "CIFAR100"
    return (f"download {url} and extract it into {root!r} (`tar xzf {url.rsplit('/', 1)[1]} "
            f"-C {root}` creates {folder}/), or, where torchvision works, run "
            f"torchvision.datasets.{tv}({root!r}, download=True)")


def _cifar_folder(root: str | os.PathLike, dataset: str) -> str:
    folder, train_files, _, _, _ = _CIFAR[dataset]
    root = os.fspath(root)
    path = os.path.join(root, folder)
    if os.path.isdir(path):
        return path
    # Also accept root pointing at the extracted folder itself.
    if os.path.basename(os.path.normpath(root)) == folder or \
            os.path.isfile(os.path.join(root, train_files[0])):
        return root
    raise FileNotFoundError(f"{dataset}: folder {path!r} not found (expected the python "
                            f"version of {dataset.upper()}: {folder}/ inside root={root!r}); "
                            f"{_cifar_howto(dataset, root)}")


def _read_cifar_file(path: str, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    # The official CIFAR files are Python 2 pickles: bytes keys under encoding="bytes".
    with open(path, "rb") as f:
        entry = pickle.load(f, encoding="bytes")
    entry = {(k.decode() if isinstance(k, bytes) else k): v for k, v in entry.items()}
    if "data" not in entry or label_key not in entry:
        raise ValueError(f"{path!r} is not a CIFAR batch file: it needs keys 'data' and "
                         f"{label_key!r}, found {sorted(entry)}")
    data = np.asarray(entry["data"], dtype=np.uint8)
    labels = np.asarray(entry[label_key], dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or len(labels) != len(data):
        raise ValueError(f"{path!r}: expected data [N, 3072] and N labels, got data "
                         f"{data.shape} and {len(labels)} labels")
    return data, labels


def load_cifar(root: str | os.PathLike, dataset: str = "cifar10",
               train: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Read CIFAR-10/100 from the official python-pickle folder under ``root``.

    ``root`` holds ``cifar-10-batches-py/`` (``data_batch_1..5``, ``test_batch``) or
    ``cifar-100-python/`` (``train``, ``test``; the 100 fine labels are used); it may also
    be that folder itself. Each row of 3072 bytes is the red, green then blue 32x32 plane,
    row-major, so it reshapes directly to ``[3, 32, 32]``.

    Returns ``(images, labels)``: uint8 ``[N, 3, 32, 32]`` and int64 ``[N]``.

    Example::

        images, labels = load_cifar("/data", "cifar100", train=False)   # [10000, 3, 32, 32]
    """
    if dataset not in _CIFAR:
        raise ValueError(f"unknown dataset {dataset!r}; expected one of {', '.join(_CIFAR)}")
    folder = _cifar_folder(root, dataset)
    _, train_files, test_files, label_key, _ = _CIFAR[dataset]
    names = train_files if train else test_files
    missing = [n for n in names if not os.path.isfile(os.path.join(folder, n))]
    if missing:
        raise FileNotFoundError(f"{dataset}: missing file(s) {', '.join(missing)} in "
                                f"{folder!r} (expected {', '.join(names)}); the extraction "
                                f"looks incomplete: {_cifar_howto(dataset, os.fspath(root))}")
    parts = [_read_cifar_file(os.path.join(folder, n), label_key) for n in names]
    data = np.concatenate([p[0] for p in parts])
    labels = np.concatenate([p[1] for p in parts])
    return torch.from_numpy(data.reshape(-1, 3, 32, 32)), torch.from_numpy(labels)


class Normalize:
    """Per-channel normalisation of an image batch: ``(x / 255 - mean) / std``.

    uint8 input is scaled to [0, 1] first; floating input is taken as already in [0, 1].
    This is the CIFAR evaluation transform.

    Example::

        x = Normalize(CIFAR10_MEAN, CIFAR10_STD)(images[:128])   # float32 [128, 3, 32, 32]
    """

    def __init__(self, mean: Sequence[float] = CIFAR10_MEAN, std: Sequence[float] = CIFAR10_STD):
        if len(mean) != len(std) or any(s <= 0 for s in std):
            raise ValueError(f"Normalize: mean and std need one entry per channel and std > 0, "
                             f"got mean={tuple(mean)} std={tuple(std)}")
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        if images.dim() != 4 or images.shape[1] != self.mean.shape[1]:
            raise ValueError(f"Normalize: expected a batch [N, {self.mean.shape[1]}, H, W], got "
                             f"shape {tuple(images.shape)}")
        x = images.float().div_(255.0) if images.dtype == torch.uint8 else images.float()
        return (x - self.mean.to(x.device)) / self.std.to(x.device)


class CifarAugment:
    """Standard CIFAR training augmentation on a uint8 batch, with its own generator.

    Per image: random 32x32 crop of the image zero-padded by ``padding`` pixels, random
    horizontal flip (probability 1/2), then ``Normalize(mean, std)``. The draws come from
    ``generator`` (or a new one seeded with ``seed``), never from the global RNG; seed it
    differently per rank so ranks do not augment identically. ``state_dict`` /
    ``load_state_dict`` save the generator for exact resume.

    Example::

        augment = CifarAugment(CIFAR10_MEAN, CIFAR10_STD, seed=rank)
        x = augment(images[idx])            # uint8 [B, 3, 32, 32] -> float32 [B, 3, 32, 32]
    """

    def __init__(self, mean: Sequence[float] = CIFAR10_MEAN, std: Sequence[float] = CIFAR10_STD,
                 padding: int = 4, flip: bool = True, seed: int = 0,
                 generator: torch.Generator | None = None):
        if padding < 0:
            raise ValueError(f"CifarAugment: padding must be >= 0, got {padding}")
        self.normalize = Normalize(mean, std)
        self.padding = int(padding)
        self.flip = flip
        self.generator = generator if generator is not None else torch.Generator().manual_seed(seed)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        if images.dim() != 4:
            raise ValueError(f"CifarAugment: expected a batch [N, C, H, W], got shape "
                             f"{tuple(images.shape)}")
        n, _, h, w = images.shape
        x = images
        if self.padding:
            p = self.padding
            x = F.pad(x, (p, p, p, p))  # zero fill, as torchvision's RandomCrop(padding=4)
            # Offsets drawn on the CPU generator, then used on the images' device.
            oy = torch.randint(0, 2 * p + 1, (n,), generator=self.generator).to(x.device)
            ox = torch.randint(0, 2 * p + 1, (n,), generator=self.generator).to(x.device)
            rows = (oy[:, None] + torch.arange(h, device=x.device))[:, None, :, None]
            cols = (ox[:, None] + torch.arange(w, device=x.device))[:, None, None, :]
            batch = torch.arange(n, device=x.device)[:, None, None, None]
            chans = torch.arange(x.shape[1], device=x.device)[None, :, None, None]
            x = x[batch, chans, rows, cols]
        if self.flip:
            flip = (torch.rand(n, generator=self.generator) < 0.5).to(x.device)
            x = torch.where(flip[:, None, None, None], x.flip(-1), x)
        return self.normalize(x)

    def state_dict(self) -> dict:
        """The generator state, to resume augmentation exactly."""
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` returned."""
        self.generator.set_state(state["generator"])


def cifar_transforms(dataset: str = "cifar10", seed: int = 0) -> tuple[CifarAugment, Normalize]:
    """``(train_transform, eval_transform)`` with the data set's mean/std.

    Example::

        train_tf, eval_tf = cifar_transforms("cifar100", seed=rank)
    """
    stats = {"cifar10": (CIFAR10_MEAN, CIFAR10_STD), "cifar100": (CIFAR100_MEAN, CIFAR100_STD)}
    if dataset not in stats:
        raise ValueError(f"unknown dataset {dataset!r}; expected one of {', '.join(stats)}")
    mean, std = stats[dataset]
    return CifarAugment(mean, std, seed=seed), Normalize(mean, std)


# ------------------------------------------------------------------------------ PTB

PTB_FILES = ("ptb.train.txt", "ptb.valid.txt", "ptb.test.txt")


@dataclass
class Dictionary:
    """Word <-> id mapping, ids in order of first appearance.

    Example::

        d = Dictionary(); d.add_word("the"); d.word2idx["the"], d.idx2word[0]   # 0, "the"
    """

    word2idx: dict[str, int] = field(default_factory=dict)
    idx2word: list[str] = field(default_factory=list)

    def add_word(self, word: str) -> int:
        """The id of ``word``, adding it if new."""
        idx = self.word2idx.get(word)
        if idx is None:
            idx = self.word2idx[word] = len(self.idx2word)
            self.idx2word.append(word)
        return idx

    def __len__(self) -> int:
        return len(self.idx2word)


@dataclass
class Corpus:
    """A tokenised corpus: ``dictionary`` and 1-D int64 token streams ``train/valid/test``.

    Example::

        corpus = load_ptb("/data/ptb"); len(corpus.dictionary)   # 10000
    """

    dictionary: Dictionary
    train: torch.Tensor
    valid: torch.Tensor
    test: torch.Tensor


def _read_words(path: str) -> list[str]:
    words: list[str] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            # One sentence per line; <eos> marks its end, as in pytorch/examples.
            words.extend(line.split())
            words.append("<eos>")
    return words


def load_ptb(root: str | os.PathLike) -> Corpus:
    """Read the Mikolov Penn Treebank files ``ptb.{train,valid,test}.txt`` from ``root``.

    Each line is a sentence; "<eos>" is appended to each. The vocabulary is built from the
    training file (ids in order of first appearance); a valid/test word missing from it
    becomes "<unk>" (already a PTB word; added to the vocabulary if absent).

    Example::

        corpus = load_ptb("/data/ptb")
        train = batchify(corpus.train, batch_size=20)     # [46479, 20]
    """
    root = os.fspath(root)
    missing = [n for n in PTB_FILES if not os.path.isfile(os.path.join(root, n))]
    if missing:
        raise FileNotFoundError(
            f"ptb: missing {', '.join(missing)} in {root!r} (expected {', '.join(PTB_FILES)} "
            f"there). Get the Mikolov PTB files from the simple-examples tarball "
            f"(http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz, folder "
            f"simple-examples/data/) or from the data/penn/ folder of pytorch/examples "
            f"word_language_model (train.txt, valid.txt, test.txt: rename them to "
            f"ptb.train.txt, ptb.valid.txt, ptb.test.txt), and put them into {root!r}")
    dictionary = Dictionary()
    train_words = _read_words(os.path.join(root, PTB_FILES[0]))
    train = torch.tensor([dictionary.add_word(w) for w in train_words], dtype=torch.int64)

    def encode(name: str) -> torch.Tensor:
        ids = []
        for w in _read_words(os.path.join(root, name)):
            idx = dictionary.word2idx.get(w)
            ids.append(idx if idx is not None else dictionary.add_word("<unk>"))
        return torch.tensor(ids, dtype=torch.int64)

    return Corpus(dictionary, train, encode(PTB_FILES[1]), encode(PTB_FILES[2]))


def shard_tokens(tokens: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s contiguous slice of a token stream split into ``world_size`` equal parts.

    Call before ``batchify`` so each rank trains on its own text; the last
    ``len(tokens) % world_size`` tokens are dropped so the shards have equal length.

    Example::

        train = batchify(shard_tokens(corpus.train, rank, world_size), batch_size=20)
    """
    _check_rank(rank, world_size)
    size = tokens.numel() // world_size
    if size == 0:
        raise ValueError(f"shard_tokens: {tokens.numel()} tokens cannot be split across "
                         f"{world_size} ranks")
    return tokens[rank * size:(rank + 1) * size]


def batchify(tokens: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Cut a 1-D token stream into ``batch_size`` columns: ``[steps, batch_size]``.

    Column ``j`` is the contiguous stretch ``tokens[j * steps:(j + 1) * steps]``; the
    trailing ``len % batch_size`` tokens are dropped (as in pytorch/examples).

    Example::

        batchify(torch.arange(10), 3)     # [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    """
    if tokens.dim() != 1:
        raise ValueError(f"batchify: expected a 1-D token stream, got shape {tuple(tokens.shape)}")
    if batch_size < 1:
        raise ValueError(f"batchify: batch_size must be >= 1, got {batch_size}")
    steps = tokens.numel() // batch_size
    if steps == 0:
        raise ValueError(f"batchify: {tokens.numel()} tokens are fewer than batch_size="
                         f"{batch_size}; use a smaller batch size")
    return tokens[:steps * batch_size].view(batch_size, steps).t().contiguous()


def get_bptt_batch(source: torch.Tensor, i: int, bptt: int = 35
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The truncated-BPTT window starting at row ``i`` of a batchified ``source``.

    Returns ``(input, target)``: input ``[seq_len, batch]`` = ``source[i:i+seq_len]`` and
    the flat target ``[seq_len * batch]`` = ``source[i+1:i+1+seq_len]``, i.e. the next
    token of each input position, with ``seq_len = min(bptt, len(source) - 1 - i)``.

    Example::

        for i in range(0, train.size(0) - 1, 35):
            x, y = get_bptt_batch(train, i)
            logits, hidden = model(x, hidden)
            loss = F.cross_entropy(logits, y)
    """
    if bptt < 1:
        raise ValueError(f"get_bptt_batch: bptt must be >= 1, got {bptt}")
    if not 0 <= i < len(source) - 1:
        raise ValueError(f"get_bptt_batch: i={i} out of range; a source of {len(source)} rows "
                         f"allows 0 <= i < {len(source) - 1}")
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)


# ------------------------------------------------------------------------------ sharding


def _check_rank(rank: int, world_size: int) -> None:
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
        _check_rank(rank, world_size)
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


# ------------------------------------------------------------------------------ digits


def load_digits_dataset(train: bool = True, test_fraction: float = 0.2,
                        seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's 8x8 handwritten digits (1,797 images, 10 classes; ships with it).

    Returns ``(images, labels)``: float32 ``[N, 1, 8, 8]`` in [0, 1] and int64 ``[N]``. The
    train/test split is a permutation seeded with ``seed``, so the two calls
    (``train=True`` / ``False``) with the same arguments give disjoint, complementary sets.

    Example::

        x, y = load_digits_dataset(train=True)     # [1438, 1, 8, 8], [1438]
        model = SmallCNN(num_classes=10, in_channels=1, image_size=8)
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"load_digits_dataset: test_fraction must be in (0, 1), got {test_fraction}")
    from sklearn.datasets import load_digits  # imported here: only the demo needs sklearn

    digits = load_digits()
    # Pixel values are counts 0..16 (4x4 blocks of a 32x32 bitmap).
    images = torch.as_tensor(digits.images, dtype=torch.float32).div_(16.0).unsqueeze(1)
    labels = torch.as_tensor(digits.target, dtype=torch.int64)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    n_test = max(1, round(len(labels) * test_fraction))
    idx = order[n_test:] if train else order[:n_test]
    return images[idx].contiguous(), labels[idx].contiguous()


# ------------------------------------------------------------------------------ synthetic


def synthetic_text(num_tokens: int, vocab_size: int, seed: int = 0, branching: int = 4,
                   noise: float = 0.05, zipf: float = 0.0) -> torch.Tensor:
    """A learnable token stream from a random sparse Markov chain, int64 ``[num_tokens]``.

    Each token has ``branching`` successors drawn once from the vocabulary, taken with
    probabilities decreasing as 1/2, 1/4, ...; with probability ``noise`` the next token is
    drawn afresh instead. A model that learns the chain reaches a perplexity of about
    ``branching`` or less, far below ``vocab_size`` (uniform noise would not be learnable).
    With ``zipf`` > 0, successors and fresh tokens are drawn with probability proportional
    to ``1 / rank ** zipf`` (word frequencies in real text follow such a law, ``zipf`` ~ 1):
    a large vocabulary whose frequent words are learnt quickly and whose rare rows of the
    embedding and output layers get rare gradients, as with real text.

    Example::

        tokens = synthetic_text(100_000, vocab_size=1000, seed=0)
        train = batchify(tokens, batch_size=20)
    """
    if num_tokens < 1 or vocab_size < 2 or branching < 1:
        raise ValueError(f"synthetic_text: need num_tokens >= 1, vocab_size >= 2, branching >= 1, "
                         f"got {num_tokens}, {vocab_size}, {branching}")
    if not 0.0 <= noise <= 1.0:
        raise ValueError(f"synthetic_text: noise must be in [0, 1], got {noise}")
    if zipf < 0:
        raise ValueError(f"synthetic_text: zipf must be >= 0 (0 = uniform), got {zipf}")
    rng = np.random.default_rng(seed)
    if zipf > 0:
        word_p = 1.0 / np.arange(1, vocab_size + 1) ** zipf
        word_p /= word_p.sum()
        successors = rng.choice(vocab_size, size=(vocab_size, branching), p=word_p)
        uniform = rng.choice(vocab_size, size=num_tokens, p=word_p)
    else:
        successors = rng.integers(0, vocab_size, size=(vocab_size, branching))
        uniform = rng.integers(0, vocab_size, size=num_tokens)
    slot_p = 0.5 ** np.arange(1, branching + 1)
    slot_p /= slot_p.sum()
    slots = rng.choice(branching, size=num_tokens, p=slot_p)
    is_noise = rng.random(num_tokens) < noise
    # The chain is sequential; plain Python lists make this loop ~10x faster than numpy scalars.
    succ = successors.tolist()
    slots_l, uniform_l, noise_l = slots.tolist(), uniform.tolist(), is_noise.tolist()
    out = [0] * num_tokens
    cur = uniform_l[0]
    for t in range(num_tokens):
        out[t] = cur
        cur = uniform_l[t] if noise_l[t] else succ[cur][slots_l[t]]
    return torch.tensor(out, dtype=torch.int64)


def synthetic_images(n: int, num_classes: int, image_size: int = 32, channels: int = 3,
                     seed: int = 0, noise_std: float = 40.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Learnable class-dependent images, in the same format as ``load_cifar``.

    Each class has a smooth random pattern (a 4x4 grid upsampled, mirrored so that
    horizontal flips keep it); an image is its class pattern plus Gaussian pixel noise of
    ``noise_std`` (on the 0..255 scale). Classes are balanced and shuffled.

    Returns ``(images, labels)``: uint8 ``[n, channels, image_size, image_size]``, int64 ``[n]``.

    Example::

        images, labels = synthetic_images(5000, num_classes=10, seed=0)
        x = Normalize()(images[:64])       # or CifarAugment, as for CIFAR
    """
    if n < 1 or num_classes < 1 or image_size < 1 or channels < 1:
        raise ValueError(f"synthetic_images: n, num_classes, image_size and channels must be >= 1, "
                         f"got {n}, {num_classes}, {image_size}, {channels}")
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand(num_classes, channels, 4, 4, generator=g)
    patterns = F.interpolate(coarse, size=(image_size, image_size), mode="bilinear",
                             align_corners=False)
    patterns = 0.5 * (patterns + patterns.flip(-1))
    # Stretch each pattern to the full 0..255 range so classes differ by more than the noise.
    lo = patterns.amin(dim=(1, 2, 3), keepdim=True)
    hi = patterns.amax(dim=(1, 2, 3), keepdim=True)
    patterns = (patterns - lo) / (hi - lo).clamp_min(1e-6) * 255.0
    labels = (torch.arange(n) % num_classes)[torch.randperm(n, generator=g)]
    images = torch.empty(n, channels, image_size, image_size, dtype=torch.uint8)
    chunk = 4096  # bounded float temporaries for large n
    for s in range(0, n, chunk):
        lab = labels[s:s + chunk]
        x = patterns[lab] + noise_std * torch.randn(len(lab), channels, image_size, image_size,
                                                    generator=g)
        images[s:s + chunk] = x.round_().clamp_(0, 255).to(torch.uint8)
    return images, labels
