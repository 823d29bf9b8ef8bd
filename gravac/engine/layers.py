"""The layers a step engine communicates: names, sizes and which ones are compressed.

Built once from the optimizer's param groups in their order, which is the same on every
rank (the same model), so every rank packs and reduces the same layers in the same order.

Example::

    layers = build_layers(opt.param_groups, model.named_parameters(), 1024, compressor)
    [l.name for l in layers if l.compressible]
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Layer:
    """One parameter taking part in the exchange; ``index`` is its collective order."""

    index: int
    name: str
    param: torch.Tensor
    numel: int
    compressible: bool


#: What ``torch.compile`` puts before the names of a compiled model's parameters: left out,
#: so that a checkpoint moves between the compiled and the eager model.
COMPILED_PREFIX = "_orig_mod."


def positional_names(param_groups) -> list[tuple[str, torch.Tensor]]:
    """Names by position, as Horovod gives them when ``named_parameters`` is None."""
    return [(f"allreduce.noname.{i}.{j}", p) for i, group in enumerate(param_groups)
            for j, p in enumerate(group["params"])]


def build_layers(param_groups, named_parameters, min_compress_numel: int, compressor) -> list[Layer]:
    """Validate names and build the layer list in param-group order (same on all ranks).
    ``named_parameters`` None names them by position (``positional_names``)."""
    if named_parameters is None:
        named_parameters = positional_names(param_groups)
    named = list(named_parameters)
    for item in named:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise ValueError("named_parameters must be a sequence of (name, parameter) tuples, "
                             "usually model.named_parameters()")
    for name, _ in named:
        if not isinstance(name, str) or not name:
            raise ValueError(f"every parameter needs a non-empty string name, got {name!r}; "
                             "use model.named_parameters() or name each parameter")
    seen, dups = set(), set()
    for name, _ in named:
        (dups if name in seen else seen).add(name)
    if dups:
        raise ValueError(f"parameter names must be unique; duplicated: {', '.join(sorted(dups))}")
    names_by_id = {id(p): name.replace(COMPILED_PREFIX, "") for name, p in named}
    layers, unnamed = [], []
    for group in param_groups:
        for p in group["params"]:
            if id(p) not in names_by_id:
                unnamed.append(tuple(p.shape))
                continue
            if not p.requires_grad:
                continue  # frozen: never has a gradient, never communicated
            compressible = (not compressor.is_dense and p.numel() >= min_compress_numel
                            and p.is_floating_point())
            layers.append(Layer(len(layers), names_by_id[id(p)], p, p.numel(), compressible))
    if unnamed:
        raise ValueError(f"{len(unnamed)} optimizer parameter(s) have no name in named_parameters "
                         f"(shapes {unnamed[:5]}); pass named_parameters covering every parameter "
                         "the optimizer updates")
    return layers
