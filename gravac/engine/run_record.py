"""The run record: what a training run writes into its run directory, defined once.

A run directory holds ``METRICS_FILE`` (``metrics.jsonl``): one JSON object per line,
each with a ``kind`` (``KINDS``):

* ``run_start``      what runs (controller, compressor, model, ...); again on a resume
* ``step``           one logged optimizer step: ``STEP_COLUMNS``, the engine's
                     ``StepStats`` (gravac/engine/record.py) plus the loop's own measures
* ``eval``           an evaluation (loss, top1/top5 or perplexity, a task's own metrics)
* ``window``         a GraVAC window decision (θmin, θc, δmin, δc, the throughput table)
* ``method``         an ``Auto`` event: a method measured, pruned or chosen
* ``nonfinite``      a step skipped on every rank for a NaN/Inf gradient
* ``elastic_reset``  Horovod Elastic changed the ranks (instead of a second run_start)
* ``run_end``        the run finished (its final evaluation)

and, with ``run.rank_phases``, ``RANKS_DIR/rank{r}.jsonl``: every rank's own step timings
(``RANK_STEP_FIELDS``, no ``kind``).

The trainer (gravac/train/) builds every line with ``new_record``, which refuses a field
that is not declared here; the report, the sweep and the benchmarks read run directories
through one reader, ``gravac.report.load`` (``load_run``, ``load_rank_steps``), which
checks each declared field by its type. No other module lists record fields.

Example::

    rec = new_record(EVAL, step=100, time=12.5, loss=0.41, top1=0.91)
    KINDS[EVAL].fields["top1"]        # NUMBER: a float or null
    unknown_fields(rec)               # [] (every field is declared)
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from ..controllers.base import SENT_CANDIDATE, SENT_DENSE, SENT_MIN
from .phases import LOCAL_PHASES, PHASES, WAIT_PHASES

#: The metrics file of a run directory (one JSON object per line).
METRICS_FILE = "metrics.jsonl"
#: The folder of a run directory with every rank's own step timings (``run.rank_phases``).
RANKS_DIR = "ranks"

#: The step was skipped on every rank (a NaN/Inf gradient somewhere): nothing was sent.
SENT_SKIPPED = "skipped"
#: What a step sent (a step line's ``sent``, ``StepStats.sent``).
SENT_VALUES = (SENT_CANDIDATE, SENT_MIN, SENT_DENSE, SENT_SKIPPED)

# Field types: what the reader accepts and what it returns. Every field may be null
# (None) or absent, except a STEP_INDEX.
STEP_INDEX = "step_index"   # steps done, an integer, required (the record's position)
INT = "int"                 # an integer
NUMBER = "number"           # a number, read as float
TEXT = "text"               # a string
FLAG = "flag"               # true or false
SENT = "sent"               # one of SENT_VALUES
CF_TABLE = "cf_table"       # {CF: number}, written with string keys, read with float keys
ANY = "any"                 # kept as written (a list, an object)
TYPES = (STEP_INDEX, INT, NUMBER, TEXT, FLAG, SENT, CF_TABLE, ANY)


@dataclass(frozen=True)
class RecordKind:
    """One kind of metrics line: its fields (name -> type, in the order written) and,
    with ``more``, the type of any further field (eval lines: a task's own metrics)."""

    name: str
    fields: Mapping[str, str]
    more: str | None = None


def _kind(name: str, fields: dict[str, str], more: str | None = None) -> RecordKind:
    return RecordKind(name, MappingProxyType(fields), more)


RUN_START, STEP, EVAL, WINDOW, METHOD = "run_start", "step", "eval", "window", "method"
NONFINITE, ELASTIC_RESET, RUN_END = "nonfinite", "elastic_reset", "run_end"

#: Every field of a "step" line, in order, with its TensorBoard tag (None: not plotted).
#: The loop measures ``LOOP_MEASURED`` itself; every other field is the StepStats field
#: of the same name (gravac/engine/record.py: ``LOGGED_STATS``).
STEP_COLUMNS = (
    ("step", None), ("epoch", None), ("time", None), ("world_size", None),
    ("loss", "train/loss"), ("lr", "train/lr"), ("samples_per_sec", "train/samples_per_sec"),
    ("sent", None), ("method", None), ("cf", "compression/cf_sent"),
    ("cf_actual", "compression/cf_actual"), ("theta_min", "compression/theta_min"),
    ("theta_c", "compression/theta_c"), ("gain_min", "compression/gain_min"),
    ("gain_c", "compression/gain_c"), ("delta_min", "compression/delta_min"),
    ("delta_c", "compression/delta_c"), ("lag", "compression/lag"),
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
#: The step fields the training loop measures itself (the rest come from StepStats).
LOOP_MEASURED = ("step", "epoch", "time", "loss", "lr", "world_size", "cum_floats_sent",
                 "cum_dense_floats", "t_iter", "samples_per_sec")
_STEP_TYPES = {"step": STEP_INDEX, "epoch": INT, "world_size": INT, "sent": SENT,
               "method": TEXT}
#: A step's timings in the order tables show them: compute, the local phases and their
#: sum, the waits and their sum, the update, the whole step.
STEP_TIME_FIELDS = ("t_compute", *LOCAL_PHASES, "t_compress", *WAIT_PHASES, "t_comm",
                    "t_update", "t_iter")

KINDS: Mapping[str, RecordKind] = MappingProxyType({k.name: k for k in (
    _kind(RUN_START, dict(name=TEXT, time=NUMBER, step=INT, world_size=INT, controller=TEXT,
                          compressor=TEXT, model=TEXT, dataset=TEXT, batch_size=INT,
                          metric=TEXT, total_steps=INT, resumed=FLAG, elastic=FLAG,
                          backend=TEXT, device=TEXT, gravac=TEXT)),
    _kind(STEP, {name: _STEP_TYPES.get(name, NUMBER) for name in STEP_FIELDS}),
    # loss and top1/top5 (image tasks) or perplexity (language); a task may add numbers.
    _kind(EVAL, dict(step=STEP_INDEX, time=NUMBER, loss=NUMBER, top1=NUMBER, top5=NUMBER,
                     perplexity=NUMBER), more=NUMBER),
    # GraVAC's decision (gravac/controllers/gravac.py ``evaluate``); "step" counts steps
    # done, "window" numbers windows from 1, "table" is T_compress per CF.
    _kind(WINDOW, dict(time=NUMBER, step=STEP_INDEX, theta_min=NUMBER, theta_c=NUMBER,
                       delta_min=NUMBER, delta_c=NUMBER, settled=FLAG, on_dense=FLAG,
                       reprobe=FLAG, scaled_up=FLAG, advanced=FLAG, window=INT,
                       table=CF_TABLE)),
    # Auto's events (gravac/controllers/auto.py ``decisions``): "measured" (a trial's or
    # a run's table entry: median step time t, its waits t_comm, the mean gain and the
    # next CF's gain_next over steps; lag and lag_se: a PowerSGD method's pooled lag and
    # its standard error under low_rank_lag, lag_recent and lag_recent_se the same over
    # its latest pooled steps; filled: a run's entry under low_rank_lag, whose residual
    # had filled when it was chosen; probe: measured by a one-step probe), "abandoned"
    # (a trial ended early: its gain so far far below ε; the reason and its steps),
    # "pruned" (with the reason), "split" (a split method proposed: the dense_layers it
    # sends dense, the gain predicted over the others), "chosen" (score = gain / t, and
    # every measured method's score). Several may share a step.
    _kind(METHOD, dict(time=NUMBER, step=STEP_INDEX, event=TEXT, method=TEXT, reason=TEXT,
                       t=NUMBER, t_comm=NUMBER, t_pack=NUMBER, gain=NUMBER,
                       gain_next=NUMBER, lag=NUMBER, lag_se=NUMBER, lag_recent=NUMBER,
                       lag_recent_se=NUMBER, steps=INT, filled=FLAG, probe=FLAG,
                       dense_layers=ANY, score=NUMBER, round=INT, scores=ANY)),
    _kind(NONFINITE, dict(step=STEP_INDEX, time=NUMBER, ranks=ANY)),
    _kind(ELASTIC_RESET, dict(step=STEP_INDEX, time=NUMBER, world_size=INT,
                              previous_world_size=INT, epoch=INT, batch_in_epoch=INT,
                              total_steps=INT)),
    _kind(RUN_END, dict(step=STEP_INDEX, time=NUMBER, final=ANY)),
)})

#: What ``run.rank_phases`` keeps of every rank's step line (its timings, what it sent),
#: beside the writing ``rank``.
RANK_STEP_FIELDS = ("step", "time", "sent", "cf", "bytes_sent", "t_iter", "t_compute",
                    "t_compress", "t_comm", "t_update", *PHASES)


def new_record(kind: str, **fields) -> dict:
    """A metrics line ``{"kind": kind, **fields}`` (in the order given). Raises
    ValueError for a kind or a field this schema does not declare: add it here first,
    so that the reader knows its type.

    Example::

        new_record(RUN_END, step=500, time=61.2, final={"top1": 0.93})
    """
    spec = KINDS.get(kind)
    if spec is None:
        raise ValueError(f"metrics record kind {kind!r} is not in the run-record schema "
                         f"(gravac/engine/run_record.py); known kinds: {', '.join(KINDS)}")
    record = {"kind": kind, **fields}
    unknown = unknown_fields(record)
    if unknown:
        raise ValueError(f"{kind} record field(s) {', '.join(map(repr, unknown))} not in the "
                         f"run-record schema: declare them in gravac/engine/run_record.py")
    return record


def unknown_fields(record: Mapping) -> list[str]:
    """The fields of ``record`` (a metrics line) that its kind does not declare; all of
    them for a kind the schema does not know."""
    spec = KINDS.get(record.get("kind"))
    if spec is None:
        return [name for name in record if name != "kind"]
    if spec.more is not None:
        return []
    return [name for name in record if name != "kind" and name not in spec.fields]
