"""Error-feedback (residual) memory: what a rank did not send, added to its next gradient.

One residual per parameter name, local to the rank, starting at zero. The memory keeps
its residual in a buffer of its own and ``compensate`` writes g_ef into that buffer, so
a step allocates nothing: ``update`` then subtracts what was sent in place.

Example::

    memory = ResidualMemory()
    g_ef = memory.compensate("fc.weight", grad)          # grad + residual (1-D)
    idx = compressor.select(g_ef, k)
    memory.update("fc.weight", g_ef, SparseSent(idx, g_ef[idx]))
    memory["fc.weight"]                                    # residual, shaped like grad
"""
from __future__ import annotations

from typing import Mapping, NamedTuple

import torch


class SparseSent(NamedTuple):
    """What a rank sent of one layer: ``values`` at flat ``indices``."""

    indices: torch.Tensor
    values: torch.Tensor


class ResidualMemory:
    """Per-parameter residuals with ``compensate``/``update`` and a state dict.

    ``compensate(name, grad)`` returns g_ef = grad + residual as a flat tensor that
    aliases the memory's buffer: read it (compress, pack, take norms) before calling
    ``update(name, g_ef, sent)``, which leaves residual = g_ef − sent. ``sent`` is either a
    dense tensor with g_ef's number of elements, a ``SparseSent``, or ``None`` for "all of
    g_ef was sent" (dense fallback: the residual becomes zero).
    """

    def __init__(self):
        self._buffers: dict[str, torch.Tensor] = {}
        self._shapes: dict[str, torch.Size] = {}
        self._zero: set[str] = set()     # residuals known to be all zeros

    @staticmethod
    def dtype_for(grad_dtype: torch.dtype) -> torch.dtype:
        """Residuals of fp16/bf16 gradients are kept in fp32: error feedback adds up many
        small leftovers, which 8-11 bits of mantissa would round away."""
        return torch.float32 if grad_dtype in (torch.float16, torch.bfloat16) else grad_dtype

    def _buffer(self, name: str, grad: torch.Tensor) -> torch.Tensor:
        buf = self._buffers.get(name)
        if buf is None:
            buf = torch.zeros(grad.numel(), dtype=self.dtype_for(grad.dtype), device=grad.device)
            self._buffers[name] = buf
            self._shapes[name] = grad.shape
            self._zero.add(name)
        elif buf.numel() != grad.numel():
            raise ValueError(f"residual of {name!r} has {buf.numel()} elements but the gradient "
                             f"has {grad.numel()}; parameter shapes must not change during training")
        return buf

    def compensate(self, name: str, grad: torch.Tensor) -> torch.Tensor:
        """g_ef = grad + residual, flat, written into (and aliasing) the residual buffer."""
        buf = self._buffer(name, grad)
        self._zero.discard(name)
        return buf.add_(grad.reshape(-1).to(buf.dtype))

    def flush_into(self, name: str, grad: torch.Tensor) -> None:
        """For a layer sent dense as a whole: grad += residual in place, residual ← 0.
        The same result as ``compensate`` + copying g_ef into grad + ``update(.., None)``,
        without touching memory when the residual is already zero."""
        self._buffer(name, grad)
        if name in self._zero:
            return
        g_ef = self.compensate(name, grad)
        grad.view(-1).copy_(g_ef)
        self.update(name, g_ef, None)

    def update(self, name: str, g_ef: torch.Tensor, sent) -> None:
        """residual ← g_ef − sent (see the class docstring for the forms of ``sent``)."""
        buf = self._buffers.get(name)
        if buf is None:
            raise KeyError(f"update({name!r}) before compensate({name!r})")
        if g_ef.data_ptr() != buf.data_ptr():
            buf.copy_(g_ef.reshape(-1))
        if sent is None:
            buf.zero_()
            self._zero.add(name)
            return
        self._zero.discard(name)
        if isinstance(sent, SparseSent):
            buf.index_add_(0, sent.indices, sent.values.to(buf.dtype), alpha=-1)
        else:
            buf.sub_(sent.reshape(-1).to(buf.dtype))

    def __getitem__(self, name: str) -> torch.Tensor:
        """The residual of ``name`` (a view: read it, do not write it; use
        ``load_state_dict`` to set residuals)."""
        return self._buffers[name].view(self._shapes[name])

    def __contains__(self, name: str) -> bool:
        return name in self._buffers

    def __len__(self) -> int:
        return len(self._buffers)

    def names(self) -> list[str]:
        return list(self._buffers)

    def reset(self) -> None:
        """Zero every residual (e.g. after the set of ranks changed)."""
        for buf in self._buffers.values():
            buf.zero_()
        self._zero = set(self._buffers)

    def state_dict(self) -> dict:
        return {"residuals": {name: self[name].detach().clone() for name in self._buffers}}

    def load_state_dict(self, state: dict, like: Mapping[str, torch.Tensor] | None = None) -> None:
        """Set the residuals from ``state_dict()``'s output.

        ``like`` maps names to the parameters (or gradients) the residuals belong to: each
        loaded residual moves to that tensor's device and to ``dtype_for`` its dtype, so a
        checkpoint read with ``map_location="cpu"`` resumes on a GPU, or after a change of
        precision. Names not in ``like`` keep the device and dtype they were saved with.
        """
        if not isinstance(state, dict) or "residuals" not in state:
            raise ValueError("not a ResidualMemory state dict: expected a dict with key 'residuals'")
        like = like or {}
        for name, value in state["residuals"].items():
            buf = self._buffers.get(name)
            target = like.get(name)
            expected = buf.numel() if buf is not None else (
                target.numel() if target is not None else value.numel())
            if value.numel() != expected:
                shape = tuple(self._shapes[name]) if buf is not None else tuple(target.shape)
                raise ValueError(f"residual {name!r} in the state dict has shape {tuple(value.shape)}, "
                                 f"but this model's has {shape}")
        self._buffers.clear()
        self._shapes.clear()
        self._zero.clear()
        for name, value in state["residuals"].items():
            value = value.detach()
            target = like.get(name)
            if target is not None:
                value = value.to(device=target.device, dtype=self.dtype_for(target.dtype))
            self._buffers[name] = value.clone().reshape(-1)
            self._shapes[name] = value.shape

    def to(self, device) -> "ResidualMemory":
        for name, buf in self._buffers.items():
            self._buffers[name] = buf.to(device)
        return self
