"""The protocol every exchange follows, and the pieces they share.

An exchange is a strategy of the step pipeline (``gravac/engine/step.py``): the pipeline
plans, scans for NaN/Inf, runs error feedback, agrees the gains, decides and writes the
step record; the exchange says which layers this rank selects, selects them (with the
rounds its index set or factors need), keeps what a decision sends, and moves it. It
holds no reference to the pipeline: it gets the layers, tensors and clock it works on.

Per step, in this order, on every rank:

1. ``begin(layers, clock)``: work before any selection (the hierarchical host average);
2. ``plan_layer(layer, plan)``: a compressible layer's (first level, candidate level) or
   None when it goes dense this step; from the plan only, so the same on every rank;
3. ``mine(planned)``: the planned layers this rank selects (the hierarchical shard);
4. ``select(fed, step, clock)``: ``(selections, bytes)`` from ``(layer, g_ef, level_min,
   level_c)``, with the rounds the selection needs (``t_wait_select``);
5. ``gain_rows(selections, measure)``: each layer's [sent², candidate², whole²] row (on a GPU
   one [layers, 3] table of them);
6. ``settle(memory, selections, level)``: what the level sends of each (``SentLayer``s),
   the residuals updated unless the exchange updates them after unpacking (low rank);
7. ``start(sent, dense, tag, flags)``: the collectives of a bucket, a ``Pending``;
8. ``end(clock)``: work after every bucket was unpacked (the hierarchical host share).

Example (a new exchange is one file and one registry line)::

    class MyExchange(Exchange):
        kind = "mine"
        def start(self, sent, dense, tag="", flags=None, same_size=False):
            pending = Pending()
            add_dense(pending, self.comm, self.prefix, self.dense_wire, dense, tag, flags)
            return pending
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ...comm import Comm
from ...controllers import SENT_CANDIDATE
from ...memory import ResidualMemory, SparseSent
from ..layers import Layer
from ..phases import PhaseClock
from ..selection import Selection, flagged_ranks, gain_rows, select_levels


@dataclass
class SentLayer:
    """One layer sent compressed: its wire tensors and what it counts in the record.

    values: floats sent for it (sparse: the kept values; low rank: P and Q's columns);
    index_floats: index entries sent with them (one float each, as the paper counts)."""

    layer: Layer
    val: torch.Tensor | None
    idx: torch.Tensor | None
    values: int
    index_floats: int
    #: What the exchange needs again when it unpacks (low rank: the factors).
    state: object = None


class Pending:
    """Collectives in flight: ``wait()`` (the communication), then ``unpack()`` (the
    averaged gradients written). ``carries_flags``: the NaN/Inf flags given to ``start``
    ride in one of its groups; ``flagged_ranks()`` reads them after ``wait()``."""

    def __init__(self):
        self.bytes_sent = 0
        self._parts: list[tuple[object, Callable | None]] = []
        self._results: list = []
        self._flags: torch.Tensor | None = None

    def add(self, handle, on_result: Callable | None = None, nbytes: int = 0) -> None:
        """A collective in flight; ``on_result(result)`` runs in ``unpack``."""
        self._parts.append((handle, on_result))
        self.bytes_sent += nbytes

    def after(self, on_unpack: Callable[[], None]) -> None:
        """Work of ``unpack`` that needs no collective's result (after the others)."""
        self._parts.append((None, lambda _: on_unpack()))

    @property
    def carries_flags(self) -> bool:
        return self._flags is not None

    def flagged_ranks(self) -> list[int]:
        return flagged_ranks(self._flags)

    def wait(self) -> None:
        self._results = [None if h is None else h.wait() for h, _ in self._parts]

    def unpack(self) -> None:
        for (_, on_result), result in zip(self._parts, self._results):
            if on_result is not None:
                on_result(result)


def add_dense(pending: Pending, comm: Comm, prefix: str, dense_wire: str,
              dense: Sequence[Layer], tag: str = "", flags: torch.Tensor | None = None) -> None:
    """Start the dense layers' reductions into ``pending``: ONE grouped allreduce
    (average) per dtype (fp32 and fp64 cannot share a fused buffer), in a fixed order so
    that every rank issues the same ones; fp16 on the wire with ``dense_wire="fp16"``.

    ``flags`` (this rank's NaN/Inf one-hot vector) ride in the first floating-point group
    as one more tensor of its dtype, averaged with it (a flagged rank's entry arrives as
    1/N): no collective of their own. Whether a group took them is ``carries_flags`` (the
    same on every rank: the dense layers and dtypes are)."""
    by_dtype: dict[torch.dtype, list[Layer]] = {}
    for layer in sorted(dense, key=lambda l: l.index):
        by_dtype.setdefault(layer.param.grad.dtype, []).append(layer)
    for dtype in sorted(by_dtype, key=str):
        layers = by_dtype[dtype]
        if dense_wire == "fp16" and dtype.is_floating_point:
            wire = [l.param.grad.to(torch.float16) for l in layers]
        else:
            wire = [l.param.grad for l in layers]
        group = wire
        if flags is not None and pending._flags is None and dtype.is_floating_point:
            pending._flags = flags.to(device=wire[0].device, dtype=wire[0].dtype)
            group = [*wire, pending._flags]
        name = f"{prefix}.dense{tag}" + ("" if len(by_dtype) == 1 else f".{dtype}")
        handle = comm.grouped_allreduce_async_(group, op="average", name=name)
        pending.add(handle, _copy_back(layers, wire),
                    sum(w.numel() * w.element_size() for w in wire))


def _copy_back(layers: list[Layer], wire: list[torch.Tensor]) -> Callable:
    def unpack(_):
        for layer, averaged in zip(layers, wire):
            if averaged is not layer.param.grad:     # the fp16 wire copy
                layer.param.grad.copy_(averaged)
    return unpack


def grouped_average(comm: Comm, name: str, tensors: Sequence[torch.Tensor]):
    """Start ONE grouped allreduce (average, in place) per dtype of ``tensors``, in a
    fixed order: (handles, bytes sent)."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    handles, nbytes = [], 0
    for dtype in sorted(by_dtype, key=str):
        group = by_dtype[dtype]
        handles.append(comm.grouped_allreduce_async_(
            group, op="average", name=name + ("" if len(by_dtype) == 1 else f".{dtype}")))
        nbytes += sum(t.numel() * t.element_size() for t in group)
    return handles, nbytes


class Exchange:
    """A sparse exchange's defaults: the compressor's two levels on every planned layer,
    CFs from the plan, the residual updated when a level is settled. Subclasses override
    ``start`` (how the values travel) and what they do differently."""

    kind = "abstract"
    #: A user names it in ``exchange=`` (low rank is chosen by its compressor instead).
    selectable = True
    #: Buckets may leave from backward's hooks (``overlap=True``).
    overlaps = False
    #: Every rank selects every planned layer (``mine``), so per-layer gain rows line up
    #: across ranks (``StepPlan.layer_gains``): not the hierarchical exchange's shards.
    selects_every_layer = True
    #: Its collectives may be in flight beside the world's (the gains, the flags): not
    #: the hierarchical exchange, whose shard groups are Horovod process sets.
    world_beside = True

    def __init__(self, comm: Comm, prefix: str, dense_wire: str, compressor,
                 host_of_rank=None):
        self.comm, self.prefix, self.dense_wire = comm, prefix, dense_wire
        self.compressor = compressor

    def bind(self, comm: Comm) -> None:
        """Use ``comm`` from now on (an elastic reset)."""
        self.comm = comm

    def describe(self) -> dict | str:
        """What every rank must agree on."""
        return self.kind

    def begin(self, layers: Sequence[Layer], clock: PhaseClock) -> None:
        """Before any selection of the step."""

    def plan_layer(self, layer: Layer, plan) -> tuple[float, float | None] | None:
        cf = plan.cf_of(layer.name)
        if cf <= 1:
            return None
        return cf, (plan.theta_c if plan.theta_c is not None and plan.theta_c > cf else None)

    def mine(self, planned: Sequence[Layer]) -> list[Layer]:
        return list(planned)

    def select(self, fed, step: int, clock: PhaseClock) -> tuple[list[Selection], int]:
        selections = select_levels(self.compressor, fed, step, self.comm.rank)
        clock.lap("t_select")
        return selections, 0

    def gain_rows(self, selections, measure: str) -> list[torch.Tensor]:
        return gain_rows(selections, measure)

    def settle(self, memory: ResidualMemory, selections: Sequence[Selection],
               level: str) -> list[SentLayer]:
        picks = [SparseSent(s.idx_c, s.val_c) if level == SENT_CANDIDATE
                 else SparseSent(s.idx_min, s.val_min) for s in selections]
        # The values are copies (gathered), so g_ef's buffer may now become the residual;
        # all layers' residuals at once (one launch on a GPU, ``update_sparse``).
        memory.update_sparse([s.layer.name for s in selections], [s.g_ef for s in selections],
                             picks)
        return [SentLayer(s.layer, val, idx, int(val.numel()), int(val.numel()))
                for s, (idx, val) in zip(selections, picks)]

    def start(self, sent: list[SentLayer], dense: list[Layer], tag: str = "",
              flags: torch.Tensor | None = None, same_size: bool = False) -> Pending:
        raise TypeError(f"{type(self).__name__} must define start()")

    def average_values(self, what: str, sent: list[SentLayer], dense: list[Layer], tag: str,
                       flags: torch.Tensor | None, then: Callable[[], None]) -> Pending:
        """The exchanges that travel by allreduce: the values of ``sent`` averaged in place
        by ONE grouped allreduce per dtype (``<prefix>.<what><tag>``), beside the dense
        layers'; ``then()`` writes the gradients in ``unpack``."""
        pending = Pending()
        handles, nbytes = grouped_average(self.comm, f"{self.prefix}.{what}{tag}",
                                          [s.val for s in sent])
        for i, handle in enumerate(handles):
            pending.add(handle, nbytes=nbytes if i == 0 else 0)
        add_dense(pending, self.comm, self.prefix, self.dense_wire, dense, tag, flags)
        pending.after(then)
        return pending

    def remote(self, planned: Sequence[tuple[Layer, float, float | None]],
               level: str) -> list[SentLayer]:
        """The planned layers other ranks sent for this one (the hierarchical shards), as
        they count in this rank's record."""
        return []

    def end(self, clock: PhaseClock) -> None:
        """After every bucket was unpacked."""
