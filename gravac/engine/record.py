"""The step record: one definition of what a step reports, used everywhere.

``StepStats`` is what the engine says about one optimizer step (what was sent, at which
CF, the agreed gains, traffic, timings); the optimizer exposes it as ``last_stats``. The
trainer writes one ``metrics.jsonl`` line per logged step: the ``STEP_FIELDS`` below,
which are ``StepStats``' logged fields plus the loop's own. The monitor, the report and
the sweep read those names from here, never from a list of their own.

Example::

    stats = optimizer.last_stats            # a StepStats
    stats.sent in SENT_VALUES                # "candidate", "min", "dense" or "skipped"
    row = stats.as_dict()                    # for JSON
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..controllers.base import SENT_CANDIDATE, SENT_DENSE, SENT_MIN
from .phases import PHASES

#: The step was skipped on every rank (a NaN/Inf gradient somewhere): nothing was sent.
SENT_SKIPPED = "skipped"
SENT_VALUES = (SENT_CANDIDATE, SENT_MIN, SENT_DENSE, SENT_SKIPPED)

#: The metrics file of a run directory (one JSON object per line).
METRICS_FILE = "metrics.jsonl"


@dataclass
class StepStats:
    """One optimizer step, as the engine saw it (the same on every rank except timings).

    sent: what travelled (``SENT_VALUES``); cf: the CF of what was sent (1 = dense), the
    rung (nominal); cf_actual: compressible elements / values this rank sent (DGC and
    RedSync keep about, not exactly, n/θ values; 1 = dense);
    theta_min / theta_c: the plan's CFs; gain_min / gain_c: this step's agreed gains;
    delta_min / delta_c: the controller's smoothed gains after this step (GraVAC);
    values_sent: sparse values this rank sent; floats_sent: values and indices (one float
    each, as the paper counts) plus dense elements; dense_floats: what dense would send;
    bytes_sent: this rank's bytes on the wire; t_*: seconds (None when not measured);
    t_compress: local work (the sum of the ``LOCAL_PHASES``); t_comm: time spent waiting in
    collectives (the NaN/Inf flag, the gains, the exchange: the ``WAIT_PHASES``);
    t_discarded: the time spent on compression that was then not sent (selection, norms
    and the gains allreduce of a step that went dense), which the controller's t_iter
    leaves out.
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
    t_wait_gains: float | None = None
    t_wait_exchange: float | None = None
    nonfinite_ranks: list[int] = field(default_factory=list)
    layer_cf: dict[str, float] | None = None

    def __post_init__(self):
        if self.sent not in SENT_VALUES:
            raise ValueError(f"sent must be one of {', '.join(SENT_VALUES)}, got {self.sent!r}")

    @property
    def skipped(self) -> bool:
        return self.sent == SENT_SKIPPED

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def dense(cls, step: int, numel: int) -> "StepStats":
        """A plain dense allreduce step (a baseline optimizer without gravac's record)."""
        return cls(step=step, sent=SENT_DENSE, cf=1.0, floats_sent=numel, dense_floats=numel)


#: Every field of a metrics "step" line, in order, with its TensorBoard tag (None: not
#: plotted). The loop measures step, epoch, time, loss, lr, t_iter, samples/s and the
#: cumulative traffic itself; every other field is the StepStats field of the same name.
STEP_COLUMNS = (
    ("step", None), ("epoch", None), ("time", None), ("world_size", None),
    ("loss", "train/loss"), ("lr", "train/lr"), ("samples_per_sec", "train/samples_per_sec"),
    ("sent", None), ("cf", "compression/cf_sent"), ("cf_actual", "compression/cf_actual"),
    ("theta_min", "compression/theta_min"),
    ("theta_c", "compression/theta_c"), ("gain_min", "compression/gain_min"),
    ("gain_c", "compression/gain_c"), ("delta_min", "compression/delta_min"),
    ("delta_c", "compression/delta_c"),
    ("floats_sent", "traffic/floats_sent"), ("cum_floats_sent", "traffic/cum_floats_sent"),
    ("dense_floats", "traffic/dense_floats"), ("bytes_sent", "traffic/bytes_sent"),
    ("cum_dense_floats", "traffic/cum_dense_floats"),
    ("t_compute", "time/compute"), ("t_compress", "time/compress"),
    ("t_comm", "time/communicate"), ("t_update", "time/update"), ("t_iter", "time/step"),
    *((name, f"time/phase/{name[2:]}") for name in PHASES),
)
STEP_FIELDS = tuple(name for name, _ in STEP_COLUMNS)
#: TensorBoard tag -> step field.
TENSORBOARD_TAGS = {tag: name for name, tag in STEP_COLUMNS if tag is not None}
_LOOP_OWN = ("step", "t_iter")
#: The StepStats fields a metrics "step" line carries.
LOGGED_STATS = tuple(f.name for f in dataclasses.fields(StepStats)
                     if f.name in STEP_FIELDS and f.name not in _LOOP_OWN)
#: The numeric fields of a "step" line (what the report loads as arrays).
NUMERIC_STEP_FIELDS = tuple(f for f in STEP_FIELDS if f not in ("step", "sent", "world_size"))
