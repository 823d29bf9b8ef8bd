"""What one step sends: the rounds of collectives the engine issues for each exchange, and
their time on a network (docs/SCALING.md §1.3).

A ``StepCase`` is one step as the engine runs it (the exchange, the CFs, what was sent);
``step_rounds`` lists its collectives round by round, each sized by the engine's own
arithmetic (``ModelShapes``, ``gravac/util/sizes.py``); ``comm_time`` prices them;
``recorded_bytes`` is what the step record's ``bytes_sent`` says.

Example::

    model = ModelShapes.from_params([("w", (1000, 1000)), ("b", (1000,))])
    net = Network(inter=Link.from_gbit(10, 25e-6), local=Link.from_gbit(200, 5e-6))
    comm_time(StepCase("allgather_coded", theta=100), model, Layout(4, 8), net)   # seconds
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from gravac.engine.options import EXCHANGE_KINDS

from .network import Layout, Network
from .shapes import LowRank, ModelShapes

#: What the model prices: Horovod's own dense step (fp32 or fp16 on the wire), every
#: exchange a gravac config may name (the engine's list), and PowerSGD's allreduces.
EXCHANGES = ("dense", "fp16", *EXCHANGE_KINDS, "powersgd")
#: The exchanges whose sparse chunks travel by one world allgather.
ALLGATHERS = ("allgather", "allgather_coded")


@dataclass(frozen=True)
class StepCase:
    """One step as the engine runs it.

    exchange      dense / fp16 (Horovod's allreduce, no gravac step), allgather,
                  allgather_coded, hierarchical, shared_index, powersgd (``EXCHANGES``)
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


def index_buffer_bytes(model: ModelShapes, theta_min: float, theta_c: float | None) -> int:
    """shared_index's byte buffer: per layer a count per level (int32), then a field per
    level for Top-k's exact k (a candidate's too when one is planned), each sized as the
    engine sizes it (``sizes.index_field_bytes``: ~1.1 bytes an index at CF 10, ~2 at
    CF 1000, against int32's 4)."""
    levels = [theta_min] + ([theta_c] if theta_c else [])
    return 8 * model.layers_comp + sum(model.index_fields_bytes(theta) for theta in levels)


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
    previous one); see gravac/engine/step.py and gravac/engine/exchanges/."""
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
    if ex in ALLGATHERS or (ex == "shared_index" and not case.selects):
        # (shared_index planned dense has no index set to share: a dense allreduce)
        if case.sent == "dense":
            last = [all_dense]
        else:
            chunk = model.chunk_bytes(case.theta, coded=ex == "allgather_coded")
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
            leaders = [Collective("allgather", "leaders", model.chunk_bytes(case.theta),
                                  "sparse"),
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
        rounds.append([Collective("allreduce", "world", 4 * model.kept_total(case.theta),
                                  "values"), dense_small] + flags)
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
    dense = case.dense_wire * model.n_dense
    if ex == "shared_index":
        index = 0 if case.shared_selection else index_buffer_bytes(model, case.level_min,
                                                                   case.theta_c)
        return dense + 4 * model.kept_total(case.theta) + index
    return model.chunk_bytes(case.theta, coded=ex == "allgather_coded") + dense
