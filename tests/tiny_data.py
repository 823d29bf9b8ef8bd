"""Tiny data sets in the real on-disk formats (CIFAR python pickles, PTB text files)."""
import pickle
from pathlib import Path

import numpy as np


def _pickle(path: Path, entry: dict) -> None:
    with open(path, "wb") as f:
        pickle.dump(entry, f, protocol=2)   # the official files are Python 2 pickles


def write_cifar10(root, per_file: int = 20, seed: int = 0) -> Path:
    """``root/cifar-10-batches-py`` with data_batch_1..5 and test_batch."""
    rng = np.random.default_rng(seed)
    folder = Path(root) / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        _pickle(folder / name, {b"data": rng.integers(0, 256, (per_file, 3072), dtype=np.uint8),
                                b"labels": rng.integers(0, 10, per_file).tolist()})
    return Path(root)


def write_cifar100(root, n_train: int = 100, n_test: int = 40, seed: int = 0) -> Path:
    """``root/cifar-100-python`` with train and test."""
    rng = np.random.default_rng(seed)
    folder = Path(root) / "cifar-100-python"
    folder.mkdir(parents=True, exist_ok=True)
    for name, n in (("train", n_train), ("test", n_test)):
        _pickle(folder / name, {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                                b"fine_labels": rng.integers(0, 100, n).tolist(),
                                b"coarse_labels": rng.integers(0, 20, n).tolist()})
    return Path(root)


def write_ptb(root, words: int = 3000, vocab: int = 50, seed: int = 0) -> Path:
    """``root/ptb.{train,valid,test}.txt``: sentences of random words from a small vocabulary."""
    rng = np.random.default_rng(seed)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    names = [f"w{i}" for i in range(vocab)]
    for split, n in (("train", words), ("valid", words // 5), ("test", words // 5)):
        tokens = [names[i] for i in rng.integers(0, vocab, n)]
        lines = [" " + " ".join(tokens[i:i + 12]) + " " for i in range(0, n, 12)]
        (root / f"ptb.{split}.txt").write_text("\n".join(lines) + "\n")
    return root
