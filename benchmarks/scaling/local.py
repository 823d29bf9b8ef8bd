"""Local work: what a step's compression costs on the rank the step waits for
(docs/SCALING.md §1.4, §1.5).

``CompressionCosts`` holds the per-element costs ``measure-compression`` fits on this
machine; ``local_time`` prices a ``StepCase`` with them; ``CpuSharing`` and ``contention``
say how much slower that work runs when a layout's ranks share the machine's cores.

Example::

    costs = CompressionCosts(pipeline=(1e-5, 1e-9, 2e-8, 3e-9, 1e-6), select=(1e-6, 1e-9, 1e-8))
    local_time(StepCase("allgather", theta=100), model, Layout(4, 8), costs)     # seconds
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .network import Layout
from .rounds import StepCase, _lowrank_of
from .shapes import ModelShapes


@dataclass(frozen=True)
class CompressionCosts:
    """Per-element costs of the local work, seconds (``measure-compression`` fits them).

    pipeline   (c0, a, b, u, v): one compressed layer of n elements at k kept costs
               c0 + a·n + b·k (error feedback, selection, gathering, residual update,
               packing); unpacking a step's gathered buffer of C chunks of K values costs
               u·C·K + v·C
    pipeline_coded  the same with the indices in coded fields (``allgather_coded``:
               encoding and decoding them too); None where not measured (files written
               before it): priced as ``pipeline``
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
    pipeline_coded: tuple | None = None
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
        return cls(pipeline=tuple(f["pipeline"]["coef"]),
                   pipeline_coded=tuple(f["pipeline_coded"]["coef"])
                   if "pipeline_coded" in f else None,
                   select=tuple(f["select"]["coef"]),
                   norm=f["norm"]["coef"][1], copy=f["copy"]["coef"][1],
                   cast=f["cast"]["coef"][1], powersgd=tuple(ps),
                   check=tuple(f["check"]["coef"]) if "check" in f else (0.0, 0.0),
                   ranks=data.get("ranks", 1), cores=data.get("cores") or 1)

    def scaled(self, factor: float) -> "CompressionCosts":
        """Every cost times ``factor`` (CPU contention, or a faster device: < 1)."""
        s = lambda t: tuple(x * factor for x in t)   # noqa: E731
        return replace(self, pipeline=s(self.pipeline),
                       pipeline_coded=None if self.pipeline_coded is None
                       else s(self.pipeline_coded), select=s(self.select),
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
    coded = ex == "allgather_coded" and costs.pipeline_coded is not None
    c0, a, b, u, v = costs.pipeline_coded if coded else costs.pipeline
    k_min = model.kept_total(case.level_min)
    t = c0 * model.layers_comp + a * model.n_comp + b * k_min + \
        _selections(case, model, costs)[1]
    if case.gains:
        t += costs.norm * model.n_comp
    if case.sent == "sparse":
        chunks = {"allgather": layout.n, "allgather_coded": layout.n,
                  "hierarchical": layout.hosts}.get(ex, 1)
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
    (gravac/engine/exchanges/shared_index.py), so the most-loaded rank selects about the
    larger of an even share and the largest layer (a lower bound of its load, which it
    reaches when the layers pack evenly, as the LSTM's two big layers do on 2 or 4 ranks).

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
