"""Error-feedback (residual) memory: what a rank did not send, added to its next gradient.

One residual per parameter name, local to the rank, starting at zero. Each name has two
buffers of its own: the residual and a spare. ``compensate`` writes g_ef into the spare
and ``update`` turns the spare into the new residual (what was sent subtracted in place),
so a step allocates nothing and the old residual survives the step: ``rollback_step()``
puts back every residual the step changed. The engine relies on that to agree on NaN/Inf
gradients together with data it sends anyway (the gains allreduce, the exchange) instead
of in a round of its own before error feedback. The price is a second buffer per
compressed parameter (one model's worth of memory).

Example::

    memory = ResidualMemory()
    memory.begin_step()
    g_ef = memory.compensate("fc.weight", grad)          # grad + residual (1-D)
    idx = compressor.select(g_ef, k)
    memory.update("fc.weight", g_ef, SparseSent(idx, g_ef[idx]))
    memory["fc.weight"]                                    # residual, shaped like grad
    memory.rollback_step()       # e.g. another rank had a NaN: residuals as before the step
"""
from __future__ import annotations

from typing import Mapping, NamedTuple

import torch

from .util.segments import offsets_in, shift_by_segment, views_of_one


#: From this many layers in one ``compensate_all`` batch their spares share one flat
#: buffer and ``update_sparse`` updates them with one launch. The flat update pays for
#: concatenating every layer's indices and values and shifting the indices: on an H200
#: (docs/notes/2026-11-benchmarks.md §7c, ``benchmarks/batched_paths.py``) ResNet-101's 161 layers
#: updated in 1.15 ms against 1.46 one launch per layer, the LSTM's 10 in 0.40 against 0.21.
FLAT_UPDATE_MIN_LAYERS = 24


class SparseSent(NamedTuple):
    """What a rank sent of one layer: ``values`` at flat ``indices``."""

    indices: torch.Tensor
    values: torch.Tensor


class ResidualMemory:
    """Per-parameter residuals with ``compensate``/``update`` and a state dict.

    ``compensate(name, grad)`` returns g_ef = grad + residual as a flat tensor that
    aliases the memory's spare buffer: read it (compress, pack, take norms) before calling
    ``update(name, g_ef, sent)``, which leaves residual = g_ef − sent. ``sent`` is either a
    dense tensor with g_ef's number of elements, a ``SparseSent``, or ``None`` for "all of
    g_ef was sent" (dense fallback: the residual becomes zero). ``begin_step()`` and
    ``rollback_step()`` bracket a step whose updates may have to be undone.
    ``begin_step(held=names)``: those residuals sit the step out (a frozen layer): g_ef is
    the gradient alone, and neither ``update`` nor ``flush_into`` changes them.
    """

    def __init__(self):
        self._buffers: dict[str, torch.Tensor] = {}
        self._spares: dict[str, torch.Tensor] = {}
        self._shapes: dict[str, torch.Size] = {}
        self._zero: set[str] = set()     # residuals known to be all zeros
        # name -> (the residual before this step's update, whether it was zero)
        self._undo: dict[str, tuple[torch.Tensor, bool]] = {}
        self._held: frozenset[str] = frozenset()

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
        elif buf.device != grad.device:
            # The residual follows its gradient (a state loaded without ``like``, or the
            # model moved to another device after the optimizer was built). Once, not per
            # step: from then on they share the device.
            buf = self._buffers[name] = buf.to(grad.device)
            self._spares.pop(name, None)
        return buf

    def _spare(self, name: str, buf: torch.Tensor) -> torch.Tensor:
        spare = self._spares.get(name)
        if spare is None:
            spare = self._spares[name] = torch.empty_like(buf)
        return spare

    def compensate(self, name: str, grad: torch.Tensor) -> torch.Tensor:
        """g_ef = grad + residual, flat, written into (and aliasing) the spare buffer; the
        residual itself is unchanged until ``update``. A held residual is not added."""
        buf = self._buffer(name, grad)
        if name in self._held:
            return grad.reshape(-1).to(buf.dtype, copy=True)
        return torch.add(buf, grad.reshape(-1).to(buf.dtype), out=self._spare(name, buf))

    def compensate_all(self, names: list[str], grads: list[torch.Tensor],
                       batched: bool | None = None) -> list[torch.Tensor]:
        """``compensate`` of each (name, grad). On a GPU (``batched`` None: where the
        gradients are; True forces it), for gradients of one device and dtype kept as is
        in the residuals, two multi-tensor kernels for all of them (copy the gradients
        into the spares, add the residuals) instead of one launch per layer: the same
        sums, g + r = r + g."""
        kinds = {(g.device, g.dtype) for g in grads}
        if batched is None:      # (one gradient: compensate's one launch is fewer)
            batched = len(grads) > 1 and grads[0].device.type != "cpu"
        if not batched or len(kinds) != 1 or self.dtype_for(grads[0].dtype) != grads[0].dtype \
                or self._held.intersection(names):
            return [self.compensate(n, g) for n, g in zip(names, grads)]
        bufs = [self._buffer(n, g) for n, g in zip(names, grads)]
        spares = self._flat_spares(names, bufs)
        torch._foreach_copy_(spares, [g.reshape(-1) for g in grads])
        torch._foreach_add_(spares, bufs)
        return spares

    def _flat_spares(self, names: list[str], bufs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The spares of ``names``, views of one flat buffer (made anew when they are not:
        the first step, after a load or a move), so that ``update_sparse`` can update all
        their residuals with one ``index_add_``. The residuals are those spares a step
        later (``update`` swaps them), so from the second step on both sides are flat.
        Allocating is free of kernels: a spare's content is scratch until ``update``."""
        spares = [self._spares.get(n) for n in names]
        if len(names) >= FLAT_UPDATE_MIN_LAYERS and views_of_one(spares) is None:
            flat = torch.empty(sum(b.numel() for b in bufs), dtype=bufs[0].dtype,
                               device=bufs[0].device)
            spares = list(torch.split(flat, [b.numel() for b in bufs]))
            self._spares.update(zip(names, spares))
        return [s if s is not None else self._spare(n, b)
                for n, s, b in zip(names, spares, bufs)]

    def flush_into(self, name: str, grad: torch.Tensor) -> None:
        """For a layer sent dense as a whole: grad += residual in place, residual ← 0.
        The same result as ``compensate`` + copying g_ef into grad + ``update(.., None)``,
        without touching memory when the residual is already zero."""
        self._buffer(name, grad)
        if name in self._zero or name in self._held:
            return
        g_ef = self.compensate(name, grad)
        grad.view(-1).copy_(g_ef)
        self.update(name, g_ef, None)

    def update(self, name: str, g_ef: torch.Tensor, sent) -> None:
        """residual ← g_ef − sent (see the class docstring for the forms of ``sent``); a
        held residual stays as it is."""
        old = self._buffers.get(name)
        if old is None:
            raise KeyError(f"update({name!r}) before compensate({name!r})")
        if name in self._held:
            return
        if sent is None:            # everything sent: zero, without copying g_ef first
            self.clear_all([name])
            return
        new = self._spare(name, old)
        if g_ef.data_ptr() != new.data_ptr():
            new.copy_(g_ef.reshape(-1))
        if isinstance(sent, SparseSent):
            new.index_add_(0, sent.indices, sent.values.to(new.dtype), alpha=-1)
        else:
            new.sub_(sent.reshape(-1).to(new.dtype))
        self._swap(name, new, zero=False)

    def clear_all(self, names: list[str]) -> None:
        """``update(name, g_ef, None)`` of each: every residual of ``names`` zero (a held
        one stays as it is), by one multi-tensor kernel instead of a copy and a zero per
        layer (a dense decision over ResNet-101's 161 layers: 322 launches). The caller
        has read each g_ef already: it may be the spare this zeroes."""
        live = [n for n in names if n not in self._held]
        missing = [n for n in live if n not in self._buffers]
        if missing:
            raise KeyError(f"clear_all({missing[0]!r}) before compensate({missing[0]!r})")
        spares = [self._spare(n, self._buffers[n]) for n in live]
        if spares:
            torch._foreach_zero_(spares)
        for name, new in zip(live, spares):
            self._swap(name, new, zero=True)

    def update_sparse(self, names: list[str], g_efs: list[torch.Tensor],
                      sents: list[SparseSent]) -> None:
        """``update(name, g_ef, sent)`` of each, the same residuals bit for bit. Where
        each g_ef is its spare and the spares are views of one flat buffer (what
        ``compensate_all`` makes on a GPU from ``FLAT_UPDATE_MIN_LAYERS`` layers on), the
        subtractions are ONE ``index_add_`` over that buffer (each layer's indices
        shifted by its view's offset) instead of one launch per layer: each entry gets
        the same single subtraction (a layer's indices are distinct)."""
        live = [i for i, n in enumerate(names) if n not in self._held]
        spares = [self._spares.get(names[i]) for i in live]
        flat = views_of_one(spares) if len(live) >= FLAT_UPDATE_MIN_LAYERS else None
        if flat is None or any(g_efs[i].data_ptr() != s.data_ptr()
                               for i, s in zip(live, spares)):
            for name, g_ef, sent in zip(names, g_efs, sents):
                self.update(name, g_ef, sent)
            return
        counts = [int(sents[i].indices.numel()) for i in live]
        if sum(counts):
            local = torch.cat([sents[i].indices.reshape(-1) for i in live]).to(torch.int64)
            values = torch.cat([sents[i].values.reshape(-1).to(flat.dtype) for i in live])
            index = shift_by_segment(local, counts, offsets_in(flat, spares))
            flat.index_add_(0, index, values, alpha=-1)
        for i, new in zip(live, spares):
            self._swap(names[i], new, zero=False)

    def _swap(self, name: str, new: torch.Tensor, zero: bool) -> None:
        """The spare ``new`` (already the new residual) becomes the residual; the old
        residual is kept (as the next spare) so that rollback_step() can put it back."""
        old = self._buffers[name]
        self._undo.setdefault(name, (old, name in self._zero))
        self._buffers[name], self._spares[name] = new, old
        if zero:
            self._zero.add(name)
        else:
            self._zero.discard(name)

    def begin_step(self, held=frozenset()) -> None:
        """Start a step: ``rollback_step`` will undo the updates from here on; the
        residuals of ``held`` (names) sit this step out."""
        self._undo.clear()
        self._held = frozenset(held)

    def rollback_step(self) -> None:
        """Every residual updated since ``begin_step`` goes back to its value before (the
        step is skipped on every rank, e.g. a NaN gradient on one of them)."""
        for name, (old, was_zero) in self._undo.items():
            self._buffers[name], self._spares[name] = old, self._buffers[name]
            if was_zero:
                self._zero.add(name)
            else:
                self._zero.discard(name)
        self._undo.clear()

    def __getitem__(self, name: str) -> torch.Tensor:
        """The residual of ``name`` (a view: read it, do not write it; use
        ``load_state_dict`` to set residuals)."""
        return self._buffers[name].view(self._shapes[name])

    def __contains__(self, name: str) -> bool:
        return name in self._buffers

    def __len__(self) -> int:
        return len(self._buffers)

    def __iter__(self):
        """The layer names, as a dict's keys: ``for name in opt.memory: opt.memory[name]``."""
        return iter(list(self._buffers))

    def names(self) -> list[str]:
        return list(self._buffers)

    def keys(self) -> list[str]:
        return self.names()

    def items(self) -> list[tuple[str, torch.Tensor]]:
        """(name, residual) pairs; each residual a view, as ``memory[name]`` gives."""
        return [(name, self[name]) for name in self._buffers]

    def reset(self) -> None:
        """Zero every residual (e.g. after the set of ranks changed)."""
        for buf in self._buffers.values():
            buf.zero_()
        self._zero = set(self._buffers)
        self._undo.clear()

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
        self._spares.clear()
        self._shapes.clear()
        self._zero.clear()
        self._undo.clear()
        for name, value in state["residuals"].items():
            value = value.detach()
            target = like.get(name)
            if target is not None:
                # One copy, straight onto the parameter's device (a GPU's from a CPU copy).
                value = value.to(device=target.device, dtype=self.dtype_for(target.dtype),
                                 copy=True)
            else:
                value = value.clone()
            self._buffers[name] = value.reshape(-1)
            self._shapes[name] = value.shape

    def to(self, device) -> "ResidualMemory":
        for name, buf in self._buffers.items():
            self._buffers[name] = buf.to(device)
        self._spares.clear()          # made again, on the new device, when next needed
        self._undo.clear()
        return self


def follow_devices(state, like: Mapping[str, torch.Tensor]):
    """A copy of ``state`` (nested dicts, lists and tuples, as state dicts are) whose
    tensors stored under a key of ``like`` (a layer name), at any depth below it, are moved
    to the device of ``like[key]``; dtypes, other tensors and other values are kept.

    What lets a controller's or a compressor's state (Accordion's accumulators,
    PowerSGD's Q) saved on a GPU resume on a CPU, or one read with
    ``map_location="cpu"`` resume on a GPU: each per-layer tensor goes where its
    parameter is, once at load time, not at its first use in a step.

    >>> follow_devices({"q": {"fc.weight": torch.ones(2)}, "seed": 0},
    ...                {"fc.weight": torch.zeros(1)})["q"]["fc.weight"].device.type
    'cpu'
    """
    return _follow(state, like, None)


def _follow(obj, like: Mapping[str, torch.Tensor], device):
    if isinstance(obj, torch.Tensor):
        return obj if device is None or obj.device == device else obj.to(device)
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            target = like.get(key) if isinstance(key, str) else None
            out[key] = _follow(value, like, device if target is None else target.device)
        return out
    if isinstance(obj, (list, tuple)) and type(obj) in (list, tuple):
        return type(obj)(_follow(v, like, device) for v in obj)
    return obj
