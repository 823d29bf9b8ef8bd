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

from ..util.choices import did_you_mean
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
        raise ValueError(f"unknown compressor {name!r}; known compressors: {', '.join(REGISTRY)}"
                         f"{did_you_mean(name, REGISTRY)}")
    cls = REGISTRY[name.lower()]
    allowed = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for compressor {name!r}; "
                         f"allowed: {allowed or 'none'}{did_you_mean(unknown[0], allowed)}")
    _check_option_types(cls, options)
    return cls(**options)


def _check_option_types(cls, options: dict) -> None:
    """Each option of the kind its default is (a bool, a whole number, a number), named in
    one line: a string where a number goes failed deep in the compressor's own checks
    ("'<' not supported between ...")."""
    defaults = inspect.signature(cls.__init__).parameters
    for option, value in options.items():
        default = defaults[option].default
        if isinstance(default, bool):
            ok, kind = isinstance(value, bool), "true or false"
        elif isinstance(default, int):
            ok, kind = isinstance(value, int) and not isinstance(value, bool), "a whole number"
        elif isinstance(default, float):
            ok, kind = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
        else:
            continue
        if not ok:
            raise ValueError(f"{cls.name}: option {option}={value!r} must be {kind}")


__all__ = ["Compressor", "SelectContext", "num_kept", "get", "REGISTRY",
           "TopK", "DGC", "RedSync", "RandomK", "NoCompression", "PowerSGD"]
