"""Methods: what ``controller: auto`` chooses among (docs/ALGORITHM.md §15).

A method is a whole way of sending a step's gradients: ``dense`` (as they are), ``fp16``
(dense, cast to fp16 on the wire), ``powersgd:<rank>`` (PowerSGD at that rank, factors by
allreduce) or ``sparse:<cf>`` (the configured sparsifier at that CF, by the exchange that
suits the world; ``sparse:<cf>@<exchange>`` names it). A plan names its method
(``StepPlan.method``); the engine builds the compressor and exchange it needs. This file is
the one definition of the methods' names and of how a method is written.

Example::

    Method.parse("powersgd:4")          # Method(kind='powersgd', level=4.0, exchange=None)
    Method.parse("sparse:40").key       # 'sparse:40'
    Method("fp16").dense                # True
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..util.choices import one_of

#: The kinds of method, in the order ``Auto`` lists its default candidates.
METHOD_KINDS = ("dense", "fp16", "powersgd", "sparse")
#: Kinds that take a level (a PowerSGD rank, a CF).
LEVELED = ("powersgd", "sparse")


@dataclass(frozen=True)
class Method:
    """kind: one of ``METHOD_KINDS``; level: PowerSGD's rank or the sparsifier's CF (None
    for dense and fp16); exchange: the sparse exchange (None: the engine's
    ``options.exchange``, or Auto's choice for the world)."""

    kind: str
    level: float | None = None
    exchange: str | None = None

    def __post_init__(self):
        if self.kind not in METHOD_KINDS:
            raise ValueError(f"method {self.kind!r}: the kind {one_of(self.kind, METHOD_KINDS)}")
        if (self.kind in LEVELED) != (self.level is not None):
            raise ValueError(f"method {self.kind!r}: " + (
                "needs a level: powersgd:<rank> or sparse:<cf>" if self.kind in LEVELED
                else "takes no level"))
        if self.kind == "powersgd" and not (self.level >= 1 and float(self.level).is_integer()):
            raise ValueError(f"method powersgd:{self.level:g}: the rank must be an int >= 1")
        if self.kind == "sparse" and not 1 < self.level < math.inf:
            raise ValueError(f"method sparse:{self.level:g}: the CF must be a finite number "
                             "> 1 (1 is dense)")
        if self.exchange is not None and self.kind != "sparse":
            raise ValueError(f"method {self.key}: only sparse methods name an exchange")

    @property
    def dense(self) -> bool:
        """Every layer travels dense (native or fp16): nothing to select, no gain."""
        return self.kind in ("dense", "fp16")

    @property
    def rank(self) -> int:
        return int(self.level)

    @property
    def key(self) -> str:
        """How it is written (configs, step records, checkpoints)."""
        text = self.kind if self.level is None else f"{self.kind}:{self.level:g}"
        return text if self.exchange is None else f"{text}@{self.exchange}"

    def exchange_for(self, world: int, default: str) -> str:
        """The exchange a sparse method travels by: the one it names; else ``default``
        (the engine's ``options.exchange``), except that the plain ``allgather`` gives way
        to ``shared_index`` (one index set, values by allreduce: docs/ALGORITHM.md §13)
        where the CF does not exceed the ranks, and an allgather of every rank's selection
        would be larger than dense."""
        if self.exchange is not None:
            return self.exchange
        return default if self.level > world or default != "allgather" else "shared_index"

    @classmethod
    def parse(cls, text: str) -> "Method":
        """``dense``, ``fp16``, ``powersgd:<rank>``, ``sparse:<cf>[@<exchange>]``."""
        if isinstance(text, Method):
            return text
        if not isinstance(text, str) or not text:
            raise ValueError(f"method {text!r}: write dense, fp16, powersgd:<rank> or "
                             "sparse:<cf>")
        body, _, exchange = text.partition("@")
        kind, _, level = body.partition(":")
        try:
            value = float(level) if level else None
        except ValueError:
            raise ValueError(f"method {text!r}: {level!r} is not a number") from None
        return cls(kind, value, exchange or None)

    def __str__(self) -> str:
        return self.key
