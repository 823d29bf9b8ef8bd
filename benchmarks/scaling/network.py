"""Links, layouts and collectives: the α-β part of the cost model (docs/SCALING.md §1.2).

A ``Link`` prices one message and one byte; ``collective_terms`` counts the messages and
bytes of Gloo's ring allreduce, ring allgather and binomial broadcast; a ``Layout`` places
N = hosts x slots ranks; a ``Network`` holds the links between and inside hosts (assumed,
or fitted per collective and group size by ``calibrate``).

Example::

    net = Network(inter=Link.from_gbit(10, 25e-6), local=Link.from_gbit(200, 5e-6))
    net.time("allreduce", 4e8, 32, "inter")        # seconds of a 400 MB ring allreduce
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from gravac.util.sizes import COLLECTIVES, collective_terms  # noqa: F401 (re-exported)

#: bits in a Gbit (link rates are given in Gbit/s)
GBIT = 1e9


# -- links and collectives --------------------------------------------------------------------
@dataclass(frozen=True)
class Link:
    """A link of the α-β model: ``alpha_s`` per message (latency, seconds),
    ``beta_s_per_byte`` per byte (1 / bandwidth).

    >>> Link.from_gbit(1, 20e-6).beta_s_per_byte
    8e-09
    """

    alpha_s: float
    beta_s_per_byte: float

    @classmethod
    def from_gbit(cls, gbit_per_s: float, alpha_s: float) -> "Link":
        return cls(alpha_s, 8.0 / (gbit_per_s * GBIT))

    @property
    def gbit_per_s(self) -> float:
        return 8.0 / self.beta_s_per_byte / GBIT if self.beta_s_per_byte > 0 else math.inf

    def time(self, terms: tuple[float, float]) -> float:
        return self.alpha_s * terms[0] + self.beta_s_per_byte * terms[1]

    def describe(self) -> str:
        return f"α {self.alpha_s * 1e6:.1f} µs, {self.gbit_per_s:.3g} Gbit/s"


def ring_allreduce_time(nbytes: float, n: int, link: Link) -> float:
    """2(n−1)α + 2(n−1)/n·B·β.

    >>> round(ring_allreduce_time(1e6, 2, Link(1e-5, 1e-9)) * 1e6, 3)   # 2 steps + 1 MB
    1020.0
    """
    return link.time(collective_terms("allreduce", nbytes, n))


def ring_allgather_time(nbytes_each: float, n: int, link: Link) -> float:
    """(n−1)α + (n−1)·B·β, each of the n ranks contributing B bytes."""
    return link.time(collective_terms("allgather", nbytes_each, n))


def broadcast_time(nbytes: float, n: int, link: Link) -> float:
    """Binomial tree (Gloo's ``broadcast``): ⌈log2 n⌉·(α + B·β)."""
    return link.time(collective_terms("broadcast", nbytes, n))


# -- layout and network -----------------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    """N = hosts x slots ranks, ``slots`` per host, placed host by host (ranks 0..S−1 on
    host 0, as launchers do), so a world ring crosses each host's link once each way."""

    hosts: int
    slots: int

    def __post_init__(self):
        if self.hosts < 1 or self.slots < 1:
            raise ValueError(f"a layout needs hosts >= 1 and slots >= 1, "
                             f"got {self.hosts}x{self.slots}")

    @property
    def n(self) -> int:
        return self.hosts * self.slots

    def group(self, name: str) -> tuple[str, int, str]:
        """(canonical group, ranks, link scope) of ``world``, ``host`` or ``leaders``. A
        group that is the whole world (one host; one rank per host) is called ``world``,
        so its collectives fuse with the world's as they do in the engine."""
        if name == "world" or (name == "host" and self.hosts == 1) or \
                (name == "leaders" and self.slots == 1):
            return "world", self.n, "inter" if self.hosts > 1 else "local"
        if name == "host":
            return "host", self.slots, "local"
        if name == "leaders":
            return "leaders", self.hosts, "inter"
        raise ValueError(f"group must be world, host or leaders, got {name!r}")

    def __str__(self) -> str:
        return f"{self.hosts}x{self.slots}"


@dataclass(frozen=True)
class Network:
    """The two links of a cluster: ``inter`` (between hosts) and ``local`` (inside a host,
    faster), optionally one fitted link per (scope, collective) (``calibrate``)."""

    inter: Link | None
    local: Link | None
    #: ((scope, collective[, ranks]), Link) pairs from a calibration: a fit for the exact
    #: group size first (Horovod's cycle makes latency a per-collective constant more
    #: than a per-ring-step one), then the fit over every group size of the scope.
    fitted: tuple = ()

    def link(self, scope: str, kind: str, n: int | None = None) -> Link:
        fits = dict(self.fitted)
        for key in ((scope, kind, n), (scope, kind), (scope, "allreduce", n),
                    (scope, "allreduce")):
            if key in fits:
                return fits[key]
        found = self.inter if scope == "inter" else self.local
        if found is None:
            raise ValueError(f"the network has no {scope} link for {kind} (a calibration of a "
                             f"layout without {scope} collectives?)")
        return found

    def time(self, kind: str, nbytes: float, n: int, scope: str) -> float:
        if n <= 1 or nbytes <= 0:
            return 0.0
        return self.link(scope, kind, n).time(collective_terms(kind, nbytes, n))

    @classmethod
    def from_calibration(cls, calibration: dict) -> "Network":
        fitted = []
        for scope, kinds in calibration["links"].items():
            for kind, fit in kinds.items():
                fitted.append(((scope, kind), Link(fit["alpha_s"], fit["beta_s_per_byte"])))
        for scope, kinds in calibration.get("by_ranks", {}).items():
            for kind, by_n in kinds.items():
                for n, fit in by_n.items():
                    fitted.append(((scope, kind, int(n)),
                                   Link(fit["alpha_s"], fit["beta_s_per_byte"])))
        return cls(None, None, tuple(fitted))
