"""The step record: one definition of what a step reports, used everywhere.

``StepStats`` is what the engine says about one optimizer step (what was sent, at which
CF, the agreed gains, traffic, timings); the optimizer exposes it as ``last_stats``. The
trainer writes one ``metrics.jsonl`` line per logged step: the ``STEP_FIELDS`` of the
run-record schema (gravac/engine/run_record.py, which defines every kind of metrics line),
``LOGGED_STATS`` of them from here plus the loop's own measures.

Example::

    stats = optimizer.last_stats            # a StepStats
    stats.sent in SENT_VALUES                # "candidate", "min", "dense" or "skipped"
    row = stats.as_dict()                    # for JSON
    line = step_record(stats, step=1, epoch=0, time=0.4, loss=2.3, lr=0.1, world_size=2,
                       cum_floats_sent=10, cum_dense_floats=100, t_iter=0.4,
                       samples_per_sec=160.0)
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..controllers.base import SENT_DENSE
# The schema's names that importers of this module use (gravac.engine re-exports them).
from .run_record import (LOOP_MEASURED, METRICS_FILE, SENT_SKIPPED, SENT_VALUES, STEP,  # noqa: F401
                         STEP_FIELDS, new_record)


@dataclass
class StepStats:
    """One optimizer step, as the engine saw it (the same on every rank except timings).

    sent: what travelled (``SENT_VALUES``); cf: the CF of what was sent (1 = dense), the
    rung (nominal); cf_actual: compressible elements / values this rank sent (DGC and
    RedSync keep about, not exactly, n/θ values; 1 = dense);
    theta_min / theta_c: the plan's CFs; gain_min / gain_c: this step's agreed gains;
    delta_min / delta_c: the controller's smoothed gains after this step (GraVAC);
    lag: the residual's agreed Σ⟨r, g⟩ / Σ‖g‖² (``StepPlan.measure_lag``: Auto's
    ``low_rank_lag``), None when not measured;
    values_sent: sparse values this rank sent; floats_sent: values and indices (one float
    each, as the paper counts) plus dense elements; dense_floats: what dense would send;
    bytes_sent: this rank's bytes on the wire; t_*: seconds (None when not measured);
    t_compress: local work (the sum of the ``LOCAL_PHASES``); t_comm: time spent waiting in
    collectives (the NaN/Inf flag, the gains, the exchange: the ``WAIT_PHASES``);
    t_discarded: the time spent on compression that was then not sent (the
    ``DISCARDED_PHASES`` of a step that went dense: gravac/engine/phases.py), which the
    controller's t_iter leaves out.
    """

    step: int
    sent: str
    cf: float = 1.0
    cf_actual: float = 1.0
    theta_min: float | None = None
    theta_c: float | None = None
    gain_min: float | None = None
    gain_c: float | None = None
    delta_min: float | None = None
    delta_c: float | None = None
    lag: float | None = None
    sparse_layers: int = 0
    dense_layers: int = 0
    values_sent: int = 0
    floats_sent: int = 0
    dense_floats: int = 0
    bytes_sent: int = 0
    t_compute: float | None = None
    t_compress: float | None = None
    t_comm: float | None = None
    t_update: float | None = None
    t_iter: float | None = None
    t_discarded: float = 0.0
    # The phases of t_compress (local work) and t_comm (waits): gravac/engine/phases.py.
    t_control: float | None = None
    t_check: float | None = None
    t_feedback: float | None = None
    t_select: float | None = None
    t_norms: float | None = None
    t_residual: float | None = None
    t_pack: float | None = None
    t_unpack: float | None = None
    t_wait_check: float | None = None
    t_wait_select: float | None = None
    t_wait_gains: float | None = None
    t_wait_exchange: float | None = None
    nonfinite_ranks: list[int] = field(default_factory=list)
    layer_cf: dict[str, float] | None = None
    #: The method the step ran (``StepPlan.method_name`` or ``Method.key``: controller
    #: Auto), None: the configured one.
    method: str | None = None

    def __post_init__(self):
        if self.sent not in SENT_VALUES:
            raise ValueError(f"sent must be one of {', '.join(SENT_VALUES)}, got {self.sent!r}")

    @property
    def skipped(self) -> bool:
        return self.sent == SENT_SKIPPED

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def dense(cls, step: int, numel: int, bytes_sent: int = 0) -> "StepStats":
        """A plain dense allreduce step (a baseline optimizer without gravac's record) of
        ``numel`` values, ``bytes_sent`` on the wire."""
        return cls(step=step, sent=SENT_DENSE, cf=1.0, floats_sent=numel, dense_floats=numel,
                   bytes_sent=bytes_sent)


#: The StepStats fields a metrics "step" line carries (the other step fields are the
#: loop's own measures, ``LOOP_MEASURED``).
LOGGED_STATS = tuple(f.name for f in dataclasses.fields(StepStats)
                     if f.name in STEP_FIELDS and f.name not in LOOP_MEASURED)


def step_record(stats: StepStats, **measured) -> dict:
    """The metrics "step" line of ``stats``: the loop's ``measured`` values (exactly the
    ``LOOP_MEASURED`` fields, in the order given) followed by ``LOGGED_STATS``."""
    if set(measured) != set(LOOP_MEASURED):
        raise ValueError(f"step_record needs the loop's measures {', '.join(LOOP_MEASURED)}; "
                         f"got {', '.join(measured)}")
    return new_record(STEP, **measured, **{name: getattr(stats, name) for name in LOGGED_STATS})
