"""The controller contract: which CF(s) a step uses and what it sends.

A controller makes two kinds of decisions, and both must be identical on every rank:

* per step, ``plan(step)`` gives the CFs to compress at (θmin, an optional candidate θc,
  optional per-layer CFs), and ``decide(gain_min, gain_c)`` picks what is sent from gains
  that the optimizer has already agreed across ranks (one small allreduce);
* per window, ``end_step(record, sync)`` may move the CFs. Such decisions are taken on
  rank 0 and shared through ``sync.broadcast_object``, never decided by each rank alone.

A controller holds no tensors and does no communication except through ``sync``. Its
whole state is a small picklable dict (``state_dict``/``load_state_dict``).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence

import torch

from .methods import Method

SENT_CANDIDATE, SENT_MIN, SENT_DENSE = "candidate", "min", "dense"
#: Decision records a controller keeps (``decisions``), in memory and in its state dict.
#: They are a log that no decision reads; the trainer writes each to metrics.jsonl as it
#: appears (``decisions_made`` says which are new). Kept whole, they grew every checkpoint
#: and elastic commit by ~3 KB per 1k steps (GraVAC, window 50; Auto ~2 KB), and
#: Accordion's per-layer records were broadcast whole at every interval.
DECISIONS_KEPT = 1000
#: How a compression level's gain is measured (docs/ALGORITHM.md §7, "gain measure").
GAIN_MEASURES = ("energy", "norm")


class Sync(Protocol):
    """What a controller may use to agree with other ranks."""

    rank: int
    size: int

    def broadcast_object(self, obj: Any, name: str) -> Any:
        """Rank 0's ``obj`` on every rank."""


class LocalSync:
    """A single-process Sync, for unit tests and non-distributed use."""

    rank = 0
    size = 1

    def broadcast_object(self, obj: Any, name: str) -> Any:
        return obj


@dataclass(frozen=True)
class StepPlan:
    """The CFs one step compresses at.

    theta_min: first-level CF of every compressed layer (1 = dense).
    theta_c: candidate CF evaluated by multi-level compression, or None.
    layer_cf: per-layer first-level CFs overriding theta_min (Accordion), or None.
    layer_rank: per-layer PowerSGD ranks used instead of the CFs (Static or Accordion
        configured in ranks; only a low-rank compressor accepts them), or None.
    needs_gains: the optimizer must compute and agree on gains for ``decide``.
    decided: what the step sends (SENT_CANDIDATE, SENT_MIN or SENT_DENSE) when the
        controller knows it before the step (GraVAC ``decide="previous"``); the gains are
        then still agreed and given to ``decide`` (whose answer is not used), and the
        optimizer may send layers during backward. None: ``decide`` chooses after the gains.
    method: the method the step runs (``methods.Method``: dense, fp16, a PowerSGD rank, a
        sparse CF), chosen by ``Auto``; None: the optimizer's own compressor and exchange.
    gain_measure: how gains are measured (``GAIN_MEASURES``): ``"energy"``,
        Σ‖g_c‖² / Σ‖g_ef‖² (the paper's Algorithm 1), or ``"norm"``, Σ‖g_c‖ / Σ‖g‖ over
        layers with the raw gradient g (no residual) below (the authors' public code).
    layer_gains: the gains are agreed per layer as well (the same allreduce, a row per
        compressed layer) and handed to ``Controller.observe_layer_gains`` before
        ``decide`` (Auto's ``split_layers``). Needs an exchange in which every rank
        selects every compressed layer (not ``hierarchical``).
    method_name: the name step records give the method (None: ``method.key``): Auto's
        split methods, ``<cf>/split``.
    measure_lag: the residual's lag is measured as well, Σ⟨r, g⟩ / Σ‖g‖² over the
        compressed layers and the ranks (r: the residual error feedback adds to this
        step's raw gradient g; the same allreduce as the gains) and handed to
        ``Controller.observe_lag`` before ``decide`` (Auto's ``low_rank_lag``; the step
        record's ``lag``). Needs ``needs_gains``.
    """

    theta_min: float
    theta_c: float | None = None
    layer_cf: Mapping[str, float] | None = None
    layer_rank: Mapping[str, int] | None = None
    needs_gains: bool = False
    gain_measure: str = "energy"
    decided: str | None = None
    method: Method | None = None
    layer_gains: bool = False
    method_name: str | None = None
    measure_lag: bool = False

    def cf_of(self, name: str) -> float:
        if self.layer_cf is not None and name in self.layer_cf:
            return self.layer_cf[name]
        return self.theta_min


@dataclass
class StepRecord:
    """What the optimizer reports about a finished step (the same on every rank,
    except timings, which only rank 0's matter). ``extra``: the engine's step timings a
    controller may read (``t_comm``: the waits; ``t_pack``: packing and unpacking the wire
    buffers, e.g. fp16's casts)."""

    step: int
    sent: str
    cf: float
    gain: float
    t_iter: float | None
    samples: float | None = None
    extra: dict = field(default_factory=dict)


class Controller(ABC):
    """Base class of CF controllers."""

    #: the optimizer calls ``observe_gradients`` with each compressed layer's local gradient
    #: (may differ per rank: Accordion wants them on rank 0 only)
    wants_gradients = False
    #: whether ``wants_gradients`` may be true on any rank; the same on every rank, since
    #: the engine then issues a NaN/Inf agreement of its own before the observation
    observes_gradients = False
    #: plans carry PowerSGD ranks (``StepPlan.layer_rank``): needs a low-rank compressor
    uses_ranks = False
    #: the methods its plans may name (``StepPlan.method``; Auto): the engine prepares the
    #: compressor and exchange of each
    methods: Sequence[Method] = ()

    def bind(self, layer_names: list[str], sync: Sync) -> None:
        """Called once by the optimizer with the compressed layers' names and its Sync."""

    def observe_layers(self, shapes: Mapping[str, tuple], other_numel: int,
                       exchange: str) -> None:
        """Called once by the engine: the compressed layers' shapes, the elements of the
        layers sent dense, and the configured sparse exchange (Auto predicts bytes)."""

    def rebind(self, layer_names: list[str], sync: Sync) -> None:
        """Bind to a new Sync after the ranks changed (an elastic reset), keeping what was
        learned: the state survives, only what depends on the ranks is recomputed."""
        state = self.state_dict()
        self.bind(layer_names, sync)
        self.load_state_dict(state)

    @abstractmethod
    def plan(self, step: int) -> StepPlan:
        """The CFs of step ``step``."""

    def decide(self, gain_min: float | None, gain_c: float | None) -> str:
        """What to send this step: SENT_CANDIDATE, SENT_MIN or SENT_DENSE."""
        return SENT_MIN

    def observe_gradients(self, grads: Mapping[str, torch.Tensor]) -> None:
        """Local gradients of the compressed layers (only when ``wants_gradients``)."""

    def observe_layer_gains(self, rows: Mapping[str, tuple[float, float, float]]) -> None:
        """Per compressed layer, summed over ranks: (kept energy at θmin, at θc (θmin's
        without a candidate), g_ef's energy; norms under ``gain_measure="norm"``), of a
        step whose plan set ``layer_gains`` and that no NaN/Inf skipped; called before
        ``decide``."""

    def observe_lag(self, lag: float) -> None:
        """The residual's agreed lag, Σ⟨r, g⟩ / Σ‖g‖² (``StepPlan.measure_lag``), of a step
        whose plan set ``measure_lag`` and that no NaN/Inf skipped; called before
        ``decide``."""

    def on_lr_decay(self) -> None:
        """The learning rate of some param group went down this step."""

    def end_step(self, record: StepRecord, sync: Sync) -> None:
        """Called after every step on every rank, in the same order."""

    def on_epoch_end(self) -> None:
        """The training loop finished an epoch (the same step on every rank)."""

    def summary(self) -> dict:
        """A few numbers worth logging every step (e.g. GraVAC's smoothed gains
        ``delta_min``/``delta_c``); the step record and the trainer read them here."""
        return {}

    @property
    def decisions(self) -> list[dict]:
        """The latest ``DECISIONS_KEPT`` window decisions (for logging); empty for
        controllers without windows."""
        return []

    @property
    def decisions_made(self) -> int:
        """How many decision records were made in all (``decisions`` holds the latest)."""
        return len(self.decisions)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def describe(self) -> dict:
        """The user-facing hyperparameters (for logs and configuration checks)."""
        return {"controller": type(self).__name__}


def keep_decision(state: dict, record: dict) -> None:
    """Append ``record`` to ``state["decisions"]``, dropping the oldest beyond
    ``DECISIONS_KEPT``; ``state["decisions_dropped"]`` counts those dropped."""
    decisions = state["decisions"]
    decisions.append(record)
    extra = len(decisions) - DECISIONS_KEPT
    if extra > 0:
        del decisions[:extra]
        state["decisions_dropped"] = state.get("decisions_dropped", 0) + extra


def decision_count(state: dict) -> int:
    """The decision records made in all by a controller whose state is ``state`` (states
    saved before records were dropped have no count: none was)."""
    return state.get("decisions_dropped", 0) + len(state["decisions"])
