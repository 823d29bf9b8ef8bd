"""The engine's options: one typed definition, with every default and rule written once.

``GravacOptions`` is what both front ends (``gravac.DistributedOptimizer`` on Horovod,
``gravac.torch.DistributedOptimizer``) take as keyword arguments, and the ``compression``
section of a config file reuses its fields (``gravac/train/config.py``): a default, a
range or a rule between two options lives here and nowhere else. ``check()`` raises one
``ValueError`` per problem, phrased ``field=value: what is allowed``; the config prefixes
the section (``compression.exchange=...``).

Example::

    opts = GravacOptions(overlap=True, exchange="allgather_coded")
    opts.check()                                   # ValueError on a bad value
    GravacOptions(exchange="ring").check()
    # ValueError: exchange='ring': must be one of allgather, allgather_coded, ...
"""
from __future__ import annotations

import dataclasses
import math
import textwrap
import typing
from dataclasses import dataclass, field
from typing import Literal, get_args

from ..util.choices import one_of
from .exchanges import EXCHANGES

#: How sparse selections travel between ranks (docs/ALGORITHM.md §13-14): the exchanges
#: of ``gravac/engine/exchanges/``'s registry that a user names.
EXCHANGE_KINDS: tuple[str, ...] = tuple(k for k, c in EXCHANGES.items() if c.selectable)
ExchangeKind = Literal[EXCHANGE_KINDS]
#: How dense layers travel: as they are, or cast to fp16 (Horovod's Compression.fp16,
#: DDP's fp16_compress_hook).
DenseWire = Literal["native", "fp16"]
DENSE_WIRES: tuple[str, ...] = get_args(DenseWire)
#: How the ranks' gradients combine (Horovod's ``op``: ``hvd.Average``, ``hvd.Sum``).
ReduceOp = Literal["average", "sum"]
#: What a NaN/Inf gradient on any rank does.
Nonfinite = Literal["skip", "raise"]
NONFINITE: tuple[str, ...] = get_args(Nonfinite)


def _front_end_only(doc: str) -> dict:
    """Metadata of a field that the front ends take but a config file does not set (the
    trainer fills it from the run)."""
    return {"doc": doc, "config": False}


@dataclass
class GravacOptions:
    """Options of gravac's distributed optimizer (the engine), beside the compressor and
    the controller."""

    min_compress_numel: int = field(default=1024, metadata={"doc": (
        "Parameters with fewer elements (biases, norm layers) are sent dense.")})
    nonfinite: Nonfinite = field(default="skip", metadata={"doc": (
        "A NaN/Inf gradient on any rank (found collectively before any residual changes): "
        "'skip' the step on every rank, or 'raise' FloatingPointError on every rank.")})
    max_consecutive_skips: int = field(default=10, metadata={"doc": (
        "With nonfinite='skip', raise after this many skipped steps in a row.")})
    dense_wire: DenseWire = field(default="native", metadata={"doc": (
        "'fp16' sends the dense layers as fp16 (Horovod's Compression.fp16, DDP's "
        "fp16_compress_hook with controller: dense); 'native' as they are.")})
    overlap: bool = field(default=False, metadata={"doc": (
        "Start each bucket's compression and exchange from gradient hooks while backward "
        "still runs; step() then waits for them. Bit for bit the same parameters as without "
        "it for Static and Accordion on 2 ranks (to rounding from 3 on: docs/ALGORITHM.md "
        "§10); GraVAC overlaps its compressed layers with "
        "decide: previous only. Under controller auto the steps of methods whose exchange "
        "overlaps (dense, fp16, sparse on allgather) overlap, a sparse step's compressed "
        "layers in its trials and with compression.auto.decide: previous; PowerSGD's, and "
        "a sparse method's that Auto sends by shared_index (a CF at or below the rank "
        "count), run in step(). The exchange option itself takes allgather or "
        "allgather_coded with overlap.")})
    bucket_cap_mb: float = field(default=25.0, metadata={"doc": (
        "With overlap, MiB of gradient per bucket (cut in reverse layer order, the same on "
        "every rank).")})
    backward_passes_per_step: int = field(default=1, metadata=_front_end_only(
        "Backward passes accumulated before a step (Horovod's option of that name): with "
        "overlap the hooks send after the last of them; without it step() sends whatever "
        "the passes accumulated, so it only states the intent."))
    exchange: ExchangeKind = field(default="allgather", metadata={"doc": (
        "How sparse selections travel: 'allgather' (the paper's), 'allgather_coded' (the "
        "same with each layer's indices in ~1.1-2 bytes instead of 4), 'hierarchical' (dense "
        "inside a host, each host's average sparse across hosts) or 'shared_index' (every "
        "rank sends values at each layer's rotating leader's indices, by allreduce).")})
    op: ReduceOp = field(default="average", metadata=_front_end_only(
        "How the ranks' gradients combine: 'average' or 'sum' (Horovod's op=hvd.Average, "
        "hvd.Sum)."))
    gradient_predivide_factor: float = field(default=1.0, metadata=_front_end_only(
        "With op='average', the layers sent dense are divided by this factor before the sum "
        "and multiplied by factor/size after it, as Horovod's option of that name (it keeps "
        "an fp16 sum in range); compressed values are summed in their own dtype after the "
        "allgather, where it changes nothing."))
    batch_size: int | None = field(default=None, metadata=_front_end_only(
        "Samples per rank per step, for the throughput the controller measures."))
    name_prefix: str = field(default="gravac", metadata=_front_end_only(
        "Prefix of the collectives' names: two optimizers that step concurrently need two."))
    defer_agreement: bool = field(default=False, metadata=_front_end_only(
        "Run the set-up agreement (a collective) at the first step instead of at "
        "construction (Horovod Elastic builds the optimizer on a joining worker alone)."))

    def check(self) -> "GravacOptions":
        """Raise ValueError (``field=value: what is allowed``) on the first bad option."""
        for f in dataclasses.fields(self):
            _check_type(f.name, getattr(self, f.name))
        _require(self.min_compress_numel >= 1, "min_compress_numel", self.min_compress_numel,
                 "must be an int >= 1")
        _require(self.max_consecutive_skips >= 0, "max_consecutive_skips",
                 self.max_consecutive_skips, "must be an int >= 0")
        _require(self.bucket_cap_mb > 0, "bucket_cap_mb", self.bucket_cap_mb,
                 "must be a number > 0 (MiB of gradient per overlapped bucket)")
        _require(self.backward_passes_per_step >= 1, "backward_passes_per_step",
                 self.backward_passes_per_step, "must be an int >= 1")
        _require(math.isfinite(self.gradient_predivide_factor)
                 and self.gradient_predivide_factor > 0, "gradient_predivide_factor",
                 self.gradient_predivide_factor, "must be a finite number > 0")
        _require(self.op == "average" or self.gradient_predivide_factor == 1.0,
                 "gradient_predivide_factor", self.gradient_predivide_factor,
                 "takes op='average' only (as in Horovod); leave it at 1.0 with op='sum'")
        _require(self.batch_size is None or self.batch_size >= 1, "batch_size", self.batch_size,
                 "must be a positive int (samples per rank per step) or None")
        _require(bool(self.name_prefix), "name_prefix", self.name_prefix,
                 "must be a non-empty string")
        _require(EXCHANGES[self.exchange].overlaps or not self.overlap, "exchange", self.exchange,
                 "cannot be combined with overlap=true (its step needs every gradient before "
                 "its first collective); set overlap to false or exchange to allgather")
        _require(self.overlap or self.bucket_cap_mb == type(self)().bucket_cap_mb,
                 "bucket_cap_mb", self.bucket_cap_mb, "takes effect with overlap=true only "
                 "(without it, step() sends every layer in one exchange)")
        return self

    def check_with(self, compressor, controller=None) -> "GravacOptions":
        """``check()``, and the rules between these options, ``compressor`` and the
        methods ``controller`` may choose (``Auto``)."""
        self.check()
        kinds = {m.kind for m in getattr(controller, "methods", ())}
        _require("sparse" not in kinds or not (compressor.is_dense or compressor.is_lowrank),
                 "compressor", compressor.name, f"controller {controller!r} chooses sparse "
                 "methods, which take a sparsifier: topk, dgc, redsync or randomk")
        for m in getattr(controller, "methods", ()):
            # Each method's exchange is built at its first step: a name not in the registry
            # would fail there, after the steps before it.
            _require(m.exchange is None or m.exchange in EXCHANGE_KINDS, "auto.methods", m.key,
                     f"names exchange {m.exchange!r}: write sparse:<cf>@<exchange> with one of "
                     f"{', '.join(EXCHANGE_KINDS)}, or sparse:<cf> for the configured one")
        default = type(self)().exchange
        _require(self.exchange == default or not (compressor.is_dense or compressor.is_lowrank),
                 "exchange", self.exchange, f"moves sparse selections; compressor "
                 f"{compressor.name!r} sends "
                 f"{'everything' if compressor.is_dense else 'low-rank factors'} by allreduce "
                 f"already: use exchange={default} (the default)")
        _require(not (self.overlap and compressor.is_lowrank), "overlap", self.overlap,
                 "takes a sparsifier or compressor none: PowerSGD's rounds (P, then Q) run in "
                 "step(); set overlap to false")
        return self

    @classmethod
    def config_fields(cls) -> list[dataclasses.Field]:
        """The fields a config file's ``compression`` section takes."""
        return [f for f in dataclasses.fields(cls) if f.metadata.get("config", True)]

    @classmethod
    def doc(cls, indent: int = 8) -> str:
        """Every option with its default and doc, wrapped: the front ends' docstrings."""
        return "\n".join(textwrap.fill(f"{f.name} (default {f.default!r}): {f.metadata['doc']}",
                                        width=88, initial_indent=" " * indent,
                                        subsequent_indent=" " * (indent + 4))
                          for f in dataclasses.fields(cls))

    def describe(self) -> dict:
        """What every rank must agree on (the set-up agreement): the buckets' cut with
        overlap, which decides the collectives."""
        bucket = ("bucket_cap_mb", "backward_passes_per_step")
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name not in ("batch_size", "defer_agreement", "overlap", *bucket)}
        out["overlap"] = {k: getattr(self, k) for k in bucket} if self.overlap else None
        return out


class OptionError(ValueError):
    """A bad option: ``name=value: allowed`` (Python's spelling); the config reports the
    same with its key and YAML's spelling from ``name``, ``value`` and ``allowed``."""

    def __init__(self, name: str, value, allowed: str):
        super().__init__(f"{name}={value!r}: {allowed}")
        self.name, self.value, self.allowed = name, value, allowed


def _require(ok: bool, name: str, value, allowed: str) -> None:
    if not ok:
        raise OptionError(name, value, allowed)


def _check_type(name: str, value) -> None:
    """The field's declared type: one of a Literal's names, a bool, an int (not a bool), a
    number, a string; ``| None`` allows None."""
    tp = _HINTS[name]
    args = typing.get_args(tp)
    if typing.get_origin(tp) is Literal:
        _require(value in args, name, value, one_of(value, args))
        return
    if type(None) in args:
        if value is None:
            return
        tp = next(a for a in args if a is not type(None))
    if tp is bool:
        _require(isinstance(value, bool), name, value, "must be true or false")
        return
    allowed = {int: (int, "an int"), float: ((int, float), "a number"), str: (str, "a string")}
    kinds, words = allowed[tp]
    _require(isinstance(value, kinds) and not isinstance(value, bool), name, value,
             f"must be {words}")


_HINTS = typing.get_type_hints(GravacOptions)
