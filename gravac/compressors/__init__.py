"""Gradient compressors: pure tensor code, one file per method. Sparsifiers select k
entries of a layer; ``powersgd`` is the low-rank kind (``is_lowrank``: the engine sends
its factors by allreduce, see gravac/engine/exchanges/lowrank.py).

Example::

    from gravac import compressors
    comp = compressors.get("topk")
    comp.select(torch.tensor([0.1, -3.0, 2.0]), 1)   # tensor([1])
"""
from __future__ import annotations

import inspect

from ..util.sizes import num_kept
from .base import Compressor, SelectContext
from .dgc import DGC
from .none import NoCompression
from .powersgd import PowerSGD
from .randomk import RandomK
from .redsync import RedSync
from .topk import TopK


REGISTRY: dict[str, type[Compressor]] = {
    "topk": TopK,
    "dgc": DGC,
    "redsync": RedSync,
    "randomk": RandomK,
    "none": NoCompression,
    "powersgd": PowerSGD,
}


def get(name: str | Compressor, **options) -> Compressor:
    """Build a compressor by name (``topk``, ``dgc``, ``redsync``, ``randomk``, ``none``,
    ``powersgd``).

    An instance is returned as is (options are then not allowed).

    Example::

        comp = gravac.compressors.get("dgc", sample_fraction=0.02)
    """
    if isinstance(name, Compressor):
        if options:
            raise ValueError(f"compressor options {sorted(options)} given with a compressor "
                             "instance; configure the instance instead")
        return name
    if not isinstance(name, str) or name.lower() not in REGISTRY:
        raise ValueError(f"unknown compressor {name!r}; known compressors: {', '.join(REGISTRY)}")
    cls = REGISTRY[name.lower()]
    allowed = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for compressor {name!r}; "
                         f"allowed: {allowed or 'none'}")
    return cls(**options)


__all__ = ["Compressor", "SelectContext", "num_kept", "get", "REGISTRY",
           "TopK", "DGC", "RedSync", "RandomK", "NoCompression", "PowerSGD"]
