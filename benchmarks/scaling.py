"""A cost model of gravac's step from 2 to 1,024 workers (docs/SCALING.md).

α-β costs of every exchange and measured local compression costs, calibrated and validated
in the sandbox, projected to clusters.

The model (no overlap of communication with compute, gravac's default)::

    t_step = t_compute + t_local + t_comm

* t_comm: the collectives the step engine issues for the exchange, round by round, each
  priced with the α-β cost of its algorithm on the link it crosses (ring allreduce, ring
  allgather, binomial-tree broadcast: what Gloo runs);
* t_local: error feedback, selection, residual update, pack and unpack, from per-element
  costs measured on this machine (``measure-compression``);
* t_compute: forward, backward and the optimizer update: measured (validation) or given
  (projection).

Subcommands::

    scaling.py measure-compression --out C.json           # this machine's local costs
    horovodrun ... scaling.py measure-collectives --out M.json --link 1gbit   # (= collectives.py)
    scaling.py calibrate M.json --out L.json               # α, β of the links
    scaling.py validate RUN_DIR... --calibration L.json --compression C.json
    scaling.py project --compression C.json --out docs/SCALING_tables.md

Example (as a module)::

    import scaling as S
    model = S.ModelShapes.from_params([("w", (1000, 1000)), ("b", (1000,))])
    net = S.Network(inter=S.Link.from_gbit(10, 25e-6), local=S.Link.from_gbit(200, 5e-6))
    layout = S.Layout(hosts=4, slots=8)
    S.comm_time(S.StepCase("allgather", theta=100), model, layout, net)      # seconds
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Sequence

REPO = Path(__file__).resolve().parents[1]
PROG = "scaling.py"

# -- units and parsing ------------------------------------------------------------------------
GBIT = 1e9


class CliError(Exception):
    """Bad input: printed as one line naming the argument, exit status 2."""


def parse_rate_gbit(text: str) -> float:
    """A link rate in Gbit/s from ``"1gbit"``, ``"100mbit"``, ``"10"`` (Gbit/s).

    >>> parse_rate_gbit("100mbit"), parse_rate_gbit("10gbit"), parse_rate_gbit("2.5")
    (0.1, 10.0, 2.5)
    """
    t = str(text).strip().lower()
    for unit, scale in (("gbit", 1.0), ("mbit", 1e-3), ("kbit", 1e-6)):
        if t.endswith(unit):
            t, factor = t[: -len(unit)], scale
            break
    else:
        factor = 1.0
    try:
        value = float(t) * factor
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a rate (e.g. 1gbit, 100mbit, 10)") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"{text!r}: a rate must be > 0")
    return value


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


#: "allreduce_fp16": an allreduce of float16 values (Horovod's fp16 compression), priced
#: as a ring allreduce on a link of its own: Gloo sums fp16 on the CPU element by element,
#: slower per byte than fp32 (calibrated where measured, else the allreduce's link).
COLLECTIVES = ("allreduce", "allgather", "broadcast", "allreduce_fp16")


def collective_terms(kind: str, nbytes: float, n: int) -> tuple[float, float]:
    """(latency count, bytes through the slowest link) of one collective over ``n``
    ranks; its time is α·first + β·second. ``nbytes``: the buffer (allreduce, broadcast)
    or each rank's contribution (allgather). One rank or no bytes: nothing is sent.

    * ring allreduce (Gloo's): 2(n−1) steps of B/n bytes: 2(n−1)α + 2(n−1)/n·B·β;
    * ring allgather: n−1 steps of B: (n−1)α + (n−1)·B·β;
    * broadcast, Gloo's binomial tree: ⌈log2 n⌉ rounds of B: ⌈log2 n⌉·(α + B·β).

    >>> collective_terms("allreduce", 100, 4), collective_terms("allgather", 100, 4)
    ((6, 150.0), (3, 300))
    >>> collective_terms("broadcast", 100, 5)
    (3, 300)
    """
    if n <= 1 or nbytes <= 0:
        return (0, 0)
    if kind in ("allreduce", "allreduce_fp16"):
        return (2 * (n - 1), 2 * (n - 1) / n * nbytes)
    if kind == "allgather":
        return (n - 1, (n - 1) * nbytes)
    if kind == "broadcast":
        rounds = math.ceil(math.log2(n))
        return (rounds, rounds * nbytes)
    raise ValueError(f"collective must be one of {', '.join(COLLECTIVES)}, got {kind!r}")


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


# -- the model's layers -----------------------------------------------------------------------
def pad8(nbytes: int) -> int:
    return (nbytes + 7) // 8 * 8


def num_kept(n: int, cf: float) -> int:
    """gravac's k: ``max(1, ceil(n / cf))``, at most n (gravac.compressors.num_kept)."""
    return min(n, max(1, math.ceil(n / cf)))


def matrix_shape(shape) -> tuple[int, int]:
    """PowerSGD's matrix view: (first dimension, product of the rest)."""
    shape = tuple(int(s) for s in shape)
    return (1, 1) if not shape else (shape[0], math.prod(shape[1:]))


def lowrank_cf(rows: int, cols: int, rank: int) -> float:
    return rows * cols / (rank * (rows + cols))


def rank_for_cf(rows: int, cols: int, cf: float) -> int:
    """The largest rank whose CF is at least ``cf``: gravac.compressors.powersgd's rule,
    mirrored here so that the model imports no torch (tests/unit/test_scaling.py holds the
    two equal)."""
    rank = max(1, int(rows * cols // (cf * (rows + cols))))
    while lowrank_cf(rows, cols, rank + 1) >= cf:
        rank += 1
    while rank > 1 and lowrank_cf(rows, cols, rank) < cf:
        rank -= 1
    return rank


@dataclass(frozen=True)
class LowRank:
    """What PowerSGD sends at one (r_min, r_sent): floats of P and Q, the elements that go
    low-rank, the elements that go dense, and the low-rank layers' Σ n·r_min."""

    p_floats: int
    q_floats: int
    lowrank_numel: int
    dense_numel: int
    layers: int
    n_times_rank: int
    rank_sum: int           # Σ r_min over the low-rank layers (Gram-Schmidt's columns)


class ModelShapes:
    """The parameters a step communicates: names and shapes, which are compressed.

    Example::

        m = ModelShapes.from_params([("conv", (64, 3, 3, 3)), ("bias", (64,))])
        m.n_total, m.n_comp, m.kept_total(10)        # 1792, 1728, 173
    """

    def __init__(self, params: Sequence[tuple[str, tuple]], min_compress_numel: int = 1024,
                 name: str = "model", lowrank_min_cf: float = 1.0):
        self.name = name
        self.params = [(str(n), tuple(int(s) for s in shape)) for n, shape in params]
        self.min_compress_numel = int(min_compress_numel)
        self.lowrank_min_cf = float(lowrank_min_cf)
        numels = [math.prod(shape) if shape else 1 for _, shape in self.params]
        self.numels = numels
        self.comp = [n for n in numels if n >= self.min_compress_numel]
        self.comp_shapes = [s for (_, s), n in zip(self.params, numels)
                            if n >= self.min_compress_numel]
        self.n_total = sum(numels)
        self.n_comp = sum(self.comp)
        self.n_dense = self.n_total - self.n_comp
        self.layers_comp = len(self.comp)
        self._kept: dict[float, int] = {}
        self._lowrank: dict = {}

    @classmethod
    def from_params(cls, params, min_compress_numel: int = 1024, name: str = "model"):
        return cls(params, min_compress_numel, name)

    @classmethod
    def from_module(cls, module, min_compress_numel: int = 1024, name: str = "model"):
        """Shapes of ``module``'s trainable parameters, in ``named_parameters`` order (tied
        weights once, as the optimizer sees them)."""
        return cls([(n, tuple(p.shape)) for n, p in module.named_parameters() if p.requires_grad],
                   min_compress_numel, name)

    def kept_total(self, theta: float) -> int:
        """Σ k over the compressed layers at CF θ (Top-k's exact count)."""
        if theta not in self._kept:
            self._kept[theta] = sum(num_kept(n, theta) for n in self.comp)
        return self._kept[theta]

    def lowrank(self, r_min: tuple, r_sent: tuple) -> LowRank:
        """PowerSGD's traffic with per-layer ranks given by ``r_min``/``r_sent`` specs:
        ``("rank", r)`` (a rank for every layer, capped at min(rows, cols)) or ``("cf", θ)``
        (``rank_for_cf`` per layer); r_sent is capped by r_min (the candidate's columns
        are a prefix). A layer goes low-rank when its CF at r_min is above ``min_cf``."""
        key = (r_min, r_sent)
        if key not in self._lowrank:
            p = q = numel = layers = nr = rs_sum = 0
            for shape, n in zip(self.comp_shapes, self.comp):
                rows, cols = matrix_shape(shape)
                rm = self._rank(r_min, rows, cols)
                if lowrank_cf(rows, cols, rm) <= self.lowrank_min_cf:
                    continue
                rs = min(self._rank(r_sent, rows, cols), rm)
                p += rows * rm
                q += cols * rs
                numel += n
                layers += 1
                nr += n * rm
                rs_sum += rm
            self._lowrank[key] = LowRank(p, q, numel, self.n_total - numel, layers, nr, rs_sum)
        return self._lowrank[key]

    @staticmethod
    def _rank(spec: tuple, rows: int, cols: int) -> int:
        kind, value = spec
        if kind == "rank":
            return max(1, min(int(value), rows, cols))
        return rank_for_cf(rows, cols, float(value))

    def to_json(self) -> dict:
        return {"name": self.name, "min_compress_numel": self.min_compress_numel,
                "params": [[n, list(s)] for n, s in self.params]}

    @classmethod
    def from_json(cls, data: dict) -> "ModelShapes":
        return cls([(n, tuple(s)) for n, s in data["params"]],
                   data.get("min_compress_numel", 1024), data.get("name", "model"))


# -- what one step sends ----------------------------------------------------------------------
EXCHANGES = ("dense", "fp16", "allgather", "hierarchical", "shared_index", "powersgd")


@dataclass(frozen=True)
class StepCase:
    """One step as the engine runs it.

    exchange      dense / fp16 (Horovod's allreduce, no gravac step), allgather,
                  hierarchical, shared_index, powersgd
    theta         CF of the level sent (sparse), or of the rank sent (PowerSGD)
    theta_min     the level selected first (GraVAC's θmin; default ``theta``); None or <= 1
                  with ``sent="dense"``: planned dense, nothing selected
    theta_c       a candidate planned (GraVAC): the second level, and shared_index sends
                  its indices too
    rank          PowerSGD rank of every layer (static rank configs), instead of theta
    sent          "sparse" or "dense" (a compressed exchange whose decision was dense)
    gains         GraVAC's gains allreduce round (with every rank's NaN/Inf flag)
    dense_wire    bytes per element of the layers sent dense (4; 2 with fp16)
    shared_selection  Random-k with a shared seed: shared_index skips the index round
    """

    exchange: str
    theta: float = 1.0
    theta_min: float | None = None
    theta_c: float | None = None
    rank: int | None = None
    sent: str = "sparse"
    gains: bool = False
    dense_wire: int = 4
    shared_selection: bool = False

    def __post_init__(self):
        if self.exchange not in EXCHANGES:
            raise ValueError(f"exchange must be one of {', '.join(EXCHANGES)}, "
                             f"got {self.exchange!r}")
        if self.sent not in ("sparse", "dense"):
            raise ValueError(f"sent must be sparse or dense, got {self.sent!r}")

    @property
    def level_min(self) -> float | None:
        return self.theta if self.theta_min is None and self.sent == "sparse" else self.theta_min

    @property
    def selects(self) -> bool:
        return self.level_min is not None and self.level_min > 1

    def label(self) -> str:
        if self.exchange in ("dense", "fp16"):
            return self.exchange
        if self.exchange == "powersgd":
            return f"powersgd r{self.rank}" if self.rank else f"powersgd {self.theta:g}x"
        return f"{self.exchange} {self.theta:g}x"


@dataclass(frozen=True)
class Collective:
    kind: str       # allreduce | allgather | broadcast
    group: str      # world | host | leaders
    nbytes: int     # allreduce/broadcast: the buffer; allgather: each rank's contribution
    what: str = ""


def chunk_bytes(layers: int, kept: int, value_bytes: int = 4, index_bytes: int = 4) -> int:
    """One rank's sparse buffer (gravac/engine/codec.py): an int64 header of 4 + L fields,
    the values, the int32 indices, each section padded to 8 bytes.

    >>> chunk_bytes(2, 5)          # 8·6 + pad8(20) + pad8(20)
    96
    """
    return 8 * (4 + layers) + pad8(kept * value_bytes) + pad8(kept * index_bytes)


def index_buffer_bytes(model: ModelShapes, theta_min: float, theta_c: float | None) -> int:
    """shared_index's byte buffer: per layer a count per level (int32), then a field per
    level for Top-k's exact k (a candidate's too when one is planned), each sized as the
    engine sizes it (gravac/engine/index_codec.py: ~1.1 bytes an index at CF 10, ~2 at
    CF 1000, against int32's 4)."""
    levels = [theta_min] + ([theta_c] if theta_c else [])
    return 8 * model.layers_comp + sum(index_field_bytes(n, theta)
                                       for n in model.comp for theta in levels)


def index_field_bytes(numel: int, theta: float) -> int:
    """The bytes of one layer's index field at CF θ in shared_index's buffer, as the
    engine sizes it (``index_codec.plan`` for Top-k's exact k, padding included)."""
    from gravac.engine.index_codec import plan
    return plan(numel, num_kept(numel, theta)).nbytes


def _lowrank_of(case: StepCase, model: ModelShapes) -> LowRank:
    if case.rank:
        return model.lowrank(("rank", case.rank), ("rank", case.rank))
    level = case.theta_min if case.theta_min else case.theta
    if level <= 1:                      # planned dense: no layer goes low-rank, no P
        return LowRank(0, 0, 0, model.n_total, 0, 0, 0)
    r_min = ("cf", level)
    return model.lowrank(r_min, ("cf", case.theta) if case.sent == "sparse" else r_min)


def step_rounds(case: StepCase, model: ModelShapes, layout: Layout) -> list[list[Collective]]:
    """The rounds of collectives the engine issues for ``case`` (a round waits for the
    previous one); see gravac/engine/{step,exchange,hierarchical,shared_index,lowrank}.py."""
    n = layout.n
    gains = [Collective("allreduce", "world", 8 * (3 + n), "gains+flags")] if case.gains else []
    flags = [] if case.gains else [Collective("allreduce", "world", 8 * n, "flags")]
    all_dense = Collective("allreduce", "world", case.dense_wire * model.n_total, "dense")
    ex = case.exchange
    if ex in ("dense", "fp16"):
        return [[Collective("allreduce" if ex == "dense" else "allreduce_fp16", "world",
                            (4 if ex == "dense" else 2) * model.n_total,
                            "dense")]]
    if ex == "powersgd":
        lr = _lowrank_of(case, model)
        rounds = [[Collective("allreduce", "world", 8 * n, "flags")],
                  [Collective("allreduce", "world", 4 * lr.p_floats, "P")]]
        if case.gains:      # the low-rank gains: three float64, the flags agreed already
            rounds.append([Collective("allreduce", "world", 24, "gains")])
        if case.sent == "dense":
            rounds.append([all_dense])
        else:
            rounds.append([Collective("allreduce", "world", 4 * lr.q_floats, "Q"),
                           Collective("allreduce", "world", case.dense_wire * lr.dense_numel,
                                      "dense")])
        return rounds
    dense_small = Collective("allreduce", "world", case.dense_wire * model.n_dense, "dense")
    k_sent = model.kept_total(case.theta) if case.sent == "sparse" else 0
    chunk = chunk_bytes(model.layers_comp, k_sent)
    if ex == "allgather" or (ex == "shared_index" and not case.selects):
        # (shared_index planned dense has no index set to share: a dense allreduce)
        if case.sent == "dense":
            last = [all_dense]
        else:
            last = [Collective("allgather", "world", chunk, "sparse"), dense_small]
        return ([gains] if gains else []) + [last + flags]
    if ex == "hierarchical":
        # "leaders" stands for the shard groups: the j-th rank of every host exchanges
        # shard j (~1/S of the host's selection); the S groups run at once and share each
        # host's link, so together they cost one group moving the whole host's bytes.
        rounds = [[Collective("allreduce", "host", 4 * model.n_total, "host average")]]
        if gains:
            rounds.append(gains)
        if case.sent == "dense":
            leaders = [Collective("allreduce", "leaders", case.dense_wire * model.n_total, "dense")]
        else:
            leaders = [Collective("allgather", "leaders", chunk, "sparse"),
                       Collective("allreduce", "leaders", case.dense_wire * model.n_dense, "dense")]
        rounds.append(leaders + flags)
        # Each of the host's S ranks shares its shard (~1/S of the model) in one allgather.
        rounds.append([Collective("allgather", "host", 4 * model.n_total / layout.slots,
                                  "host share")])
        return rounds
    # shared_index
    rounds = []
    if not case.shared_selection:
        rounds.append([Collective("allreduce", "world",
                                  index_buffer_bytes(model, case.level_min, case.theta_c),
                                  "indices")])
    if gains:
        rounds.append(gains)
    if case.sent == "dense":
        rounds.append([all_dense] + flags)
    else:
        rounds.append([Collective("allreduce", "world", 4 * k_sent, "values"), dense_small]
                      + flags)
    return rounds


def round_time(round_: Sequence[Collective], layout: Layout, net: Network) -> float:
    """One round: the allreduces of a group started together are fused (one latency, the
    bytes summed: Horovod's tensor fusion); the other collectives add up."""
    fused: dict[tuple[str, int, str], float] = {}
    total = 0.0
    for c in round_:
        group = layout.group(c.group)
        if c.kind == "allreduce":
            if c.nbytes > 0:
                fused[group] = fused.get(group, 0.0) + c.nbytes
        else:
            _, ranks, scope = group
            total += net.time(c.kind, c.nbytes, ranks, scope)
    for (_, ranks, scope), nbytes in fused.items():
        total += net.time("allreduce", nbytes, ranks, scope)
    return total


def comm_time(case: StepCase, model: ModelShapes, layout: Layout, net: Network) -> float:
    """Seconds of communication per step (rounds one after the other)."""
    return sum(round_time(r, layout, net) for r in step_rounds(case, model, layout))


def recorded_bytes(case: StepCase, model: ModelShapes, layout: Layout) -> int | None:
    """``bytes_sent`` of the step record on rank 0 (what this rank put on the wire as
    gravac counts it), or None for Horovod's own dense step (no gravac record)."""
    ex = case.exchange
    if ex in ("dense", "fp16"):
        return None
    if ex == "powersgd":
        lr = _lowrank_of(case, model)
        if case.sent == "dense":
            return 4 * lr.p_floats + case.dense_wire * model.n_total
        return 4 * (lr.p_floats + lr.q_floats) + case.dense_wire * lr.dense_numel
    if case.sent == "dense":
        index = index_buffer_bytes(model, case.level_min, case.theta_c) \
            if ex == "shared_index" and case.selects and not case.shared_selection else 0
        return case.dense_wire * model.n_total + index
    k_sent = model.kept_total(case.theta)
    dense = case.dense_wire * model.n_dense
    if ex == "shared_index":
        index = 0 if case.shared_selection else index_buffer_bytes(model, case.level_min,
                                                                   case.theta_c)
        return dense + 4 * k_sent + index
    return chunk_bytes(model.layers_comp, k_sent) + dense


# -- local compression costs ------------------------------------------------------------------
@dataclass(frozen=True)
class CompressionCosts:
    """Per-element costs of the local work, seconds (``measure-compression`` fits them).

    pipeline   (c0, a, b, u, v): one compressed layer of n elements at k kept costs
               c0 + a·n + b·k (error feedback, selection, gathering, residual update,
               packing); unpacking a step's gathered buffer of C chunks of K values costs
               u·C·K + v·C
    select     (c0, a, b): one more selection over n elements at k (GraVAC's second level)
    norm       per element: a squared norm (GraVAC's gains)
    copy       per element: a copy (hierarchical host share, a dense decision's g_ef)
    cast       per element: fp32 -> fp16 and back (Horovod's fp16 compression)
    powersgd   (c0, cr, a, c): one layer of n elements at rank r: c0 + cr·r + a·n + c·n·r
               (cr: Gram-Schmidt's per-column steps)
    check      (c0, a): the NaN/Inf scan of every gradient (per tensor, per element),
               done by every gravac step, not by Horovod's own dense step
    """

    pipeline: tuple = (0.0, 0.0, 0.0, 0.0, 0.0)
    select: tuple = (0.0, 0.0, 0.0)
    norm: float = 0.0
    copy: float = 0.0
    cast: float = 0.0
    powersgd: tuple = (0.0, 0.0, 0.0, 0.0)
    check: tuple = (0.0, 0.0)
    ranks: int = 1                 # processes that ran at once when measured
    cores: int = 1

    @classmethod
    def from_json(cls, data: dict) -> "CompressionCosts":
        f = data["fits"]
        ps = list(f["powersgd"]["coef"])
        if len(ps) == 3:                 # written before the per-column term: none
            ps.insert(1, 0.0)
        return cls(pipeline=tuple(f["pipeline"]["coef"]), select=tuple(f["select"]["coef"]),
                   norm=f["norm"]["coef"][1], copy=f["copy"]["coef"][1],
                   cast=f["cast"]["coef"][1], powersgd=tuple(ps),
                   check=tuple(f["check"]["coef"]) if "check" in f else (0.0, 0.0),
                   ranks=data.get("ranks", 1), cores=data.get("cores") or 1)

    def scaled(self, factor: float) -> "CompressionCosts":
        """Every cost times ``factor`` (CPU contention, or a faster device: < 1)."""
        s = lambda t: tuple(x * factor for x in t)   # noqa: E731
        return replace(self, pipeline=s(self.pipeline), select=s(self.select),
                       norm=self.norm * factor, copy=self.copy * factor,
                       cast=self.cast * factor, powersgd=s(self.powersgd),
                       check=s(self.check))


NO_LOCAL = CompressionCosts()


def contention(ranks: int, cores: int) -> float:
    """How much slower each rank's CPU work runs with ``ranks`` processes on ``cores``
    cores than alone: max(1, ranks / cores). The sandbox's hosts all share this machine."""
    return max(1.0, ranks / max(1, cores))


@dataclass(frozen=True)
class CpuSharing:
    """How a step's CPU work stretches when a layout's ranks share this machine, measured
    (``collectives.py``'s lockstep steps, fitted by ``calibrate``) instead of assumed
    (``contention``). Per kind of work ("gemm": forward/backward, "stream": the local
    compression work): ``step[kind]`` seconds of a lockstep step per second of that work
    done alone (the cores shared, the skew a collective waits for, background threads),
    ``own[kind]`` seconds of a rank's own work per second alone (what its t_compute
    records; the rest of ``step`` is waited in the next collective). "stream_solo", where
    measured, is stream work done by one rank while the others wait (shared_index's
    leader selecting).

    Example::

        sharing = CpuSharing({"gemm": 2.9, "stream": 3.4}, {"gemm": 1.7, "stream": 2.0})
        sharing.compute_alone(0.17)     # a run recorded 170 ms of compute: 100 ms alone
    """

    step: dict
    own: dict

    @classmethod
    def from_calibration(cls, calibration: dict) -> "CpuSharing | None":
        fits = calibration.get("lockstep")
        if not fits:
            return None
        return cls({k: f["step_factor"] for k, f in fits.items()},
                   {k: f["own_factor"] for k, f in fits.items()})

    def compute_alone(self, recorded: float) -> float:
        """A rank's recorded t_compute + t_update in this layout -> seconds alone."""
        return recorded / self.own["gemm"]

    @property
    def solo(self) -> float | None:
        """Seconds of a step per second alone of work one rank does while the others wait
        (None where the calibration has no "stream_solo" rows: measured before them)."""
        return self.step.get("stream_solo")


def pool_lockstep(runs: Sequence[dict]) -> dict | None:
    """Several lockstep measurements of one layout as one (each kind's rows together, fitted
    as one): on a shared virtual machine one measurement's factors drift by ±20% within an
    hour (docs/SCALING.md §3), so several runs give a steadier fit. None for none."""
    if not runs:
        return None
    pooled: dict = {}
    for run in runs:
        for kind, data in run.items():
            pooled.setdefault(kind, {"rows": [], "runs": 0})
            pooled[kind]["rows"].extend(data["rows"])
            pooled[kind]["runs"] += 1
    return pooled


def fit_lockstep(lockstep: dict) -> dict:
    """``calibrate``'s fit of collectives.py's lockstep rows, per kind of work:
    step = sync_s + step_factor · work alone; own = own_factor · work alone."""
    out = {}
    for kind, data in lockstep.items():
        rows = data["rows"]
        step = least_squares([[1.0, r["work_s"]] for r in rows], [r["step_s"] for r in rows])
        busy = [r for r in rows if r["work_s"] > 0]
        own = least_squares([[r["work_s"]] for r in busy], [r["own_s"] for r in busy]) \
            if busy else [1.0]
        out[kind] = {"sync_s": step[0], "step_factor": step[1], "own_factor": own[0],
                     "points": len(rows), "runs": data.get("runs", 1)}
    return out


def local_time(case: StepCase, model: ModelShapes, layout: Layout,
               costs: CompressionCosts, solo: CompressionCosts | None = None) -> float:
    """Seconds of local work on the rank the step waits for (shared_index's leader with the
    largest share, which selects for the others; a hierarchical rank works on its shard).

    ``solo``: the costs of work one rank does while the others wait (the shared_index
    leaders' selection, both levels); None prices it like the rest (``costs``)."""
    ex = case.exchange
    if ex == "dense":
        return 0.0
    if ex == "fp16":
        return costs.cast * model.n_total
    # Every gravac step scans every gradient for NaN/Inf first.
    check = costs.check[0] * len(model.params) + costs.check[1] * model.n_total
    if ex == "powersgd":
        lr = _lowrank_of(case, model)
        c0, cr, a, c = costs.powersgd
        t = check + c0 * lr.layers + cr * lr.rank_sum + a * lr.lowrank_numel + \
            c * lr.n_times_rank
        if case.gains:
            t += costs.norm * lr.lowrank_numel
        if case.sent == "dense":
            t += costs.copy * lr.lowrank_numel
        return t
    if not case.selects:
        return check
    # Hierarchical: each of the host's S ranks compresses one shard (1/S of the layers).
    share = 1.0 / layout.slots if ex == "hierarchical" else 1.0
    c0, a, b, u, v = costs.pipeline
    k_min = model.kept_total(case.level_min)
    t = c0 * model.layers_comp + a * model.n_comp + b * k_min + \
        _selections(case, model, costs)[1]
    if case.gains:
        t += costs.norm * model.n_comp
    if case.sent == "sparse":
        chunks = {"allgather": layout.n, "hierarchical": layout.hosts}.get(ex, 1)
        t += u * chunks * model.kept_total(case.theta) + v * chunks
    else:
        t += costs.copy * model.n_comp
    if ex == "shared_index" and not case.shared_selection:
        # Each layer's leader selects it (both levels) while the others wait for the
        # indices: the step waits for the largest share (``leader_share``), priced at solo
        # speed where measured (the ranks with smaller shares are done and waiting), not
        # for every rank selecting every layer as the pipeline's fit counts.
        t += leader_share(model, layout.n) * sum(_selections(case, model, solo or costs)) \
            - sum(_selections(case, model, costs))
    t = check + share * t
    if ex == "hierarchical" and layout.slots > 1:
        # the host share: every rank copies the other shards' gradients in
        t += costs.copy * model.n_total * (1 - share)
    return t


def leader_share(model: ModelShapes, n: int) -> float:
    """shared_index: the fraction of the compressed elements whose selection a step waits
    for. Each layer has a leader, the layers spread over the N ranks by size
    (gravac/engine/shared_index.py), so the most-loaded rank selects about the larger of an
    even share and the largest layer (a lower bound of its load, which it reaches when the
    layers pack evenly, as the LSTM's two big layers do on 2 or 4 ranks).

    >>> leader_share(ModelShapes.from_params([("a", (3000,)), ("b", (2000,))]), 4)
    0.6
    >>> leader_share(ModelShapes.from_params([(f"w{i}", (2000,)) for i in range(8)]), 4)
    0.25
    """
    if not model.n_comp:
        return 0.0
    return min(1.0, max(1.0 / max(1, n), max(model.comp) / model.n_comp))


def _selections(case: StepCase, model: ModelShapes,
                costs: CompressionCosts) -> tuple[float, float]:
    """Seconds of the two levels' selections over the compressed layers by ``select``'s
    fit: (θmin's over all n entries, the candidate's over the k kept; 0 without one)."""
    s0, sa, sb = costs.select
    k_min = model.kept_total(case.level_min)
    first = s0 * model.layers_comp + sa * model.n_comp + sb * k_min
    second = s0 * model.layers_comp + sa * k_min + sb * model.kept_total(case.theta_c) \
        if case.theta_c else 0.0
    return first, second


@dataclass(frozen=True)
class StepTime:
    compute: float
    local: float
    comm: float

    @property
    def total(self) -> float:
        return self.compute + self.local + self.comm


def step_time(case: StepCase, model: ModelShapes, layout: Layout, net: Network,
              costs: CompressionCosts, t_compute: float,
              solo: CompressionCosts | None = None) -> StepTime:
    """t_step = t_compute + t_local + t_comm (no overlap)."""
    return StepTime(t_compute, local_time(case, model, layout, costs, solo),
                    comm_time(case, model, layout, net))


# -- crossovers -------------------------------------------------------------------------------
def crossover_n(case: StepCase, model: ModelShapes, slots: int, net: Network,
                costs: CompressionCosts = NO_LOCAL, max_n: int = 8192,
                baseline: StepCase = StepCase("dense")) -> int | None:
    """The smallest N (2, 3, ... hosts of ``slots`` ranks) at which ``case`` no longer
    beats ``baseline`` in local + communication time (compute is the same on both sides
    and cancels). None when it still beats it at ``max_n``; 0 when it does not beat it
    even on 2 hosts. The scan starts at 2 hosts: on one host every rank shares the fast
    local link, a regime of its own.

    Example::

        crossover_n(StepCase("allgather", theta=100), model, 1, net)   # about 100
    """
    for hosts in range(2, max_n // slots + 1):
        layout = Layout(hosts, slots)
        ours = local_time(case, model, layout, costs) + comm_time(case, model, layout, net)
        theirs = local_time(baseline, model, layout, costs) + \
            comm_time(baseline, model, layout, net)
        if ours >= theirs:
            return 0 if hosts == 2 else layout.n
    return None


def allgather_crossover_exact(theta: float, n_floats: float, link: Link,
                              header_bytes: float = 0.0, allreduce_rounds: int = 0) -> float:
    """Where a sparse allgather of n/θ (value, index) pairs of 4 + 4 bytes plus a header h
    stops beating a ring allreduce of n fp32, one rank per host, with ``allreduce_rounds``
    small allreduces in the step besides (gravac's static step: 1, the NaN/Inf flags;
    GraVAC: 2, the gains round too; their bytes neglected):

        (N−1)[(1 + 2r)α + (8n/θ + h)β] = 2(N−1)α + 2(N−1)/N·4n·β
        ⇔  1/N* = 1/θ + ((2r − 1)α + hβ) / (8nβ)

    so N* = θ exactly when α = h = 0 (the rule "θ > N"). A bare allgather (r = 0) has
    N−1 latency steps against the ring allreduce's 2(N−1): latency favours it; gravac's
    step (r >= 1) pays more latency than dense, which lowers N* below θ, the more so
    the smaller the model. Returns inf when the allgather always wins.

    >>> allgather_crossover_exact(100, 1e6, Link(0.0, 1e-9))
    100.0
    >>> round(allgather_crossover_exact(100, 1e6, Link(8e-6, 1e-9), allreduce_rounds=1), 1)
    90.9
    """
    inv = 1.0 / theta + ((2 * allreduce_rounds - 1) * link.alpha_s
                         + header_bytes * link.beta_s_per_byte) / \
        (8.0 * n_floats * link.beta_s_per_byte)
    return math.inf if inv <= 0 else 1.0 / inv


def shared_index_crossover_approx(theta: float, n_comp: float, link: Link,
                                  gains: bool = False, index_bytes: float | None = None) -> float:
    """Where shared_index stops beating a dense ring allreduce, one rank per host: its
    bytes are a fixed share of dense's (values 4n/θ and indices b·n/θ against 4n, whatever
    N), but it has one more allreduce round (the indices; two with GraVAC's gains), whose
    2(N−1)α grows with N. Neglecting the small layers, the layer counts and the flags:

        2(N−1)α·(1 + gains) = 2(N−1)/N·β·n(4 − (4 + b)/θ)
        ⇔  N* = nβ(4 − (4 + b)/θ) / (α(1 + gains))

    b, the bytes of an index: ``index_bytes``, else what the engine's codec spends on one
    layer of n_comp entries (``index_bytes_per_entry``; 1.78 at n = 1e6, θ = 100).

    >>> round(shared_index_crossover_approx(100, 1e6, Link(1e-5, 1e-9), index_bytes=4), 6)
    392.0
    >>> round(shared_index_crossover_approx(100, 1e6, Link(1e-5, 1e-9)), 4)
    394.2184
    """
    if link.alpha_s <= 0:
        return math.inf
    b = index_bytes_per_entry(int(n_comp), theta) if index_bytes is None else index_bytes
    return n_comp * link.beta_s_per_byte * (4.0 - (4.0 + b) / theta) / \
        (link.alpha_s * (2 if gains else 1))


def index_bytes_per_entry(numel: int, theta: float) -> float:
    """Bytes shared_index's buffer spends per index of one layer of ``numel`` at CF θ
    (gravac/engine/index_codec.py, padding included)."""
    return index_field_bytes(numel, theta) / num_kept(numel, theta)


# -- least squares ----------------------------------------------------------------------------
def least_squares(rows: Sequence[Sequence[float]], y: Sequence[float],
                  weights: Sequence[float] | None = None, nonneg: bool = True) -> list[float]:
    """Coefficients c minimising Σ w_i (rows_i · c − y_i)², with c >= 0 when ``nonneg``
    (a negative coefficient is fixed at 0 and the others refitted). Pure Python: a few
    coefficients, columns scaled to 1 so that bytes and counts can share a fit.

    >>> [round(c, 6) for c in least_squares([[1, 1], [1, 2], [1, 3]], [3, 5, 7])]
    [1.0, 2.0]
    """
    p = len(rows[0])
    w = list(weights) if weights is not None else [1.0] * len(rows)
    scale = [max(abs(r[j]) for r in rows) or 1.0 for j in range(p)]
    active = [j for j in range(p) if any(r[j] for r in rows)]
    while True:
        sol = _solve_normal([[r[j] / scale[j] for j in active] for r in rows], y, w)
        coef = [0.0] * p
        for j, v in zip(active, sol):
            coef[j] = v / scale[j]
        negative = [j for j in active if coef[j] < 0]
        if not nonneg or not negative:
            return coef
        active.remove(min(negative, key=lambda j: coef[j] * scale[j]))
        if not active:
            return [0.0] * p


def _solve_normal(x: list[list[float]], y, w) -> list[float]:
    p = len(x[0]) if x and x[0] else 0
    if p == 0:
        return []
    a = [[sum(wi * r[i] * r[j] for r, wi in zip(x, w)) for j in range(p)] for i in range(p)]
    b = [sum(wi * r[i] * yi for r, yi, wi in zip(x, y, w)) for i in range(p)]
    # Gaussian elimination with partial pivoting; a (near-)singular column gets 0.
    m = [row + [bi] for row, bi in zip(a, b)]
    for col in range(p):
        pivot = max(range(col, p), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-300:
            continue
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(p):
            if r != col and m[r][col]:
                f = m[r][col] / m[col][col]
                m[r] = [vr - f * vc for vr, vc in zip(m[r], m[col])]
    return [m[i][p] / m[i][i] if abs(m[i][i]) > 1e-300 else 0.0 for i in range(p)]


def fit_link(points: Iterable[tuple[str, int, float, float]]) -> tuple[Link, dict]:
    """α and β from measured (collective, ranks, bytes, seconds): least squares on the
    collectives' α-β formulas, relative errors (weights 1/t²) so that 8-byte latencies
    count as much as 32 MB transfers. Returns the link and the fit's quality.

    >>> pts = [("allreduce", 4, b, ring_allreduce_time(b, 4, Link(3e-5, 8e-9))) for b in (8, 1e6)]
    >>> link, _ = fit_link(pts); round(link.alpha_s * 1e6, 3), round(link.beta_s_per_byte * 1e9, 3)
    (30.0, 8.0)
    """
    pts = [p for p in points if p[3] > 0]
    if not pts:
        raise ValueError("no measurements to fit")
    rows = [collective_terms(kind, nbytes, n) for kind, n, nbytes, _ in pts]
    y = [t for *_, t in pts]
    alpha, beta = least_squares(rows, y, [1.0 / t ** 2 for t in y])
    link = Link(alpha, beta)
    errors = [link.time(r) / t - 1.0 for r, t in zip(rows, y)]
    return link, {"points": len(pts), "max_rel_err": max(abs(e) for e in errors),
                  "rms_rel_err": math.sqrt(sum(e * e for e in errors) / len(errors))}


# -- reading models ---------------------------------------------------------------------------
#: The paper's three workloads (docs/ALGORITHM.md, configs/models/).
PAPER_MODELS = {
    "resnet101": "configs/models/resnet101_cifar10.yaml",
    "vgg16": "configs/models/vgg16_cifar100.yaml",
    "lstm": "configs/models/lstm_ptb.yaml",
}
#: PTB's vocabulary (the word_language_model corpus of ptb.train.txt: 9,999 words + <eos>).
PTB_VOCAB = 10_000


def model_kwargs(cfg) -> tuple[dict, str, tuple]:
    """The ``build_model`` options of a config as gravac/train/tasks.py would make them,
    without reading data: (kwargs, input kind "image"/"text", input shape per rank)."""
    from gravac.train.tasks import data_options

    d = cfg.data
    opts = data_options(cfg)
    language = d.name in ("ptb", "synthetic_text")
    if language:
        vocab = PTB_VOCAB if d.name == "ptb" else opts["vocab_size"]
        return ({"vocab_size": vocab, **cfg.model.options}, "text", (d.bptt, d.batch_size))
    classes, channels, size = {"digits": (10, 1, 8), "cifar10": (10, 3, 32),
                               "cifar100": (100, 3, 32)}.get(
        d.name, (opts.get("num_classes", 10), 3, opts.get("image_size", 32)))
    defaults: dict = {"num_classes": classes}
    if cfg.model.name in ("small_cnn", "wide_head_cnn"):
        defaults.update(in_channels=channels, image_size=size)
    elif cfg.model.name in ("resnet18", "resnet50", "resnet101", "vgg16"):
        defaults.update(in_channels=channels)
    return ({**defaults, **cfg.model.options}, "image", (d.batch_size, channels, size, size))


def build_config_model(cfg):
    """(the config's model, input kind, per-rank input shape). Built on the CPU, where
    initialisation is fast (on the meta device each init op is a slow Python
    decomposition); ``training_flops`` moves it to the meta device to count."""
    from gravac.models import build_model

    kwargs, kind, shape = model_kwargs(cfg)
    return build_model(cfg.model.name, **kwargs), kind, shape


def shapes_from_config(cfg, name: str | None = None, built=None) -> ModelShapes:
    model, _, _ = built or build_config_model(cfg)
    return ModelShapes.from_module(model, cfg.compression.min_compress_numel,
                                   name or cfg.model.name)


def training_flops(cfg, built=None) -> float:
    """Forward + backward FLOPs of one step at the config's per-rank batch (counted by
    torch.utils.flop_counter on the meta device: matmuls and convolutions; nothing is
    computed)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    model, kind, shape = built or build_config_model(cfg)
    model = model.to("meta")
    if kind == "text":
        x = torch.zeros(shape, dtype=torch.long, device="meta")
    else:
        x = torch.zeros(shape, device="meta")
    with FlopCounterMode(display=False) as counter:
        out = model(x)
        out = out[0] if isinstance(out, tuple) else out
        out.float().sum().backward()
    return float(counter.get_total_flops())


def load_run_config(run_dir: Path):
    from gravac.train.config import ConfigError, load_config

    path = run_dir / "config.yaml"
    if not path.is_file():
        raise CliError(f"run directory {run_dir}: no config.yaml (not a train.py run directory?)")
    try:
        return load_config([path])
    except ConfigError as exc:
        raise CliError(f"run directory {run_dir}: config.yaml: {exc}") from None


def exchange_of(cfg) -> str:
    """The cost model's exchange for a run config; CliError for what it does not model."""
    c = cfg.compression
    if c.controller == "dense" or c.compressor == "none":
        return "fp16" if c.horovod_compression == "fp16" else "dense"
    if c.controller == "accordion":
        raise CliError("controller accordion: per-layer CFs are not modelled (use static, "
                       "gravac or dense runs)")
    if c.overlap:
        raise CliError("compression.overlap: true: overlap with backward is not modelled "
                       "(the model adds compute, local work and communication)")
    if c.ddp_powersgd_rank:
        raise CliError("compression.ddp_powersgd_rank: DDP's PowerSGD hook is not modelled")
    return "powersgd" if c.compressor == "powersgd" else c.exchange


def case_of(record: dict, cfg, exchange: str) -> StepCase:
    """The StepCase of one step record of a run."""
    c = cfg.compression
    wire = 2 if c.horovod_compression == "fp16" else 4
    if exchange in ("dense", "fp16"):
        return StepCase(exchange)
    sent = "dense" if record.get("sent") == "dense" else "sparse"
    theta_min = record.get("theta_min")
    # GraVAC agrees gains unless it planned the step dense (θmin 1: E2's probes, E3).
    gains = c.controller == "gravac" and (theta_min or 0) > 1
    theta_c = record.get("theta_c")
    if theta_c is not None and theta_min is not None and theta_c <= theta_min:
        theta_c = None
    theta = float(record.get("cf") or 1.0)
    # Random-k draws the same indices on every rank unless told otherwise (its default).
    shared = c.compressor == "randomk" and bool(c.compressor_options.get("same_across_ranks",
                                                                         True))
    if exchange == "powersgd":
        rank = c.rank if c.controller == "static" and c.rank else None
        return StepCase("powersgd", theta=theta if sent == "sparse" else 1.0,
                        theta_min=theta_min if not rank else None, theta_c=theta_c,
                        rank=rank, sent=sent, gains=gains, dense_wire=wire)
    if sent == "dense" and (theta_min is None or theta_min <= 1 or c.controller == "static"
                            and (c.cf or 1) <= 1):
        theta_min = None            # planned dense: nothing selected
    return StepCase(exchange, theta=theta if sent == "sparse" else 1.0,
                    theta_min=theta_min if theta_min and theta_min > 1 else None,
                    theta_c=theta_c, sent=sent, gains=gains, dense_wire=wire,
                    shared_selection=shared)


# -- measure-compression ----------------------------------------------------------------------
def _timed(fn, repeats: int) -> float:
    from timing import median_time     # benchmarks/timing.py, beside this file
    return median_time(fn, repeats)


def measure_compression(sizes: Sequence[int], cfs: Sequence[float], chunks: Sequence[int],
                        repeats: int, compressor: str = "topk",
                        lowrank_shapes: Sequence[tuple[int, int]] = ((64, 64), (256, 256),
                                                                     (512, 1024), (1024, 2048)),
                        ranks: Sequence[int] = (1, 2, 4), seed: int = 0,
                        sync=None) -> dict:
    """Time gravac's own local code on flat tensors and fit the per-element costs of
    ``CompressionCosts``. Returns the JSON document (samples and fits).

    ``sync()``, when given, is called before every timed sample: the processes of
    ``measure_compression_concurrent`` wait for each other there, so that they time the
    same work at the same moment, as the ranks of a step do."""
    import torch

    from gravac import compressors
    from gravac.compressors import SelectContext
    from gravac.compressors.powersgd import orthogonalize_
    from gravac.engine.codec import SparseCodec, SparseLayer
    from gravac.memory import ResidualMemory, SparseSent
    try:
        from gravac.engine.selection import has_nonfinite
    except ImportError:          # before the engine's selection helpers had a module
        from gravac.engine.step import has_nonfinite

    def timed(fn, repeats):
        if sync is not None:
            sync()
        return _timed(fn, repeats)

    g = torch.Generator().manual_seed(seed)
    comp = compressors.get(compressor)
    samples: dict[str, list] = {"pipeline": [], "select": [], "norm": [], "copy": [], "cast": [],
                                "powersgd": [], "check": []}
    step = iter(range(10 ** 9))
    for n in sizes:
        grad = torch.randn(n, generator=g)
        out = torch.empty(n)
        samples["norm"].append((n, timed(lambda: torch.dot(grad, grad), repeats)))
        samples["copy"].append((n, timed(lambda: out.copy_(grad), repeats)))
        samples["cast"].append((n, timed(lambda: out.copy_(grad.to(torch.float16)),
                                         repeats)))
        samples["check"].append((n, timed(lambda: has_nonfinite([grad]), repeats)))
        for cf in cfs:
            k = num_kept(n, cf)
            samples["select"].append((n, k, timed(
                lambda: grad.index_select(
                    0, comp.select(grad, k, SelectContext(step=next(step)))), repeats)))
            codec = SparseCodec([SparseLayer("x", n, torch.float32)])
            for c in chunks:
                # C chunks of other ranks' selections (distinct random indices each).
                parts = []
                for _ in range(c):
                    # Ranks' picks overlap as they do in training (index_add sums them).
                    idx = torch.randint(0, n, (k,), generator=g)
                    parts.append(codec.pack([(torch.randn(k, generator=g), idx)])[0])
                gathered = torch.cat(parts)
                memory = ResidualMemory()

                def pipeline():
                    g_ef = memory.compensate("x", grad)
                    idx = comp.select(g_ef, k, SelectContext(step=next(step)))
                    vals = g_ef.index_select(0, idx)      # the engine's gather
                    memory.update("x", g_ef, SparseSent(idx, vals))
                    _, ctx = codec.pack([(vals, idx)])
                    codec.aggregate_into(gathered, ctx, c, [out])

                samples["pipeline"].append((n, k, c, timed(pipeline, repeats)))
    for rows, cols in lowrank_shapes:
        grad = torch.randn(rows * cols, generator=g)
        target = torch.empty(rows, cols)
        for r in ranks:
            q = torch.randn(cols, r, generator=g)
            memory = ResidualMemory()

            def lowrank():
                g_ef = memory.compensate("m", grad)
                m = g_ef.view(rows, cols)
                p = orthogonalize_(m @ q)
                q_new = m.t() @ p
                m_hat = p @ q_new.t()
                target.copy_(m_hat)
                memory.update("m", g_ef, m_hat)

            samples["powersgd"].append((rows * cols, r, timed(lowrank, repeats)))
    return {"kind": "gravac.scaling.compression", "compressor": compressor,
            "threads": torch.get_num_threads(), "ranks": 1, "cores": os.cpu_count(),
            "torch": torch.__version__, "repeats": repeats, "samples": samples,
            "fits": fit_compression(samples)}


def _compression_worker(kwargs: dict, threads: int, barrier, results) -> None:
    """One process of ``measure_compression_concurrent`` (module level: spawn pickles it)."""
    import torch

    torch.set_num_threads(threads)
    try:
        results.put(("ok", measure_compression(**kwargs, sync=barrier.wait)))
    except BaseException as exc:                # the parent reports it and stops the others
        barrier.abort()
        results.put(("error", f"{type(exc).__name__}: {exc}"))


def slowest_samples(docs: Sequence[dict]) -> dict:
    """Samples of several processes' ``measure_compression`` documents (the same sizes in
    the same order), each with the largest time of any process."""
    return {name: [[*rows[0][:-1], max(r[-1] for r in rows)]
                   for rows in zip(*(d["samples"][name] for d in docs))]
            for name in docs[0]["samples"]}


def measure_compression_concurrent(procs: int, threads: int = 1, **kwargs) -> dict:
    """``measure_compression`` in ``procs`` processes at once on this machine, every sample
    started together: the local costs of a step with ``procs`` ranks sharing the cores
    (memory bandwidth and caches included, which ``contention()``'s ranks/cores leaves out).
    Each sample keeps the slowest process's time, since a collective after the local work
    waits for the last rank. The document has ``ranks: procs``, so ``validate`` applies no
    contention factor to it at that many ranks.

    Example::

        doc = measure_compression_concurrent(4, sizes=[2**16, 2**20], cfs=[10, 100],
                                             chunks=[1, 4], repeats=5)
        CompressionCosts.from_json(doc).ranks      # 4
    """
    import multiprocessing as mp
    import queue

    if procs == 1:
        import torch
        torch.set_num_threads(threads)
        return measure_compression(**kwargs)
    ctx = mp.get_context("spawn")        # a fork would share torch's thread pools
    barrier, results = ctx.Barrier(procs), ctx.Queue()
    workers = [ctx.Process(target=_compression_worker, args=(kwargs, threads, barrier, results),
                           daemon=True) for _ in range(procs)]
    for w in workers:
        w.start()
    docs, errors = [], []
    try:
        while len(docs) + len(errors) < procs:
            try:
                status, value = results.get(timeout=5)
            except queue.Empty:
                if not any(w.is_alive() for w in workers):
                    errors.append("a measuring process died without a result")
                    break
                continue
            (docs if status == "ok" else errors).append(value)
    finally:
        for w in workers:
            w.join(timeout=10)
            if w.is_alive():
                w.terminate()
    if errors:
        raise CliError(f"measure-compression --procs {procs}: {errors[0]}")
    samples = slowest_samples(docs)
    return {**docs[0], "ranks": procs, "samples": samples, "fits": fit_compression(samples),
            "per_process_fits": [d["fits"] for d in docs]}


def fit_compression(samples: dict) -> dict:
    """Least-squares fits (relative errors) of the measured samples; each fit's
    ``coef`` in the order of its ``terms``."""
    def fit(rows, y, terms):
        coef = least_squares(rows, y, [1.0 / t ** 2 for t in y])
        pred = [sum(c * x for c, x in zip(coef, r)) for r in rows]
        errs = [p / t - 1.0 for p, t in zip(pred, y)]
        return {"terms": terms, "coef": coef,
                "max_rel_err": max(abs(e) for e in errs) if errs else None}

    out = {}
    p = samples["pipeline"]
    out["pipeline"] = fit([[1, n, k, c * k, c] for n, k, c, _ in p], [t for *_, t in p],
                          ["per layer", "per element", "per kept", "per chunk x kept", "per chunk"])
    s = samples["select"]
    out["select"] = fit([[1, n, k] for n, k, _ in s], [t for *_, t in s],
                        ["per call", "per element", "per kept"])
    for name in ("norm", "copy", "cast", "check"):
        s = samples.get(name)
        if not s:
            continue
        out[name] = fit([[1, n] for n, _ in s], [t for _, t in s], ["per call", "per element"])
    s = samples["powersgd"]
    out["powersgd"] = fit([[1, r, n, n * r] for n, r, _ in s], [t for *_, t in s],
                          ["per layer", "per layer x rank", "per element", "per element x rank"])
    return out


# -- calibrate --------------------------------------------------------------------------------
#: gravac's collectives -> the model's: both allreduce forms are "allreduce".
OP_KIND = {"allreduce": "allreduce", "grouped_allreduce": "allreduce",
           "allgather": "allgather", "broadcast": "broadcast",
           "allreduce_fp16": "allreduce_fp16"}


def calibrate(measurements: Sequence[dict]) -> dict:
    """Fit α, β per (link scope, collective) from ``collectives.py`` JSON documents of
    one layout; groups of one scope with different ranks (world and leaders) are fitted
    together, which separates α from β."""
    first = measurements[0]
    points: dict[tuple[str, str], list] = {}
    for m in measurements:
        for group in m["groups"].values():
            for op, rows in group["ops"].items():
                for row in rows:
                    key = (group["scope"], OP_KIND[op])
                    points.setdefault(key, []).append(
                        (OP_KIND[op], group["ranks"], row["bytes"], row["median_s"]))
    def entry(pts):
        link, quality = fit_link(pts)
        return {"alpha_s": link.alpha_s, "beta_s_per_byte": link.beta_s_per_byte,
                "gbit_per_s": link.gbit_per_s, **quality}

    links: dict[str, dict] = {}
    by_ranks: dict[str, dict] = {}
    for (scope, kind), pts in sorted(points.items()):
        links.setdefault(scope, {})[kind] = entry(pts)
        for n in sorted({p[1] for p in pts}):
            by_ranks.setdefault(scope, {}).setdefault(kind, {})[str(n)] = \
                entry([p for p in pts if p[1] == n])
    lockstep = pool_lockstep([m["lockstep"] for m in measurements if m.get("lockstep")])
    return {"kind": "gravac.scaling.calibration", "hosts": first["hosts"],
            "slots": first["slots"], "n": first["n"], "link": first.get("link"),
            "backend": first.get("backend"), "horovod_cycle_time_ms":
                first.get("horovod_cycle_time_ms"), "links": links, "by_ranks": by_ranks,
            **({"lockstep": fit_lockstep(lockstep)} if lockstep else {})}


# -- validate ---------------------------------------------------------------------------------
@dataclass
class RunCheck:
    run: str
    exchange: str
    n: int
    steps: int
    measured: float          # median t_iter
    predicted: float         # median predicted t_step
    parts: StepTime          # medians of the predicted parts
    measured_parts: dict = field(default_factory=dict)
    bytes_err: float | None = None

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1.0


def read_steps(run_dir: Path, warmup: int) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise CliError(f"run directory {run_dir}: no metrics.jsonl")
    steps = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        # (a step skipped for a NaN/Inf on some rank sends nothing: not modelled)
        if rec.get("kind") == "step" and rec.get("step", 0) > warmup and rec.get("t_iter") \
                and rec.get("sent") != "skipped":
            steps.append(rec)
    if not steps:
        raise CliError(f"run directory {run_dir}: no step records after the {warmup} warm-up "
                       f"steps (run with run.log_interval=1)")
    return steps


def run_backend(run_dir: Path, cfg) -> str:
    """The transport a run used: its run_start record's (``run.backend: auto`` resolved),
    else the config's."""
    with open(run_dir / "metrics.jsonl") as f:
        for line in f:
            rec = json.loads(line) if line.strip() else {}
            if rec.get("kind") == "run_start":
                return rec.get("backend") or cfg.run.backend
    return cfg.run.backend


def median_compute(steps: list[dict]) -> float | None:
    """Median of t_compute + t_update (forward, backward, data, optimizer update)."""
    vals = [s["t_compute"] + (s.get("t_update") or 0.0) for s in steps
            if s.get("t_compute") is not None]
    return statistics.median(vals) if vals else None


def check_run(run_dir: Path, net: Network, costs: CompressionCosts, layout: Layout | None,
              compute: tuple[float, int] | None, cores: int, warmup: int,
              sharing: CpuSharing | None = None,
              compute_sharing: CpuSharing | None = None,
              plain_net: Network | None = None) -> RunCheck:
    """Predict a run's median step time and compare it with the measured one.

    ``plain_net``: links measured with Horovod's own (spinning) wait, for plain Horovod
    runs (dense, fp16), whose waits are Horovod's and not gravac's.

    With ``sharing`` (the layout's calibration has lockstep fits) the compute and local
    work, as measured alone, are stretched by the measured factors; ``compute_sharing`` is
    the reference run's layout's (default: ``sharing`` when it has as many ranks).
    Without, by ``contention``'s ranks/cores."""
    cfg = load_run_config(run_dir)
    exchange = exchange_of(cfg)
    if plain_net is not None and exchange in ("dense", "fp16") and \
            run_backend(run_dir, cfg) == "horovod":
        net = plain_net
    steps = read_steps(run_dir, warmup)
    n = int(steps[0].get("world_size") or 0)
    if layout is None:
        raise CliError("give --hosts and --slots, or a --calibration that has them")
    if n != layout.n:
        raise CliError(f"run directory {run_dir}: {n} ranks, but the layout {layout} has "
                       f"{layout.n} (--hosts/--slots or the --calibration's layout)")
    model = shapes_from_config(cfg)
    own = median_compute(steps)
    solo_costs = None
    if sharing is not None:
        t_compute, local_costs, solo_costs = _shared_cpu(run_dir, own, compute, n, costs,
                                                         sharing, compute_sharing)
    elif compute is None:
        if own is None:
            raise CliError(f"run directory {run_dir}: its records have no t_compute (a plain "
                           f"Horovod/DDP run); give --compute SECONDS or a reference run")
        t_compute = own
    else:
        t_ref, ranks_ref = compute
        t_compute = t_ref * contention(n, cores) / contention(ranks_ref, cores)
    if sharing is None:
        local_costs = costs.scaled(contention(n, cores) / contention(costs.ranks, cores))
    predicted, bytes_errs = [], []
    for rec in steps:
        case = case_of(rec, cfg, exchange)
        predicted.append(step_time(case, model, layout, net, local_costs, t_compute,
                                   solo_costs))
        expect = recorded_bytes(case, model, layout)
        if expect and rec.get("bytes_sent"):
            bytes_errs.append(abs(expect / rec["bytes_sent"] - 1.0))
    med = lambda xs: statistics.median(xs) if xs else None   # noqa: E731
    parts = {"compute": own, "local": med([s["t_compress"] for s in steps
                                          if s.get("t_compress") is not None]),
             "comm": med([s["t_comm"] for s in steps if s.get("t_comm") is not None])}
    medians = StepTime(t_compute, statistics.median(p.local for p in predicted),
                       statistics.median(p.comm for p in predicted))
    return RunCheck(str(run_dir), exchange, n, len(steps),
                    statistics.median(s["t_iter"] for s in steps),
                    statistics.median(p.total for p in predicted), medians, parts,
                    max(bytes_errs) if bytes_errs else None)


def _shared_cpu(run_dir: Path, own: float | None, compute: tuple[float, int] | None, n: int,
                costs: CompressionCosts, sharing: CpuSharing,
                compute_sharing: CpuSharing | None
                ) -> tuple[float, CompressionCosts, CompressionCosts | None]:
    """(predicted compute of a step's CPU phase, local costs, costs of work one rank does
    while the others wait) from the lockstep fits."""
    if costs.ranks != 1:
        raise CliError(f"--compression: its costs were measured by {costs.ranks} processes at "
                       "once; the calibration's lockstep factors apply to costs measured "
                       "alone (measure-compression without --procs)")
    if compute is None:
        if own is None:
            raise CliError(f"run directory {run_dir}: its records have no t_compute (a plain "
                           f"Horovod/DDP run); give --compute SECONDS or a reference run")
        alone = sharing.compute_alone(own)
    else:
        t_ref, ranks_ref = compute
        ref = compute_sharing or (sharing if ranks_ref == n else None)
        if ref is None:
            raise CliError(f"--compute: the reference ran with {ranks_ref} ranks, this layout "
                           f"has {n}; give --compute-calibration (the calibration of the "
                           "reference's layout)")
        alone = ref.compute_alone(t_ref)
    return (sharing.step["gemm"] * alone, costs.scaled(sharing.step["stream"]),
            costs.scaled(sharing.solo) if sharing.solo is not None else None)


def format_checks(checks: list[RunCheck], tolerance: float) -> str:
    ms = lambda x: "—" if x is None else f"{x * 1e3:.1f}"    # noqa: E731
    lines = ["| run | exchange | N | steps | measured t_step (ms) | predicted (ms) | error "
             "| compute meas./pred. (ms) | local meas./pred. (ms) | comm meas./pred. (ms) "
             "| bytes_sent model error |",
             "|---|---|---:|---:|---:|---:|---:|---|---|---|---:|"]
    for c in checks:
        flag = "" if abs(c.error) <= tolerance else " **over**"
        b = "—" if c.bytes_err is None else f"{c.bytes_err * 100:.2f}%"
        p = c.parts
        lines.append(
            f"| {c.run} | {c.exchange} | {c.n} | {c.steps} | {ms(c.measured)} | {ms(c.predicted)} "
            f"| {c.error * 100:+.1f}%{flag} | {ms(c.measured_parts.get('compute'))} / "
            f"{ms(p.compute)} | {ms(c.measured_parts.get('local'))} / {ms(p.local)} "
            f"| {ms(c.measured_parts.get('comm'))} / {ms(p.comm)} | {b} |")
    return "\n".join(lines)


# -- project ----------------------------------------------------------------------------------
DEFAULT_ALPHA_US = 25.0        # an assumption for a datacenter TCP link (docs/SCALING.md §2)
DEFAULT_LOCAL_GBIT = 200.0     # an assumption for inside a host (PCIe/shared memory class)
DEFAULT_LOCAL_ALPHA_US = 5.0
DEFAULT_DEVICE_TFLOPS = 10.0   # an assumption: sustained fp32 of a V100-class GPU


def projection_cases(cfs: Sequence[float], ranks: Sequence[int],
                     exchanges: Sequence[str]) -> list[StepCase]:
    cases = []
    for ex in exchanges:
        if ex in ("dense", "fp16"):
            cases.append(StepCase(ex))
        elif ex == "powersgd":
            cases += [StepCase("powersgd", rank=r) for r in ranks]
        else:
            cases += [StepCase(ex, theta=float(cf)) for cf in cfs]
    return cases


@dataclass
class Projection:
    model: ModelShapes
    compute_s: float
    compute_source: str
    links: list[float]
    ns: list[int]
    slots: int
    cases: list[StepCase]
    times: dict          # (link, n, label) -> StepTime
    crossovers: dict     # (link, label) -> (step crossover, comm-only crossover)
    gains: dict          # (link, n) -> seconds of GraVAC's gains allreduce


def project(model: ModelShapes, compute_s: float, compute_source: str, links: Sequence[float],
            ns: Sequence[int], slots: int, cases: Sequence[StepCase], alpha_s: float,
            local: Link, costs: CompressionCosts, max_n: int) -> Projection:
    times, crossovers, gains = {}, {}, {}
    dense = StepCase("dense")
    for gbit in links:
        net = Network(Link.from_gbit(gbit, alpha_s), local)
        for n in ns:
            layout = Layout(n // slots, slots)
            for case in [dense, *cases]:
                times[(gbit, n, case.label())] = step_time(case, model, layout, net, costs,
                                                           compute_s)
            gains[(gbit, n)] = round_time(
                [Collective("allreduce", "world", 8 * (3 + n))], layout, net)
        for case in cases:
            if case.exchange == "dense":
                continue
            crossovers[(gbit, case.label())] = (
                crossover_n(case, model, slots, net, costs, max_n),
                crossover_n(case, model, slots, net, NO_LOCAL, max_n))
    return Projection(model, compute_s, compute_source, list(links), list(ns), slots,
                      list(cases), times, crossovers, gains)


def _crossover_text(value: int | None, slots: int, max_n: int) -> str:
    if value is None:
        return f"> {max_n}"
    if value == 0:
        return "never"
    return str(value)


def projection_markdown(p: Projection, max_n: int) -> str:
    m = p.model
    out = [f"### {m.name}", "",
           f"{m.n_total:,} parameters in {len(m.params)} tensors; {m.n_comp:,} in "
           f"{m.layers_comp} compressed layers (≥ {m.min_compress_numel} elements), "
           f"{m.n_dense:,} always dense. Compute per step: {p.compute_s * 1e3:.1f} ms "
           f"({p.compute_source}). {p.slots} ranks per host.", ""]
    labels = [c.label() for c in p.cases if c.exchange != "dense"]
    for gbit in p.links:
        out += [f"#### {gbit:g} Gbit/s: step time in ms (speed-up over dense fp32)", "",
                "| N | dense | " + " | ".join(labels) + " |",
                "|---:|---:|" + "---:|" * len(labels)]
        for n in p.ns:
            d = p.times[(gbit, n, "dense")].total
            cells = [f"{p.times[(gbit, n, lab)].total * 1e3:.1f} "
                     f"({d / p.times[(gbit, n, lab)].total:.2f}x)" for lab in labels]
            out.append(f"| {n} | {d * 1e3:.1f} | " + " | ".join(cells) + " |")
        out.append("")
        out += [f"Communication only at {gbit:g} Gbit/s, ms per step:", "",
                "| N | dense | " + " | ".join(labels) + " | GraVAC gains round |",
                "|---:|---:|" + "---:|" * (len(labels) + 1)]
        for n in p.ns:
            cells = [f"{p.times[(gbit, n, lab)].comm * 1e3:.2f}" for lab in ["dense", *labels]]
            out.append(f"| {n} | " + " | ".join(cells) +
                       f" | {p.gains[(gbit, n)] * 1e3:.2f} |")
        out.append("")
    out += ["#### Crossover N: the first N at which the exchange no longer beats dense fp32",
            "", "Scanned from 2 hosts up. Step = local compression + communication "
            "(compute cancels); comm = communication only. `never`: behind dense already "
            f"on 2 hosts; `> {max_n}`: still ahead at {max_n}.", "",
            "| exchange | " + " | ".join(f"{g:g} Gbit/s step | {g:g} Gbit/s comm"
                                        for g in p.links) + " |",
            "|---|" + "---:|---:|" * len(p.links)]
    for lab in labels:
        cells = []
        for gbit in p.links:
            step, comm = p.crossovers[(gbit, lab)]
            cells += [_crossover_text(step, p.slots, max_n), _crossover_text(comm, p.slots, max_n)]
        out.append(f"| {lab} | " + " | ".join(cells) + " |")
    out.append("")
    return "\n".join(out)


def projection_json(p: Projection) -> dict:
    return {"model": p.model.name, "n_total": p.model.n_total, "n_comp": p.model.n_comp,
            "compute_s": p.compute_s, "compute_source": p.compute_source, "slots": p.slots,
            "times": [{"gbit": g, "n": n, "case": lab, "compute": t.compute, "local": t.local,
                       "comm": t.comm, "total": t.total}
                      for (g, n, lab), t in p.times.items()],
            "crossovers": [{"gbit": g, "case": lab, "step": s, "comm": c}
                           for (g, lab), (s, c) in p.crossovers.items()],
            "gains_round": [{"gbit": g, "n": n, "seconds": s} for (g, n), s in p.gains.items()]}


def plot_projection(p: Projection, path: Path) -> None:
    """Speed-up over dense fp32 against N, one panel per link rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"fp16": "grey", "allgather": "tab:red", "hierarchical": "tab:orange",
               "shared_index": "tab:blue", "powersgd": "tab:green"}
    styles = ["-", "--", ":", "-."]
    fig, axes = plt.subplots(1, len(p.links), figsize=(5 * len(p.links), 4.8), squeeze=False,
                             sharey=True)
    for ax, gbit in zip(axes[0], p.links):
        seen: dict[str, int] = {}
        for case in p.cases:
            if case.exchange == "dense":
                continue
            lab = case.label()
            i = seen.setdefault(case.exchange, 0)
            seen[case.exchange] += 1
            y = [p.times[(gbit, n, "dense")].total / p.times[(gbit, n, lab)].total for n in p.ns]
            ax.plot(p.ns, y, styles[i % len(styles)], color=colours.get(case.exchange, "black"),
                    marker=".", label=lab)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("workers N")
        ax.set_title(f"{p.model.name}, {gbit:g} Gbit/s")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("speed-up of the step over dense fp32")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(7, len(labels)), fontsize=8)
    rows = math.ceil(len(labels) / 7)
    fig.tight_layout(rect=(0, 0.06 * rows + 0.02, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- CLI --------------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line naming the argument."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive(kind):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value
    return parse


def _matrix(text: str) -> tuple[int, int]:
    rows, sep, cols = text.lower().partition("x")
    try:
        shape = (int(rows), int(cols))
    except ValueError:
        shape = None
    if not sep or shape is None or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not ROWSxCOLS (e.g. 512x1024)")
    return shape


def _read_json(path: Path, what: str, kind: str) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise CliError(f"{what} {path}: no such file") from None
    except json.JSONDecodeError as exc:
        raise CliError(f"{what} {path}: not JSON ({exc})") from None
    if data.get("kind") != kind:
        raise CliError(f"{what} {path}: not a {kind} file (kind {data.get('kind')!r})")
    return data


def _write(path: Path | None, text: str) -> None:
    if path is None:
        print(text)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    print(f"{PROG}: wrote {path}", file=sys.stderr)


def _duration(seconds: float) -> str:
    """A duration with a readable unit.

    >>> _duration(2.5e-9), _duration(3e-5)
    ('2.5 ns', '30 µs')
    """
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e9:.3g} ns"


def cmd_measure_compression(args) -> int:
    import torch

    torch.set_num_threads(args.threads)
    t0 = time.time()
    doc = measure_compression_concurrent(
        args.procs, args.threads, sizes=args.sizes, cfs=args.cfs, chunks=args.chunks,
        repeats=args.repeats, compressor=args.compressor, lowrank_shapes=args.lowrank_shapes,
        ranks=args.lowrank_ranks, seed=args.seed)
    doc["seconds"] = time.time() - t0
    f = doc["fits"]
    together = f", {args.procs} processes at once (the slowest each)" if args.procs > 1 else ""
    lines = [f"local costs ({args.compressor}, {args.threads} thread(s){together}, median of "
             f"{args.repeats}, {doc['seconds']:.0f}s):"]
    for name, fit in f.items():
        terms = ", ".join(f"{t} {_duration(c)}" for t, c in zip(fit["terms"], fit["coef"]))
        lines.append(f"  {name}: {terms} (max fit error {fit['max_rel_err'] * 100:.0f}%)")
    print("\n".join(lines), file=sys.stderr)
    _write(args.out, json.dumps(doc, indent=1) + "\n")
    return 0


def cmd_calibrate(args) -> int:
    docs = [_read_json(p, "measurement", "gravac.scaling.collectives") for p in args.inputs]
    keys = {(d["hosts"], d["slots"], d.get("link")) for d in docs}
    if len(keys) > 1:
        raise CliError(f"inputs: the files are of different layouts {sorted(keys, key=str)}; "
                       "calibrate one layout at a time")
    cal = calibrate(docs)
    cal["inputs"] = [str(p) for p in args.inputs]
    rows = [f"calibration of {cal['hosts']}x{cal['slots']} ({cal['n']} ranks, link "
            f"{cal['link']}, {cal['backend']}); α per ring step, β as Gbit/s:"]
    for scope, kinds in cal["by_ranks"].items():
        for kind, by_n in kinds.items():
            pooled = [("all", cal["links"][scope][kind])] if len(by_n) > 1 else []
            for n, fit in [*pooled, *by_n.items()]:
                rows.append(f"  {scope:5} {kind:9} ranks {n:>3}: "
                            f"α {fit['alpha_s'] * 1e6:9.1f} µs "
                            f" {fit['gbit_per_s']:8.3g} Gbit/s  fit error max "
                            f"{fit['max_rel_err'] * 100:.0f}% rms {fit['rms_rel_err'] * 100:.0f}% "
                            f"({fit['points']} points)")
    for kind, fit in cal.get("lockstep", {}).items():
        rows.append(f"  lockstep {kind:6}: a step's CPU phase x{fit['step_factor']:.2f} the work "
                    f"alone (a rank's own work x{fit['own_factor']:.2f}), sync "
                    f"{fit['sync_s'] * 1e3:.1f} ms ({fit['points']} points"
                    + (f" of {fit['runs']} runs" if fit.get("runs", 1) > 1 else "") + ")")
    print("\n".join(rows), file=sys.stderr)
    _write(args.out, json.dumps(cal, indent=1) + "\n")
    return 0


def _compute_spec(text: str | None, ranks: int | None, warmup: int):
    """--compute: seconds (at --compute-ranks ranks) or a reference run directory."""
    if text is None:
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = None
    if seconds is not None:
        if not seconds > 0:
            raise CliError(f"--compute: must be > 0 seconds or a run directory, got {text}")
        return seconds, ranks or 2
    run = Path(text)
    if not run.is_dir():
        raise CliError(f"--compute: {text} is neither seconds nor a run directory")
    steps = read_steps(run, warmup)
    own = median_compute(steps)
    if own is None:
        raise CliError(f"--compute: run {text} has no t_compute records (use a gravac run)")
    return own, ranks or int(steps[0].get("world_size") or 2)


def _compute_text(compute: tuple[float, int]) -> str:
    return f"{compute[0] * 1e3:.1f} ms at {compute[1]} ranks"


def cmd_validate(args) -> int:
    cal = _read_json(args.calibration, "--calibration", "gravac.scaling.calibration")
    net = Network.from_calibration(cal)
    costs = CompressionCosts.from_json(
        _read_json(args.compression, "--compression", "gravac.scaling.compression")) \
        if args.compression else NO_LOCAL
    hosts = args.hosts or cal.get("hosts")
    slots = args.slots or cal.get("slots")
    layout = Layout(int(hosts), int(slots)) if hosts and slots else None
    compute = _compute_spec(args.compute, args.compute_ranks, args.warmup)
    sharing = None if args.assume_contention else CpuSharing.from_calibration(cal)
    compute_sharing = None
    if args.compute_calibration is not None and sharing is not None:
        ref_cal = _read_json(args.compute_calibration, "--compute-calibration",
                             "gravac.scaling.calibration")
        compute_sharing = CpuSharing.from_calibration(ref_cal)
        if compute_sharing is None:
            raise CliError(f"--compute-calibration {args.compute_calibration}: no lockstep "
                           "fits (measure the collectives again with --lockstep-ms)")
    plain_net = None
    if args.plain_calibration is not None:
        plain = _read_json(args.plain_calibration, "--plain-calibration",
                           "gravac.scaling.calibration")
        if (plain.get("hosts"), plain.get("slots")) != (cal.get("hosts"), cal.get("slots")):
            raise CliError(f"--plain-calibration {args.plain_calibration}: layout "
                           f"{plain.get('hosts')}x{plain.get('slots')}, but --calibration is "
                           f"{cal.get('hosts')}x{cal.get('slots')}; give one of the same layout")
        plain_net = Network.from_calibration(plain)
    checks = [check_run(Path(r), net, costs, layout, compute, args.cores, args.warmup,
                        sharing, compute_sharing, plain_net)
              for r in args.runs]
    if sharing is None:
        cpu = f"contention x{contention(layout.n, args.cores):g} assumed"
    else:
        cpu = ("CPU phase measured (lockstep): compute x" + f"{sharing.step['gemm']:.2f}, "
               f"local work x{sharing.step['stream']:.2f}"
               + (f", shared_index's leader selecting x{sharing.solo:.2f}"
                  if sharing.solo is not None else "") + " their time alone")
    text = (f"Layout {layout} ({layout.n} ranks on {args.cores} cores: {cpu}), "
            f"calibration {args.calibration}, "
            + (f"plain Horovod runs' links {args.plain_calibration}, "
               if args.plain_calibration else "") +
            f"compression costs {args.compression or 'none'}, compute "
            f"{'each run its own' if compute is None else _compute_text(compute)}"
            f"; medians of the steps after {args.warmup}.\n\n"
            + format_checks(checks, args.tolerance))
    _write(args.out, text + "\n")
    worst = max(abs(c.error) for c in checks)
    if worst > args.tolerance:
        print(f"{PROG}: largest error {worst * 100:.1f}% exceeds --tolerance "
              f"{args.tolerance * 100:.0f}%", file=sys.stderr)
        return 1
    return 0


def _projection_models(args) -> list[tuple[ModelShapes, float, str]]:
    """(shapes, compute seconds, where the compute time comes from) per model asked."""
    given = {}
    for item in args.compute_ms or []:
        name, _, value = item.partition("=")
        try:
            given[name] = float(value) / 1e3
        except ValueError:
            raise CliError(f"--compute-ms: expected MODEL=MS, got {item!r}") from None
    out = []
    for path in args.shapes or []:
        try:
            data = json.loads(Path(path).read_text())
            m = ModelShapes.from_json(data)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CliError(f"--shapes {path}: not a shapes file (JSON with name, "
                           f"min_compress_numel, params: [[name, shape], ...]): {exc}") from None
        t = given.get(m.name, data.get("compute_s"))
        if t is None:
            raise CliError(f"--shapes {path}: give its compute time with --compute-ms {m.name}=MS")
        out.append((m, t, "given" if m.name in given else "from the shapes file"))
    for key in args.models:
        path = REPO / PAPER_MODELS[key] if key in PAPER_MODELS else Path(key)
        if not path.is_file():
            raise CliError(f"--models: {key} is neither {', '.join(PAPER_MODELS)} "
                           "nor a config file")
        from gravac.train.config import load_config    # torch: only for real models

        cfg = load_config([path])
        built = build_config_model(cfg)
        m = shapes_from_config(cfg, name=key if key in PAPER_MODELS else cfg.model.name,
                               built=built)
        if m.name in given:
            out.append((m, given[m.name], "given with --compute-ms"))
        else:
            flops = training_flops(cfg, built)
            out.append((m, flops / (args.device_tflops * 1e12),
                        f"{flops / 1e9:.0f} GFLOP forward+backward at batch "
                        f"{cfg.data.batch_size} / {args.device_tflops:g} TFLOP/s assumed"))
    return out


def cmd_project(args) -> int:
    ns = args.n or [2 ** i for i in range(3, 11)]
    bad = [n for n in ns if n % args.slots]
    if bad:
        raise CliError(f"--n: {bad} not multiples of --slots {args.slots}")
    costs = NO_LOCAL
    local_note = "local compression not modelled (no --compression)"
    if args.compression:
        costs = CompressionCosts.from_json(
            _read_json(args.compression, "--compression", "gravac.scaling.compression"))
        costs = costs.scaled(1.0 / args.compression_speedup)
        local_note = (f"local compression costs from {args.compression}"
                      + (f" / {args.compression_speedup:g}"
                         if args.compression_speedup != 1 else ""))
    alpha = args.alpha_us * 1e-6
    alpha_note = f"α {args.alpha_us:g} µs (assumed)"
    if args.calibration:
        cal = _read_json(args.calibration, "--calibration", "gravac.scaling.calibration")
        fit = cal["links"].get("inter", {}).get("allreduce")
        if fit is None:
            raise CliError(f"--calibration {args.calibration}: no inter-host allreduce fit "
                           "(calibrate a layout with 2+ hosts)")
        alpha = fit["alpha_s"]
        alpha_note = f"α {alpha * 1e6:.1f} µs from {args.calibration}"
    local = Link.from_gbit(args.local_gbit, args.local_alpha_us * 1e-6)
    cases = projection_cases(args.cfs, args.ranks, args.exchanges)
    parts = [f"Projection: links {', '.join(f'{g:g}' for g in args.links)} Gbit/s, {alpha_note}; "
             f"inside a host {local.describe()} (assumed); {local_note}; "
             f"t_step = t_compute + t_local + t_comm.", ""]
    results = []
    for model, compute_s, source in _projection_models(args):
        p = project(model, compute_s, source, args.links, ns, args.slots, cases, alpha, local,
                    costs, args.max_n)
        parts.append(projection_markdown(p, args.max_n))
        results.append(projection_json(p))
        if args.plot_dir:
            path = Path(args.plot_dir) / f"scaling_{model.name}.png"
            plot_projection(p, path)
            parts.append(f"Plot: `{path}`\n")
    _write(args.out, "\n".join(parts))
    if args.json:
        _write(args.json, json.dumps({"kind": "gravac.scaling.projection",
                                      "alpha_s": alpha, "local": [local.alpha_s,
                                                                  local.beta_s_per_byte],
                                      "models": results}, indent=1) + "\n")
    return 0


def cmd_measure_collectives(args, rest) -> int:
    from collectives import main as collectives_main

    return collectives_main(rest)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("measure-compression", help="time gravac's local work on this machine")
    p.add_argument("--out", type=Path, default=None, help="JSON file (default: stdout)")
    p.add_argument("--sizes", type=_positive(int), nargs="+",
                   default=[1 << 12, 1 << 16, 1 << 18, 1 << 20, 1 << 22])
    p.add_argument("--cfs", type=_positive(float), nargs="+", default=[10, 100, 1000])
    p.add_argument("--chunks", type=_positive(int), nargs="+", default=[1, 8, 32],
                   help="ranks' chunks in the unpacked buffer")
    p.add_argument("--repeats", type=_positive(int), default=5)
    p.add_argument("--threads", type=_positive(int), default=1,
                   help="torch threads (1: as each of 2 ranks on 2 cores)")
    p.add_argument("--compressor", default="topk", choices=("topk", "dgc", "redsync", "randomk"))
    p.add_argument("--lowrank-shapes", type=_matrix, nargs="+",
                   default=[(64, 64), (256, 256), (512, 1024), (1024, 2048)],
                   help="PowerSGD matrices ROWSxCOLS")
    p.add_argument("--lowrank-ranks", type=_positive(int), nargs="+", default=[1, 2, 4])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--procs", type=_positive(int), default=1,
                   help="processes measuring at once, each sample started together: the "
                        "costs under the contention of that many ranks on this machine "
                        "(validate then scales them by no factor at that many ranks)")

    sub.add_parser("measure-collectives", add_help=False,
                   help="(under a launcher) time gravac's collectives: benchmarks/collectives.py")

    p = sub.add_parser("calibrate", help="fit α, β of the links from measure-collectives JSON")
    p.add_argument("inputs", type=Path, nargs="+")
    p.add_argument("--out", type=Path, default=None)

    p = sub.add_parser("validate", help="predicted vs measured step times of runs")
    p.add_argument("runs", nargs="+", help="train.py run directories (one layout)")
    p.add_argument("--calibration", type=Path, required=True)
    p.add_argument("--compression", type=Path, default=None,
                   help="measure-compression JSON (default: no local cost)")
    p.add_argument("--hosts", type=_positive(int), default=None)
    p.add_argument("--slots", type=_positive(int), default=None)
    p.add_argument("--compute", default=None,
                   help="compute per step: SECONDS at --compute-ranks ranks, or a reference "
                        "run directory (its t_compute + t_update); default: each run's own")
    p.add_argument("--compute-ranks", type=_positive(int), default=None)
    p.add_argument("--compute-calibration", type=Path, default=None,
                   help="the calibration of the --compute reference's layout (its lockstep "
                        "fits turn the reference's compute into compute alone)")
    p.add_argument("--assume-contention", action="store_true",
                   help="ignore the calibration's lockstep fits; stretch CPU work by "
                        "max(1, ranks / cores)")
    p.add_argument("--plain-calibration", type=Path, default=None,
                   help="links of the same layout measured with Horovod's own spinning wait "
                        "(collectives.py --horovod-wait spin): the collectives of plain "
                        "Horovod runs (dense, fp16: hvd.DistributedOptimizer) are priced "
                        "by them")
    p.add_argument("--cores", type=_positive(int), default=os.cpu_count() or 1,
                   help="cores the sandbox's ranks share (default: this machine's)")
    p.add_argument("--warmup", type=int, default=10, help="steps left out at the start")
    p.add_argument("--tolerance", type=_positive(float), default=0.25)
    p.add_argument("--out", type=Path, default=None)

    p = sub.add_parser("project", help="step times for N = 8..1024 at 1, 10, 100 Gbit/s")
    p.add_argument("--models", nargs="*", default=list(PAPER_MODELS),
                   help=f"{', '.join(PAPER_MODELS)} or train.py config files")
    p.add_argument("--shapes", nargs="*", type=Path, default=None,
                   help="ModelShapes JSON files (name, min_compress_numel, params)")
    p.add_argument("--compute-ms", nargs="*", default=None, metavar="MODEL=MS",
                   help="compute time per step (default: FLOPs / --device-tflops)")
    p.add_argument("--device-tflops", type=_positive(float), default=DEFAULT_DEVICE_TFLOPS)
    p.add_argument("--n", type=_positive(int), nargs="+", default=None)
    p.add_argument("--slots", type=_positive(int), default=8)
    p.add_argument("--links", type=parse_rate_gbit, nargs="+", default=[1.0, 10.0, 100.0])
    p.add_argument("--alpha-us", type=_positive(float), default=DEFAULT_ALPHA_US)
    p.add_argument("--local-gbit", type=parse_rate_gbit, default=DEFAULT_LOCAL_GBIT)
    p.add_argument("--local-alpha-us", type=_positive(float), default=DEFAULT_LOCAL_ALPHA_US)
    p.add_argument("--calibration", type=Path, default=None,
                   help="take α of the inter-host link from this calibration")
    p.add_argument("--compression", type=Path, default=None)
    p.add_argument("--compression-speedup", type=_positive(float), default=1.0,
                   help="divide the measured local costs by this (a faster device)")
    p.add_argument("--cfs", type=_positive(float), nargs="+", default=[10, 100, 1000])
    p.add_argument("--ranks", type=_positive(int), nargs="+", default=[1, 4])
    p.add_argument("--exchanges", nargs="+", choices=[e for e in EXCHANGES if e != "dense"],
                   default=["fp16", "allgather", "hierarchical", "shared_index", "powersgd"])
    p.add_argument("--max-n", type=_positive(int), default=8192,
                   help="crossovers are searched up to this N")
    p.add_argument("--out", type=Path, default=None, help="markdown (default: stdout)")
    p.add_argument("--json", type=Path, default=None, help="every number, as JSON")
    p.add_argument("--plot-dir", default=str(REPO / "docs/img"),
                   help="where scaling_<model>.png goes ('' for no plot)")
    return parser


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "measure-collectives":
        return cmd_measure_collectives(None, argv[1:])
    args = build_parser().parse_args(argv)
    handler = {"measure-compression": cmd_measure_compression, "calibrate": cmd_calibrate,
               "validate": cmd_validate, "project": cmd_project}[args.command]
    try:
        return handler(args)
    except CliError as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
