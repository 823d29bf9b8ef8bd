"""Buckets, and the backward hooks that start them (``overlap=True``).

The step pipeline (``step.py``) sends the layers bucket by bucket. Without overlap the
whole model is one bucket, which ``synchronize()`` starts itself. With overlap the layers
are cut into buckets once, in reverse order (backward produces the last layer's gradient
first), each holding about ``bucket_cap_mb`` of gradient; the cut depends only on the
model, so it is the same on every rank. ``BackwardHooks`` registers a
post-accumulate-grad hook on every parameter; when every layer of the next bucket has its
gradient (after ``backward_passes_per_step`` backward passes), the pipeline starts that
bucket while autograd goes on with the layers below: the NaN/Inf scan, error feedback,
selection, and, at a level the plan fixed already (Static, Accordion, GraVAC with
``decide="previous"``), the residual update and the bucket's exchange.

Buckets start strictly in order: a bucket whose gradients are ready before its
predecessor's waits for it, so every rank issues the same collectives in the same order
whatever order backward ran in (as DDP's reducer does). ``step()`` starts the buckets
still waiting (a layer without a gradient on this rank is sent as zeros).

Example::

    opt = wrap_optimizer(sgd, model.named_parameters(), comm, controller=Static(cf=100),
                         overlap=True)
    loss.backward()          # buckets leave as their gradients are produced
    opt.step()               # waits for them, writes the averaged gradients, updates
"""
from __future__ import annotations

from typing import Callable

from .layers import Layer

#: The first bucket closes at 1 MiB (or the cap, if smaller), as DDP's: the last layers'
#: gradients leave early, while most of backward is still ahead.
FIRST_BUCKET_BYTES = 2**20


def build_buckets(layers: list[Layer], cap_bytes: int) -> list[list[Layer]]:
    """The layers in reverse order, cut after a bucket reaches ``cap_bytes`` of gradient
    (the first one at ``FIRST_BUCKET_BYTES`` already; a layer larger than the cap is a
    bucket of its own). Depends only on the model."""
    buckets: list[list[Layer]] = []
    current: list[Layer] = []
    size = 0
    for layer in reversed(layers):
        current.append(layer)
        size += layer.numel * layer.param.element_size()
        if size >= (min(cap_bytes, FIRST_BUCKET_BYTES) if not buckets else cap_bytes):
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


class BackwardHooks:
    """Calls ``on_ready(layer)`` when a layer's gradient of the step is complete (after
    ``backward_passes_per_step`` passes). One owner per parameter: a second overlapped
    optimizer on the same model would start collectives nobody waits for."""

    def __init__(self, layers: list[Layer], on_ready: Callable[[Layer], None],
                 backward_passes_per_step: int):
        self.layers = layers
        self.on_ready = on_ready
        self.backward_passes_per_step = backward_passes_per_step
        self._layer_of = {id(l.param): l for l in layers}
        self._passes = [0] * len(layers)
        for layer in layers:
            owner = getattr(layer.param, "_gravac_overlap", None)
            if owner is not None and owner is not self:
                raise ValueError(f"parameter {layer.name} already has the backward hooks of "
                                 "another overlapped gravac optimizer; call its "
                                 "remove_hooks() before wrapping the model again")
        self._handles = [l.param.register_post_accumulate_grad_hook(self._on_grad)
                         for l in layers]
        for layer in layers:
            layer.param._gravac_overlap = self

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for layer in self.layers:
            if getattr(layer.param, "_gravac_overlap", None) is self:
                del layer.param._gravac_overlap

    def reset(self) -> None:
        """A new step: no pass counted yet."""
        self._passes = [0] * len(self.layers)

    def _on_grad(self, param) -> None:
        layer = self._layer_of[id(param)]
        passes = self._passes[layer.index] + 1
        if passes > self.backward_passes_per_step:
            raise RuntimeError(
                f"the gradient of {layer.name} was computed {passes} times before step(); "
                f"backward_passes_per_step={self.backward_passes_per_step}: call step() (or "
                "synchronize()) after that many backward passes, or raise it")
        self._passes[layer.index] = passes
        if passes == self.backward_passes_per_step:   # accumulating: the last pass sends
            self.on_ready(layer)
