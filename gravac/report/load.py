"""Read a training run directory (the trainer's ``metrics.jsonl``) into a :class:`Run`.

The trainer appends one JSON object per line, each with a ``kind``: ``run_start``,
``step``, ``eval``, ``window`` (GraVAC decisions) and ``run_end``. Every record is checked
here, so the plotting and summary code can trust field types (numbers are ``float`` or
``None``, steps are ``int``).

Example::

    run = load_run("runs/resnet101-gravac")
    print(run.name, run.controller, run.final_step, run.wall_time)
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..engine.phases import PHASES

METRICS_FILE = "metrics.jsonl"

# Metrics that improve downwards; every other metric (top1, top5, ...) improves upwards.
LOWER_IS_BETTER = frozenset({"perplexity", "loss"})
# Preference order when run_start names no metric and it must be guessed from eval lines.
_INFERRED_METRICS = ("top1", "perplexity", "top5", "loss")

_STEP_NUMBERS = ("epoch", "time", "loss", "lr", "cf", "cf_actual", "theta_min", "theta_c", "gain_min",
                 "gain_c", "floats_sent", "cum_floats_sent", "dense_floats",
                 "cum_dense_floats", "bytes_sent", "t_compute", "t_compress", "t_comm",
                 "t_update", "t_iter", "samples_per_sec", *PHASES)
_EVAL_NUMBERS = ("time", "loss", "top1", "top5", "perplexity")
_WINDOW_NUMBERS = ("time", "theta_min", "theta_c", "delta_min", "delta_c")
_END_NUMBERS = ("time",)
_SENT_VALUES = ("candidate", "min", "dense", "skipped")  # skipped: non-finite gradient


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
    by_kind: dict[str, dict[int, dict[str, Any]]] = {"step": {}, "eval": {}, "window": {}}
    for lineno, record in records:
        kind = record["kind"]
        where = f"{path}:{lineno}"
        if kind == "run_start":
            # A resumed run appends a second run_start: the first describes the run.
            start = start if start is not None else _check_start(record, where)
        elif kind == "step":
            rec = _check_numbers(record, _STEP_NUMBERS, where)
            if rec.get("sent") is not None and rec["sent"] not in _SENT_VALUES:
                raise RunLoadError(f"{where}: field 'sent' is {rec['sent']!r}; expected one "
                                   f"of {', '.join(_SENT_VALUES)}")
            by_kind["step"][rec["step"]] = rec
        elif kind in ("eval", "window"):
            rec = _check_eval(record, where) if kind == "eval" else _check_window(record, where)
            by_kind[kind][rec["step"]] = rec
        elif kind == "run_end":
            end = _check_numbers(record, _END_NUMBERS, where)
        # Other kinds are skipped: newer trainers may log more than this report reads.

    steps, evals, windows = (sorted(by_kind[k].values(), key=lambda r: r["step"])
                             for k in ("step", "eval", "window"))
    if not steps and not evals:
        raise RunLoadError(f"{path}: no 'step' or 'eval' records yet; nothing to report "
                           f"(wait for the run to log its first steps)")
    start = start or {}
    return Run(directory=directory, name=_run_name(start, directory), start=start,
               steps=steps, evals=evals, windows=windows, end=end)


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


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_step_field(record: dict[str, Any], where: str) -> int:
    step = record.get("step")
    if _is_number(step) and float(step).is_integer():
        return int(step)
    raise RunLoadError(f"{where}: '{record['kind']}' record needs an integer 'step' field, "
                       f"got {step!r}")


def _check_numbers(record: dict[str, Any], fields: Iterable[str], where: str,
                   ) -> dict[str, Any]:
    """Copy of ``record`` with ``step`` an int and each of ``fields`` a float or None."""
    rec = dict(record)
    rec["step"] = _check_step_field(record, where)
    for name in fields:
        value = rec.get(name)
        if value is None:
            rec[name] = None
        elif _is_number(value):
            rec[name] = float(value)
        else:
            raise RunLoadError(f"{where}: field '{name}' should be a number or null, got "
                               f"{value!r}")
    return rec


def _check_start(record: dict[str, Any], where: str) -> dict[str, Any]:
    for name in ("name", "controller", "compressor", "model", "dataset", "metric"):
        value = record.get(name)
        if value is not None and not isinstance(value, str):
            raise RunLoadError(f"{where}: run_start field '{name}' should be a string, got "
                               f"{value!r}")
    return dict(record)


def _check_eval(record: dict[str, Any], where: str) -> dict[str, Any]:
    rec = _check_numbers(record, _EVAL_NUMBERS, where)
    # Eval lines may carry further metrics (e.g. a task's own): keep the numeric ones as
    # floats and drop anything else, so a later lookup only ever sees numbers.
    for name, value in record.items():
        if name in ("kind", "step") or name in _EVAL_NUMBERS:
            continue
        if _is_number(value):
            rec[name] = float(value)
        else:
            del rec[name]
    return rec


def _check_window(record: dict[str, Any], where: str) -> dict[str, Any]:
    rec = _check_numbers(record, _WINDOW_NUMBERS, where)
    table = rec.get("table")
    if table is None:
        rec["table"] = {}
    elif isinstance(table, dict):
        parsed: dict[float, float] = {}
        for key, value in table.items():
            try:
                cf = float(key)
            except ValueError:
                raise RunLoadError(f"{where}: window 'table' key {key!r} is not a CF "
                                   f"number") from None
            if not _is_number(value):
                raise RunLoadError(f"{where}: window 'table' value for CF {key} should be a "
                                   f"number, got {value!r}")
            parsed[cf] = float(value)
        rec["table"] = parsed
    else:
        raise RunLoadError(f"{where}: window field 'table' should be an object mapping CF "
                           f"to throughput, got {table!r}")
    settled = rec.get("settled")
    if settled is not None and not isinstance(settled, bool):
        raise RunLoadError(f"{where}: window field 'settled' should be true or false, got "
                           f"{settled!r}")
    return rec


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
