"""scikit-learn's 8x8 handwritten digits (shipped with scikit-learn): the demo's data."""
from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np
import torch


def _digits_csv() -> Path:
    """scikit-learn's ``digits.csv.gz``, found without importing scikit-learn (its import
    costs ~2 s in every process of the demo and the tests)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the digits data ship with scikit-learn: pip install scikit-learn "
                          "(requirements.txt pins it)")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            return path
    raise FileNotFoundError("scikit-learn is installed without its datasets/data/digits.csv.gz")


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
    # The file sklearn.datasets.load_digits reads: one row per image, 64 pixels, the label.
    with gzip.open(_digits_csv(), "rt") as f:
        data = np.loadtxt(f, delimiter=",")
    # Pixel values are counts 0..16 (4x4 blocks of a 32x32 bitmap).
    images = torch.as_tensor(data[:, :-1].reshape(-1, 1, 8, 8), dtype=torch.float32).div_(16.0)
    labels = torch.as_tensor(data[:, -1].astype(np.int64))
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    n_test = max(1, round(len(labels) * test_fraction))
    idx = order[n_test:] if train else order[:n_test]
    return images[idx].contiguous(), labels[idx].contiguous()
