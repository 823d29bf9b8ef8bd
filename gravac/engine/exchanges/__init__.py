"""Exchanges: how a step's selected values and dense layers travel between ranks.

Each is a strategy of the one step pipeline (``gravac/engine/step.py``) behind the small
protocol of ``base.py``, in a file of its own; this registry is the one list of them
that the engine, the options, the config, the trainer, the benchmarks and the docs read.
A new exchange is one new file and one line here.

Example::

    cls = exchange_class("shared_index", TopK())     # SharedIndexExchange
    [k for k, c in EXCHANGES.items() if c.selectable]  # what exchange= may name
"""
from __future__ import annotations

from .allgather import AllgatherCodedExchange, AllgatherExchange
from .base import Exchange, Pending, SentLayer
from .hierarchical import HierarchicalExchange, host_groups
from .lowrank import LowRankExchange
from .shared_index import SharedIndexExchange, shard_layers

#: Every exchange, by the name a user gives (``selectable``) or its compressor implies.
EXCHANGES: dict[str, type[Exchange]] = {cls.kind: cls for cls in (
    AllgatherExchange, AllgatherCodedExchange, HierarchicalExchange, SharedIndexExchange,
    LowRankExchange)}


def exchange_class(kind: str, compressor) -> type[Exchange]:
    """The exchange a step uses: low rank for a low-rank compressor (its factors travel
    by allreduce), else the one named."""
    return LowRankExchange if compressor.is_lowrank else EXCHANGES[kind]


__all__ = ["EXCHANGES", "Exchange", "Pending", "SentLayer", "exchange_class", "host_groups",
           "shard_layers"]
