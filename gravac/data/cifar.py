"""CIFAR-10/100 from the official python-pickle folders, normalisation and augmentation."""
from __future__ import annotations

import os
import pickle
from typing import Sequence

import numpy as np
import torch
from torch.nn import functional as F

from .errors import DataFileError, check_root


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


_ARCHIVE = {"cifar10": "cifar-10-python.tar.gz", "cifar100": "cifar-100-python.tar.gz"}


def _cifar_howto(dataset: str, root: str) -> str:
    folder, _, _, _, url = _CIFAR[dataset]
    tv = "CIFAR10" if dataset == "cifar10" else "CIFAR100"
    return (f"download {url} and extract it into {root!r} (`tar xzf {url.rsplit('/', 1)[1]} "
            f"-C {root}` creates {folder}/), or, where torchvision works, run "
            f"torchvision.datasets.{tv}({root!r}, download=True)")


def _cifar_folder(root: str | os.PathLike, dataset: str) -> str:
    folder, train_files, _, _, _ = _CIFAR[dataset]
    root = os.fspath(root)
    check_root(root, f"{folder}/")
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


def _read_cifar_file(path: str, label_key: str, dataset: str = "cifar10"
                     ) -> tuple[np.ndarray, np.ndarray]:
    fix = f"extract the official {_ARCHIVE[dataset]} again (the python version)"
    # The official CIFAR files are Python 2 pickles: bytes keys under encoding="bytes".
    try:
        with open(path, "rb") as f:
            entry = pickle.load(f, encoding="bytes")
    except EOFError:
        raise DataFileError(path, "ends too early (a truncated download or copy)", fix) from None
    except pickle.UnpicklingError as exc:
        problem = ("ends too early (a truncated download or copy)" if "truncated" in str(exc)
                   else f"not a CIFAR batch file (UnpicklingError: {exc})")
        raise DataFileError(path, problem, fix) from None
    except (ValueError, TypeError, AttributeError, ImportError, IndexError, KeyError,
            UnicodeDecodeError) as exc:
        raise DataFileError(path, f"not a CIFAR batch file ({type(exc).__name__}: {exc})",
                            fix) from None
    if not isinstance(entry, dict):
        raise DataFileError(path, f"not a CIFAR batch file (it holds a "
                                  f"{type(entry).__name__}, not a dict)", fix)
    entry = {(k.decode() if isinstance(k, bytes) else k): v for k, v in entry.items()}
    if "data" not in entry or label_key not in entry:
        raise DataFileError(path, f"not a CIFAR batch file: it needs keys 'data' and "
                                  f"{label_key!r}, found {sorted(map(str, entry))}", fix)
    try:
        data = np.asarray(entry["data"], dtype=np.uint8)
        labels = np.asarray(entry[label_key], dtype=np.int64)
    except (TypeError, ValueError) as exc:
        raise DataFileError(path, f"its 'data' or {label_key!r} are not numbers ({exc})",
                            fix) from None
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or labels.ndim != 1 \
            or len(labels) != len(data) or len(data) == 0:
        raise DataFileError(path, f"expected data [N, 3072] and N labels, got data "
                                  f"{list(data.shape)} and {labels.size} labels", fix)
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
    parts = [_read_cifar_file(os.path.join(folder, n), label_key, dataset) for n in names]
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
