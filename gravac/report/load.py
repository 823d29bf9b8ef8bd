"""Read a training run directory into a :class:`Run`: the one reader of run directories.

The trainer appends one JSON object per line to ``metrics.jsonl``, each with a ``kind``
(``run_start``, ``step``, ``eval``, ``window``, ...); every kind and field is declared
once in the run-record schema, gravac/engine/run_record.py. Every record is checked here
against it, so the plotting and summary code (and the sweep, and the benchmarks) can
trust field types: numbers are ``float`` or ``None``, integers ``int`` or ``None``, steps
are ``int``, and every field the schema declares for a kind is present (``None`` when
the line did not carry it). ``load_rank_steps`` reads the per-rank step timings of
``run.rank_phases``.

Example::

    run = load_run("runs/resnet101-gravac")
    print(run.name, run.controller, run.final_step, run.wall_time)
    steps, delta = run.series("delta_min")
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..engine.run_record import (ANY, CF_TABLE, EVAL, FLAG, INT, KINDS, METHOD, METRICS_FILE,
                                 NUMBER, RANKS_DIR, RUN_END, RUN_START, SENT, SENT_VALUES, STEP,
                                 STEP_INDEX, TEXT, WINDOW, RecordKind)

# Metrics that improve downwards; every other metric (top1, top5, ...) improves upwards.
LOWER_IS_BETTER = frozenset({"perplexity", "loss"})
# Preference order when run_start names no metric and it must be guessed from eval lines.
_INFERRED_METRICS = ("top1", "perplexity", "top5", "loss")


class RunLoadError(ValueError):
    """A run directory or its metrics file cannot be used; the message names the file."""


@dataclass(eq=False)  # runs are compared by identity, not by their records
class Run:
    """One training run as read from ``RUN_DIR/metrics.jsonl``.

    ``steps``, ``evals`` and ``windows`` are sorted by step (a step logged twice, e.g.
    after a resume, keeps its last record). ``label`` is the name shown in plots and
    tables; :func:`load_runs` makes it unique among the runs of one report.

    Example::

        run = load_run("runs/lstm-gravac")
        steps, cf = run.series("cf")
    """

    directory: Path
    name: str
    start: dict[str, Any]
    steps: list[dict[str, Any]]
    evals: list[dict[str, Any]]
    windows: list[dict[str, Any]]
    end: dict[str, Any] | None
    label: str = field(default="")
    #: ``Auto``'s method events (measured, pruned, chosen), in the order logged.
    method_events: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.label:
            self.label = self.name

    # --------------------------------------------------------------- run_start metadata
    @property
    def controller(self) -> str:
        return str(self.start.get("controller") or "unknown")

    @property
    def compressor(self) -> str:
        return str(self.start.get("compressor") or "unknown")

    @property
    def model(self) -> str | None:
        return self.start.get("model")

    @property
    def gravac(self) -> str | None:
        """The gravac that ran it (version and source hash), when the run recorded it."""
        return self.start.get("gravac")

    @property
    def dataset(self) -> str | None:
        return self.start.get("dataset")

    @property
    def is_gravac(self) -> bool:
        """GraVAC runs are those started with the gravac controller or that logged windows."""
        return self.controller == "gravac" or bool(self.windows)

    @property
    def metric(self) -> str:
        """The evaluation metric: run_start's ``metric`` if eval lines carry it, else a guess."""
        declared = self.start.get("metric")
        if declared and (not self.evals or any(e.get(declared) is not None
                                               for e in self.evals)):
            return str(declared)
        for name in _INFERRED_METRICS:
            if any(e.get(name) is not None for e in self.evals):
                return name
        return str(declared or "top1")

    @property
    def lower_is_better(self) -> bool:
        return self.metric in LOWER_IS_BETTER

    # ------------------------------------------------------------------ progress / time
    @property
    def final_step(self) -> int | None:
        """run_end's step, or (for a run that was stopped) the largest step logged."""
        if self.end is not None:
            return self.end["step"]
        for records in (self.steps, self.evals, self.windows):
            if records:
                return records[-1]["step"]
        return None

    @property
    def wall_time(self) -> float | None:
        """Seconds from start to run_end, or to the last timed record of a stopped run."""
        if self.end is not None and self.end.get("time") is not None:
            return self.end["time"]
        times = [r["time"] for r in (*self.steps, *self.evals, *self.windows)
                 if r.get("time") is not None and not math.isnan(r["time"])]
        return max(times) if times else None

    # --------------------------------------------------------------------------- series
    def series(self, key: str, records: str = "steps") -> tuple[list[int], list[float]]:
        """(steps, values) of the records (``steps``/``evals``/``windows``) that have ``key``."""
        pairs = [(r["step"], r[key]) for r in getattr(self, records) if r.get(key) is not None]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    def eval_series(self) -> tuple[list[int], list[float | None], list[float]]:
        """(steps, times, values) of this run's metric from its eval lines."""
        rows = [(e["step"], e.get("time"), e[self.metric]) for e in self.evals
                if e.get(self.metric) is not None]
        return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]


# -------------------------------------------------------------------------- reading


def load_run(run_dir: str | os.PathLike) -> Run:
    """Read and check ``run_dir/metrics.jsonl``.

    Raises :class:`RunLoadError` (a ``ValueError``) naming the file, and the line and
    field where one is at fault, when the directory or file is missing, empty or invalid.

    Example::

        run = load_run("runs/resnet101-gravac")
    """
    directory = Path(run_dir)
    path = directory / METRICS_FILE
    if not directory.is_dir():
        raise RunLoadError(f"{directory}: not a directory; pass run directories that "
                           f"contain {METRICS_FILE}")
    if not path.is_file():
        raise RunLoadError(f"{path}: metrics file not found; is {directory} a run directory "
                           f"written by the gravac trainer?")
    records = list(_read_jsonl(path))
    if not records:
        raise RunLoadError(f"{path}: metrics file is empty; the run logged nothing yet "
                           f"(wait for its first steps, or drop this run)")

    start: dict[str, Any] | None = None
    end: dict[str, Any] | None = None
    by_kind: dict[str, dict[int, dict[str, Any]]] = {STEP: {}, EVAL: {}, WINDOW: {}}
    method_events: dict[tuple, dict[str, Any]] = {}
    for lineno, record in records:
        kind = record["kind"]
        where = f"{path}:{lineno}"
        if kind == RUN_START:
            # A resumed run appends a second run_start: the first describes the run.
            start = start if start is not None else check_record(record, where)
        elif kind in by_kind:
            rec = check_record(record, where)
            by_kind[kind][rec["step"]] = rec
        elif kind == METHOD:
            # Several per step; a resume logs a step's events again: kept once.
            rec = check_record(record, where)
            method_events[(rec["step"], rec.get("event"), rec.get("method"))] = rec
        elif kind == RUN_END:
            end = check_record(record, where)
        # Other kinds (nonfinite, elastic_reset, and what newer trainers may log) are not
        # part of a Run.

    steps, evals, windows = (sorted(by_kind[k].values(), key=lambda r: r["step"])
                             for k in (STEP, EVAL, WINDOW))
    if not steps and not evals:
        raise RunLoadError(f"{path}: no 'step' or 'eval' records yet; nothing to report "
                           f"(wait for the run to log its first steps)")
    start = start or {}
    return Run(directory=directory, name=_run_name(start, directory), start=start,
               steps=steps, evals=evals, windows=windows, end=end,
               method_events=list(method_events.values()))


def load_runs(run_dirs: Iterable[str | os.PathLike]) -> list[Run]:
    """Load several runs (the same directory twice counts once) and give unique labels.

    Every run is read before anything is returned, so one bad run fails the whole call
    before any output is written.

    Example::

        runs = load_runs(["runs/dense", "runs/gravac"])
    """
    runs: list[Run] = []
    seen: set[Path] = set()
    for run_dir in run_dirs:
        resolved = Path(run_dir).resolve()
        if resolved in seen:
            continue
        seen.add(resolved)
        runs.append(load_run(run_dir))
    _unique_labels(runs)
    return runs


def _unique_labels(runs: list[Run]) -> None:
    # Two runs with the same name (e.g. repeats of one config) would share a legend entry.
    counts: dict[str, int] = {}
    for run in runs:
        counts[run.name] = counts.get(run.name, 0) + 1
    for run in runs:
        run.label = run.name if counts[run.name] == 1 else f"{run.name} ({run.directory})"


def _read_jsonl(path: Path) -> Iterable[tuple[int, dict[str, Any]]]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise RunLoadError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); is it "
                           f"really a metrics.jsonl file?") from None
    lines = text.split("\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            # A run killed mid-write leaves a partial last line without its newline: skip
            # it rather than refuse the whole run. A bad line elsewhere is real damage.
            if i == last and not text.endswith("\n"):
                continue
            raise RunLoadError(f"{path}:{i + 1}: not valid JSON ({e.msg}); fix or delete "
                               f"that line") from None
        if not isinstance(record, dict) or not isinstance(record.get("kind"), str):
            raise RunLoadError(f"{path}:{i + 1}: expected a JSON object with a string "
                               f"'kind' field")
        yield i + 1, record


def check_record(record: dict[str, Any], where: str) -> dict[str, Any]:
    """A copy of ``record`` (a metrics line of a kind the schema declares) with every
    declared field checked and converted by its type, absent ones set to None (an empty
    table); fields the schema does not declare are kept as written, except on kinds with
    further fields of a declared type (eval: numbers kept as floats, the rest dropped).
    Raises RunLoadError naming ``where`` and the field."""
    spec: RecordKind = KINDS[record["kind"]]
    rec = dict(record)
    for name, type_ in spec.fields.items():
        rec[name] = _convert(record.get(name), type_, name, record["kind"], where)
    if spec.more == NUMBER:
        # e.g. a task's own metrics: a later lookup only ever sees numbers.
        for name, value in record.items():
            if name == "kind" or name in spec.fields:
                continue
            if _is_number(value):
                rec[name] = float(value)
            else:
                del rec[name]
    return rec


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _convert(value: Any, type_: str, name: str, kind: str, where: str) -> Any:
    """``value`` of field ``name`` as its schema type says (None stays None)."""
    if type_ == STEP_INDEX:
        if _is_number(value) and float(value).is_integer():
            return int(value)
        raise RunLoadError(f"{where}: '{kind}' record needs an integer '{name}' field, "
                           f"got {value!r}")
    if type_ == CF_TABLE:
        return _cf_table(value, name, kind, where)
    if value is None or type_ == ANY:
        return value
    if type_ == NUMBER and _is_number(value):
        return float(value)
    if type_ == INT and _is_number(value) and float(value).is_integer():
        return int(value)
    if type_ == TEXT and isinstance(value, str):
        return value
    if type_ == FLAG and isinstance(value, bool):
        return value
    if type_ == SENT and value in SENT_VALUES:
        return value
    expected = {NUMBER: "a number or null", INT: "an integer or null",
                TEXT: "a string or null", FLAG: "true or false",
                SENT: f"one of {', '.join(SENT_VALUES)}"}[type_]
    raise RunLoadError(f"{where}: {kind} field '{name}' should be {expected}, got {value!r}")


def _cf_table(value: Any, name: str, kind: str, where: str) -> dict[float, float]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RunLoadError(f"{where}: {kind} field '{name}' should be an object mapping CF "
                           f"to throughput, got {value!r}")
    parsed: dict[float, float] = {}
    for key, number in value.items():
        try:
            cf = float(key)
        except ValueError:
            raise RunLoadError(f"{where}: {kind} '{name}' key {key!r} is not a CF "
                               f"number") from None
        if not _is_number(number):
            raise RunLoadError(f"{where}: {kind} '{name}' value for CF {key} should be a "
                               f"number, got {number!r}")
        parsed[cf] = float(number)
    return parsed


def _run_name(start: dict[str, Any], directory: Path) -> str:
    """run_start's name, else config.yaml's ``name``, else the directory's name."""
    if start.get("name"):
        return str(start["name"])
    config = directory / "config.yaml"
    if config.is_file():
        # config.yaml is optional and only consulted for the name: a broken one is ignored.
        try:
            import yaml
            data = yaml.safe_load(config.read_text(encoding="utf-8"))
        except Exception:
            data = None
        if isinstance(data, dict) and isinstance(data.get("name"), str) and data["name"]:
            return data["name"]
    return directory.resolve().name


def load_rank_steps(run_dir: str | os.PathLike) -> dict[int, list[dict[str, Any]]]:
    """rank -> its step records (``run.rank_phases``: ``ranks/rank{r}.jsonl``) in step
    order, the last one of a step a resume re-ran; {} when the run did not write them.
    A line cut by a crash is skipped.

    Example::

        by_rank = load_rank_steps("runs/lstm-topk")    # {0: [{"rank": 0, "step": 1, ...}]}
    """
    out = {}
    for path in sorted((Path(run_dir) / RANKS_DIR).glob("rank*.jsonl")):
        by_step = {}
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            by_step[entry["step"]] = entry
        if by_step:
            out[int(path.stem[len("rank"):])] = [by_step[s] for s in sorted(by_step)]
    return out
