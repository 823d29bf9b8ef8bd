"""Data loading without torchvision: CIFAR, PTB, digits, synthetic data and rank sharding,
one subject per file (cifar.py, ptb.py, samplers.py, digits.py, synthetic.py).

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
from .cifar import (CIFAR10_MEAN, CIFAR10_STD, CIFAR100_MEAN, CIFAR100_STD, CifarAugment, Normalize,
                    cifar_transforms, load_cifar)
from .digits import load_digits_dataset
from .errors import DataFileError
from .ptb import PTB_FILES, Corpus, Dictionary, batchify, get_bptt_batch, load_ptb, shard_tokens
from .samplers import ShardedSampler, TensorBatches
from .synthetic import synthetic_images, synthetic_text

__all__ = [
    "CIFAR10_MEAN", "CIFAR10_STD", "CIFAR100_MEAN", "CIFAR100_STD",
    "load_cifar", "Normalize", "CifarAugment", "cifar_transforms",
    "Dictionary", "Corpus", "load_ptb", "batchify", "get_bptt_batch", "shard_tokens",
    "ShardedSampler", "TensorBatches", "load_digits_dataset", "synthetic_text",
    "synthetic_images", "PTB_FILES", "DataFileError",
]
