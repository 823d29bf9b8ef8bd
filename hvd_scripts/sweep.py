"""Run a grid of gravac trainings one after another and tabulate the results.

Usage::

    .venv/bin/python hvd_scripts/sweep.py SWEEP_FILE [--np N] [--dry-run] [--out DIR]
                                          [--set KEY=VALUE ...] [--overwrite]

Examples::

    .venv/bin/python hvd_scripts/sweep.py configs/sweeps/demo_sweep.yaml
    .venv/bin/python hvd_scripts/sweep.py configs/sweeps/paper_resnet101.yaml --np 4 \\
        --set data.root=/data/cifar --dry-run

A sweep file is YAML::

    name: demo_sweep            # results go to runs/sweeps/<name>/ unless --out
    np: 2                       # ranks per run (--np overrides)
    configs: [configs/demo.yaml]             # base config files for every run
    set: {run.steps: 60}                     # overrides for every run (optional)
    grid:                                    # cartesian product of the axes
      compression:                           # an axis: a list of entries, each with
        - {files: [configs/compression/dense.yaml]}       # files, set and/or tag
        - {files: [configs/compression/static_topk_10x.yaml]}
        - {set: {compression.controller: gravac, compression.gravac.window: 20}, tag: gravac_w20}
      optimizer.lr: [0.05, 0.1]              # a dotted axis name: one key's values
    baseline: {compression: 0}               # optional, axis -> index (or label)

What a run gets: ``--config`` the base files, then each axis entry's ``files`` (axis
order); ``--set`` the sweep's ``set``, then each axis entry's ``set`` (axis order, later
wins), then the command line's ``--set``, then ``run.output_dir=<sweep dir>/runs`` and
``run.name=<sweep name>-<axis labels joined by '-'>``. Relative config paths are
relative to the repository root (where train.py is).

The baseline of a run is the grid point with the ``baseline`` indices on the axes it
names and the run's own indices on the others; without ``baseline`` it is the first run
whose ``compression.controller`` is ``dense`` (if any).

Before anything is launched every run is resolved and checked with ``train.py --dry-run``
(plain python, no horovodrun); one bad run stops the sweep there, naming the run and the
config error. Runs then go one after another under ``horovodrun --gloo`` on this host; a
failing run is recorded as failed and the sweep goes on. ``results.csv`` and
``results.md`` in the sweep directory are rewritten (atomically) after every run, and at
the end ``python -m gravac.report`` plots the successful runs into ``<sweep dir>/report``.
Each run's console output is kept in ``<sweep dir>/logs/<run name>.log``.

Exit status: 0 all runs succeeded (or the dry run found every run valid), 1 a run or the
report failed, 2 the sweep file or a run's config is invalid, 130 interrupted.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import io
import itertools
import json
import math
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:          # the gravac package of this checkout, as train.py uses
    sys.path.insert(0, str(REPO))

from gravac.util.atomic import atomic_write_text  # noqa: E402

TOP_KEYS = ("name", "np", "configs", "set", "grid", "baseline")
ENTRY_KEYS = ("files", "set", "tag")
# Keys the sweep chooses for every run: a sweep file may not set them.
RESERVED_KEYS = ("run.name", "run.output_dir")
FIXED_COLUMNS = ("name", "status", "steps", "wall_time_s", "metric", "final_metric",
                 "floats_vs_dense", "mean_samples_per_sec", "speedup", "comm_saving",
                 "baseline", "note")
MAX_NAME = 120
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")


class SweepError(ValueError):
    """A problem with the sweep file or its runs, in one line naming the field."""


# -- the sweep file ---------------------------------------------------------------------------
@dataclass(frozen=True)
class AxisValue:
    """One entry of a grid axis: config files and overrides, shown as ``label``."""

    label: str
    files: tuple[str, ...] = ()
    overrides: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Axis:
    name: str
    values: tuple[AxisValue, ...]


@dataclass
class Sweep:
    """A parsed sweep file (see the module docstring for the format)."""

    name: str
    np: int
    configs: list[str]
    overrides: list[tuple[str, Any]]
    axes: list[Axis]
    baseline: dict[str, int] | None
    source: Path | None = None


@dataclass
class RunSpec:
    """One run of the sweep: its name, grid position and train.py arguments."""

    name: str
    index: tuple[int, ...]
    labels: dict[str, str]
    files: list[str]
    overrides: list[tuple[str, Any]] = field(default_factory=list)

    def train_args(self, sweep_dir: Path, extra: Sequence[tuple[str, Any]] = ()) -> list[str]:
        """train.py's arguments for this run (without ``--dry-run``/``--resume``).

        Example::

            run.train_args(Path("/tmp/sw"))
            # ['--config', 'configs/demo.yaml', '--set', 'run.steps=60', ...,
            #  '--set', 'run.output_dir=/tmp/sw/runs', '--set', 'run.name=demo-dense']
        """
        sets = [*self.overrides, *extra, ("run.output_dir", str(sweep_dir / "runs")),
                ("run.name", self.name)]
        args = ["--config", *self.files]
        for key, value in sets:
            args += ["--set", f"{key}={format_value(value)}"]
        return args


def format_value(value: Any) -> str:
    """``value`` as YAML text that train.py's ``--set`` reads back unchanged.

    Example::

        format_value(0.05), format_value("topk"), format_value([1, 2])
        # ('0.05', 'topk', '[1, 2]')
    """
    if isinstance(value, str) and value == value.strip() and "\n" not in value:
        try:
            if yaml.safe_load(value) == value:
                return value                   # plain words and paths stay readable
        except yaml.YAMLError:
            pass
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    try:
        return json.dumps(value, allow_nan=False)   # JSON is YAML: an exact round trip
    except (TypeError, ValueError):
        text = yaml.safe_dump(value, default_flow_style=True, width=1 << 30)
        return text.removesuffix("...\n").strip()


def safe_name(text: str) -> str:
    """``text`` with every run of characters other than letters, digits, ``. _ + -``
    replaced by one ``_`` (so it is a safe file name), stripped of leading/trailing ``_``.

    Example::

        safe_name("lr=0.05 [x]")   # 'lr_0.05_x'
    """
    return _UNSAFE.sub("_", text).strip("_")


def _value_text(value: Any) -> str:
    return value if isinstance(value, str) else format_value(value)


def _override_label(overrides: Iterable[tuple[str, Any]]) -> str:
    return "_".join(f"{key.rsplit('.', 1)[-1]}_{_value_text(v)}" for key, v in overrides)


def resolve_file(field_name: str, text: Any, repo: Path = REPO) -> str:
    """A config path from the sweep file, checked to exist; relative paths are relative to
    the repository root. Returns it as train.py (run from the root) should see it.

    Example::

        resolve_file("configs[0]", "configs/demo.yaml")   # 'configs/demo.yaml'
    """
    if not isinstance(text, str) or not text.strip():
        raise SweepError(f"{field_name}: expected the path of a config file, got {text!r}")
    path = Path(text).expanduser()
    full = path if path.is_absolute() else repo / path
    if not full.is_file():
        raise SweepError(f"{field_name}: config file {text!r} not found (relative paths are "
                         f"resolved against the repository root {repo})")
    return str(path) if not path.is_absolute() else str(full)


def _file_list(field_name: str, raw: Any, repo: Path) -> tuple[str, ...]:
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list):
        raise SweepError(f"{field_name}: expected a list of config files, got {raw!r}")
    return tuple(resolve_file(f"{field_name}[{i}]", item, repo) for i, item in enumerate(raw))


def check_key(field_name: str, key: Any) -> str:
    """A dotted override key such as ``optimizer.lr``; the sweep's own keys are refused."""
    if not isinstance(key, str) or not key or any(not p.strip() for p in key.split(".")):
        raise SweepError(f"{field_name}: key {key!r} must be a dotted path like optimizer.lr")
    if key in RESERVED_KEYS:
        raise SweepError(f"{field_name}: {key} is chosen by the sweep (run.name = <sweep "
                         f"name>-<axis labels>, run.output_dir = <sweep dir>/runs); remove it "
                         f"and use --out to choose where results go")
    return key


def _overrides(field_name: str, raw: Any) -> list[tuple[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, dict):
        raise SweepError(f"{field_name}: expected a mapping of dotted keys to values, e.g. "
                         f"{{run.steps: 60}}; got {raw!r}")
    return [(check_key(f"{field_name}.{k}" if isinstance(k, str) else field_name, k), v)
            for k, v in raw.items()]


def _entry(axis: str, i: int, raw: Any, repo: Path) -> tuple[AxisValue, bool]:
    """One grid entry; the flag says whether its label is an explicit ``tag``."""
    where = f"grid.{axis}[{i}]"
    if "." in axis:                         # shorthand: the entries are values of one key
        return AxisValue(label=_override_label([(axis, raw)]), overrides=((axis, raw),)), False
    if isinstance(raw, (str, list)):
        files = _file_list(where, raw, repo)
        return AxisValue(label="+".join(Path(f).stem for f in files), files=files), False
    if not isinstance(raw, dict):
        raise SweepError(f"{where}: expected a mapping with keys {', '.join(ENTRY_KEYS)} or a "
                         f"list of config files, got {raw!r} (for an axis over one key's "
                         f"values name the axis by the dotted key, e.g. optimizer.lr)")
    unknown = [k for k in raw if k not in ENTRY_KEYS]
    if unknown:
        raise SweepError(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(ENTRY_KEYS)}")
    if not raw.get("files") and not raw.get("set"):
        raise SweepError(f"{where}: give 'files' (config files) and/or 'set' (overrides)")
    files = _file_list(f"{where}.files", raw.get("files") or [], repo)
    sets = _overrides(f"{where}.set", raw.get("set"))
    tag = raw.get("tag")
    if tag is not None:
        if not isinstance(tag, (str, int, float)) or not safe_name(str(tag)):
            raise SweepError(f"{where}.tag: {tag!r} must be a short name such as gravac_w20")
        return AxisValue(label=safe_name(str(tag)), files=files, overrides=tuple(sets)), True
    parts = [Path(f).stem for f in files] + ([_override_label(sets)] if sets else [])
    return AxisValue(label="_".join(parts), files=files, overrides=tuple(sets)), False


def parse_axis(name: Any, raw: Any, repo: Path = REPO) -> Axis:
    """One ``grid`` axis; labels are made safe and unique within the axis.

    Example::

        parse_axis("optimizer.lr", [0.05, 0.1]).values[0]
        # AxisValue(label='lr_0.05', files=(), overrides=(('optimizer.lr', 0.05),))
    """
    if not isinstance(name, str) or not name or not safe_name(name):
        raise SweepError(f"grid: axis name {name!r} must be a word (e.g. compression) or a "
                         f"dotted key (e.g. optimizer.lr)")
    if name in FIXED_COLUMNS:
        raise SweepError(f"grid.{name}: the axis name clashes with a results column "
                         f"({', '.join(FIXED_COLUMNS)}); rename the axis")
    if "." in name:
        check_key(f"grid.{name}", name)
    if not isinstance(raw, list):
        raise SweepError(f"grid.{name}: expected a list of entries, got {raw!r}")
    if not raw:
        raise SweepError(f"grid.{name}: the axis is empty; give it at least one entry or "
                         f"remove it")
    parsed = [_entry(name, i, item, repo) for i, item in enumerate(raw)]
    tags: dict[str, int] = {}
    for i, (value, explicit) in enumerate(parsed):
        if explicit and value.label in tags:
            raise SweepError(f"grid.{name}[{i}].tag: {value.label!r} is already the tag of "
                             f"grid.{name}[{tags[value.label]}]; tags must differ within an axis")
        if explicit:
            tags[value.label] = i
    labels = [safe_name(v.label) or f"{safe_name(name)}{i}" for i, (v, _) in enumerate(parsed)]
    counts = {label: labels.count(label) for label in labels}
    values = []
    for i, ((value, _), label) in enumerate(zip(parsed, labels)):
        if counts[label] > 1:
            label = f"{label}_{i}"
        values.append(AxisValue(label=label, files=value.files, overrides=value.overrides))
    return Axis(name=name, values=tuple(values))


def _baseline(raw: Any, axes: list[Axis]) -> dict[str, int] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not raw:
        raise SweepError(f"baseline: expected a mapping axis -> index, e.g. {{compression: 0}}; "
                         f"got {raw!r}")
    by_name = {a.name: a for a in axes}
    out = {}
    for axis, pick in raw.items():
        if axis not in by_name:
            raise SweepError(f"baseline.{axis}: no such grid axis; axes: {', '.join(by_name)}")
        values = by_name[axis].values
        if isinstance(pick, int) and not isinstance(pick, bool):
            if not 0 <= pick < len(values):
                raise SweepError(f"baseline.{axis}: index {pick} out of range (the axis has "
                                 f"{len(values)} entries: 0..{len(values) - 1})")
            out[axis] = pick
        else:
            labels = [v.label for v in values]
            if pick not in labels:
                raise SweepError(f"baseline.{axis}: {pick!r} is neither an index nor a label; "
                                 f"labels: {', '.join(labels)}")
            out[axis] = labels.index(pick)
    return out


def parse_sweep(data: Any, default_name: str = "sweep", repo: Path = REPO) -> Sweep:
    """Check a loaded sweep file and turn it into a :class:`Sweep`.

    Example::

        parse_sweep({"name": "s", "configs": ["configs/demo.yaml"],
                     "grid": {"optimizer.lr": [0.05, 0.1]}})
    """
    if not isinstance(data, dict):
        raise SweepError(f"the sweep file must hold a mapping with keys {', '.join(TOP_KEYS)}")
    unknown = [k for k in data if k not in TOP_KEYS]
    if unknown:
        raise SweepError(f"unknown top-level key {unknown[0]!r}; allowed: {', '.join(TOP_KEYS)}")
    name = data.get("name", default_name)
    if not isinstance(name, str) or not name or safe_name(name) != name:
        raise SweepError(f"name: {name!r} must be a non-empty name of letters, digits, '.', "
                         f"'_', '+' or '-' (it names the sweep directory and every run)")
    np_ = data.get("np", 2)
    if isinstance(np_, bool) or not isinstance(np_, int) or np_ < 1:
        raise SweepError(f"np: {np_!r} must be a positive integer (ranks per run)")
    configs = list(_file_list("configs", data.get("configs") or [], repo))
    overrides = _overrides("set", data.get("set"))
    grid = data.get("grid")
    if not isinstance(grid, dict) or not grid:
        raise SweepError(f"grid: expected a mapping with at least one axis (axis name -> list "
                         f"of entries); got {grid!r}")
    axes = [parse_axis(axis, values, repo) for axis, values in grid.items()]
    return Sweep(name=name, np=np_, configs=configs, overrides=overrides, axes=axes,
                 baseline=_baseline(data.get("baseline"), axes))


def load_sweep(path: str | Path, repo: Path = REPO) -> Sweep:
    """Read and check a sweep file (a relative path not found from the current directory
    is looked up from the repository root).

    Example::

        sweep = load_sweep("configs/sweeps/demo_sweep.yaml")
    """
    path = Path(path).expanduser()
    if not path.is_file() and not path.is_absolute() and (repo / path).is_file():
        path = repo / path                 # e.g. configs/sweeps/x.yaml from elsewhere
    if not path.is_file():
        raise SweepError(f"sweep file {str(path)!r} not found (looked in the current "
                         f"directory and in {repo})")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SweepError(f"sweep file {str(path)!r} is not valid YAML: "
                         f"{str(exc).splitlines()[0]}") from None
    sweep = parse_sweep(data, default_name=safe_name(path.stem) or "sweep", repo=repo)
    sweep.source = path
    return sweep


# -- expansion and baselines -------------------------------------------------------------------
def run_name(sweep_name: str, labels: Sequence[str]) -> str:
    """``<sweep>-<label>-<label>...``, shortened with a hash when it gets too long.

    Example::

        run_name("demo", ["dense", "lr_0.05"])   # 'demo-dense-lr_0.05'
    """
    name = "-".join([sweep_name, *labels])
    if len(name) > MAX_NAME:
        digest = hashlib.sha1(name.encode()).hexdigest()[:8]
        name = f"{name[:MAX_NAME - 9]}-{digest}"
    return name


def expand(sweep: Sweep) -> list[RunSpec]:
    """The cartesian product of the axes (first axis slowest), one :class:`RunSpec` each.

    Example::

        [r.name for r in expand(load_sweep("configs/sweeps/demo_sweep.yaml"))]
        # ['demo_sweep-dense', 'demo_sweep-topk_100x', 'demo_sweep-gravac_w20']
    """
    runs = []
    ranges = [range(len(axis.values)) for axis in sweep.axes]
    for index in itertools.product(*ranges):
        values = [axis.values[i] for axis, i in zip(sweep.axes, index)]
        files = list(sweep.configs) + [f for v in values for f in v.files]
        overrides = list(sweep.overrides) + [o for v in values for o in v.overrides]
        runs.append(RunSpec(name=run_name(sweep.name, [v.label for v in values]),
                            index=tuple(index),
                            labels={a.name: v.label for a, v in zip(sweep.axes, values)},
                            files=files, overrides=overrides))
    names = [r.name for r in runs]
    if len(set(names)) != len(names):      # only after hash-shortening, in theory
        dup = next(n for n in names if names.count(n) > 1)
        raise SweepError(f"grid: two runs would both be named {dup!r}; give the axis entries "
                         f"distinct tags")
    return runs


def pick_baselines(sweep: Sweep, runs: Sequence[RunSpec],
                   controllers: dict[str, str] | None = None) -> dict[str, str | None]:
    """Run name -> its baseline run's name (None where there is none).

    With ``baseline`` in the sweep file: the grid point with those indices on the named axes
    and the run's own indices elsewhere. Otherwise the first run whose resolved
    ``compression.controller`` (``controllers``: run name -> controller) is ``dense``.

    Example::

        pick_baselines(sweep, runs, {"s-dense": "dense", "s-topk": "static"})
        # {'s-dense': 's-dense', 's-topk': 's-dense'}
    """
    if sweep.baseline is None:
        first_dense = next((r.name for r in runs if (controllers or {}).get(r.name) == "dense"),
                           None)
        return {r.name: first_dense for r in runs}
    by_index = {r.index: r.name for r in runs}
    positions = {a.name: k for k, a in enumerate(sweep.axes)}
    out = {}
    for run in runs:
        target = list(run.index)
        for axis, i in sweep.baseline.items():
            target[positions[axis]] = i
        out[run.name] = by_index.get(tuple(target))
    return out


# -- validation --------------------------------------------------------------------------------
def resolve_configs(runs: Sequence[RunSpec], sweep_dir: Path, extra: Sequence[tuple[str, Any]],
                    repo: Path = REPO) -> tuple[dict[str, Any], list[str]]:
    """Load every run's config in this process (fast, no model built).

    Returns (run name -> resolved ``Config``, ["run NAME: config error: ..." for bad runs]).
    """
    from gravac.train.config import ConfigError, load_config

    configs, errors = {}, []
    for run in runs:
        files = [str(repo / f) for f in run.files]
        args = run.train_args(sweep_dir, extra)
        sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
        try:
            configs[run.name] = load_config(files, sets)
        except ConfigError as exc:
            errors.append(f"run {run.name}: config error: {exc}")
    return configs, errors


def dry_run_check(train_args: list[str], repo: Path = REPO, timeout: float = 600) -> str | None:
    """``python train.py ARGS --dry-run`` (no horovodrun): None if it passes, else the error.

    Example::

        dry_run_check(["--config", "configs/demo.yaml"])   # None
    """
    try:
        proc = subprocess.run([sys.executable, str(repo / "train.py"), *train_args, "--dry-run"],
                              cwd=repo, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"train.py --dry-run did not finish in {timeout:.0f}s"
    if proc.returncode == 0:
        return None
    lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("config error:")]
    return errors[-1] if errors else (lines[-1] if lines else f"exit code {proc.returncode}")


def occupied(run_dir: Path) -> bool:
    """Whether ``run_dir`` already holds a run (train.py refuses it without overwrite)."""
    return (run_dir / "metrics.jsonl").exists() or (run_dir / "checkpoints").exists()


def validate(runs: Sequence[RunSpec], sweep_dir: Path, extra: Sequence[tuple[str, Any]],
             check: Callable[[list[str]], str | None] = dry_run_check,
             existing_is_error: bool = True) -> tuple[dict[str, Any], list[str]]:
    """Resolve every run, then check it with ``check`` (``train.py --dry-run``).

    Returns (run name -> resolved config, error lines naming the run). A run directory that
    already holds a run is an error unless the run sets ``run.overwrite`` (or, with
    ``existing_is_error=False`` as in a dry run, a printed warning).
    """
    configs, errors = resolve_configs(runs, sweep_dir, extra)
    for k, run in enumerate(runs, 1):
        if run.name not in configs:
            continue
        print(f"  [{k}/{len(runs)}] train.py --dry-run {run.name} ...", end="", flush=True)
        problem = check(run.train_args(sweep_dir, extra))
        print(" ok" if problem is None else " INVALID", flush=True)
        if problem is not None:
            errors.append(f"run {run.name}: {problem}")
            continue
        run_dir = sweep_dir / "runs" / run.name
        if occupied(run_dir) and not configs[run.name].run.overwrite:
            message = (f"run {run.name}: {run_dir} already holds a run; pass --overwrite to "
                       f"replace the sweep's runs, or --out to write elsewhere")
            if existing_is_error:
                errors.append(message)
            else:
                print(f"  warning: {message}")
    return configs, errors


# -- metrics and the results table -------------------------------------------------------------
def read_metrics(run_dir: Path) -> list[dict]:
    """The records of ``run_dir/metrics.jsonl`` (missing file: []; a torn line is skipped)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


@dataclass
class RunMetrics:
    """What the results table needs from one run's metrics.jsonl (None: not logged)."""

    steps: int | None = None
    wall_time: float | None = None
    metric: str | None = None
    final_metric: float | None = None
    floats_vs_dense: float | None = None
    floats_per_step: float | None = None
    mean_samples_per_sec: float | None = None
    finished: bool = False


def summarize_metrics(records: Sequence[dict]) -> RunMetrics:
    """Steps, wall time (run_end), final metric (last eval: top1, else perplexity), share of
    dense traffic (last cum_floats_sent / cum_dense_floats) and mean samples/s.

    Example::

        summarize_metrics(read_metrics(Path("runs/sweeps/demo_sweep/runs/demo_sweep-dense")))
    """
    steps = [r for r in records if r.get("kind") == "step"]
    evals = [r for r in records if r.get("kind") == "eval"]
    end = next((r for r in reversed(records) if r.get("kind") == "run_end"), None)
    out = RunMetrics(finished=end is not None)
    if end is not None:
        out.steps, out.wall_time = end.get("step"), end.get("time")
    elif steps:
        out.steps = steps[-1].get("step")
    for rec in reversed(evals):
        name = "top1" if rec.get("top1") is not None else \
            "perplexity" if rec.get("perplexity") is not None else None
        if name:
            out.metric, out.final_metric = name, float(rec[name])
            break
    for rec in reversed(steps):
        sent, dense, step = rec.get("cum_floats_sent"), rec.get("cum_dense_floats"), rec.get("step")
        if sent is not None and dense is not None:
            out.floats_vs_dense = sent / dense if dense > 0 else None
            out.floats_per_step = sent / step if step else None
            break
    rates = [r["samples_per_sec"] for r in steps if r.get("samples_per_sec") is not None]
    out.mean_samples_per_sec = sum(rates) / len(rates) if rates else None
    return out


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den


def _time_per_step(m: RunMetrics | None) -> float | None:
    return None if m is None or not m.finished else _ratio(m.wall_time, m.steps)


def speedup(run: RunMetrics, baseline: RunMetrics | None) -> float | None:
    """Baseline wall time per step / the run's (= the wall time ratio at equal steps)."""
    return _ratio(_time_per_step(baseline), _time_per_step(run))


def comm_saving(run: RunMetrics, baseline: RunMetrics | None) -> float | None:
    """Baseline floats sent per step / the run's (= the cum_floats_sent ratio at equal steps)."""
    return _ratio(baseline.floats_per_step if baseline else None, run.floats_per_step)


def results_rows(sweep: Sweep, runs: Sequence[RunSpec], sweep_dir: Path,
                 status: dict[str, str], notes: dict[str, str],
                 baselines: dict[str, str | None]) -> list[dict[str, Any]]:
    """One row per run (columns: ``columns(sweep)``), read from the run directories.

    Example::

        rows = results_rows(sweep, runs, Path("/tmp/sw"), {"s-dense": "ok"}, {}, baselines)
    """
    metrics = {r.name: summarize_metrics(read_metrics(sweep_dir / "runs" / r.name))
               if status.get(r.name, "pending") != "pending" else RunMetrics() for r in runs}
    rows = []
    for run in runs:
        m, base_name = metrics[run.name], baselines.get(run.name)
        ok = status.get(run.name) == "ok"
        base = metrics.get(base_name) if base_name and status.get(base_name) == "ok" else None
        rows.append({"name": run.name, **run.labels,
                     "status": status.get(run.name, "pending"), "steps": m.steps,
                     "wall_time_s": m.wall_time, "metric": m.metric,
                     "final_metric": m.final_metric, "floats_vs_dense": m.floats_vs_dense,
                     "mean_samples_per_sec": m.mean_samples_per_sec,
                     "speedup": speedup(m, base) if ok else None,
                     "comm_saving": comm_saving(m, base) if ok else None,
                     "baseline": base_name, "note": notes.get(run.name, "")})
    return rows


def columns(sweep: Sweep) -> list[str]:
    """Results columns: name, the axis names, then the fixed columns."""
    return ["name", *(a.name for a in sweep.axes), *FIXED_COLUMNS[1:]]


def to_csv(rows: Sequence[dict], cols: Sequence[str]) -> str:
    """CSV text; numbers at full precision, None as an empty cell."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(cols)
    for row in rows:
        writer.writerow(["" if row.get(c) is None else row[c] for c in cols])
    return buf.getvalue()


def _md_cell(column: str, value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        if column in ("speedup", "comm_saving"):
            return f"{value:.2f}x"
        if column == "wall_time_s":
            return f"{value:.2f}"
        if column == "mean_samples_per_sec":
            return f"{value:.1f}"
        return f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def to_markdown(sweep: Sweep, rows: Sequence[dict], cols: Sequence[str]) -> str:
    """A markdown page: a one-line summary and the results table.

    Example::

        print(to_markdown(sweep, rows, columns(sweep)))
    """
    done = sum(r["status"] == "ok" for r in rows)
    failed = sum(r["status"] not in ("ok", "pending", "running") for r in rows)
    lines = [f"# Sweep {sweep.name}", "",
             f"{len(rows)} runs on {sweep.np} ranks: {done} ok, {failed} failed, "
             f"{len(rows) - done - failed} pending or running. speedup = baseline wall time per "
             f"step / the run's; comm_saving = baseline floats sent per step / the run's; "
             f"floats_vs_dense = share of dense traffic sent.", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        lines.append("| " + " | ".join(_md_cell(c, row.get(c)) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def write_results(sweep: Sweep, rows: Sequence[dict], sweep_dir: Path) -> None:
    """Write ``results.csv`` and ``results.md`` atomically into ``sweep_dir``."""
    cols = columns(sweep)
    atomic_write_text(sweep_dir / "results.csv", to_csv(rows, cols))
    atomic_write_text(sweep_dir / "results.md", to_markdown(sweep, rows, cols))


# -- launching ---------------------------------------------------------------------------------
def find_horovodrun(repo: Path = REPO) -> str | None:
    """``.venv/bin/horovodrun`` of the repository if present, else the one on PATH."""
    local = repo / ".venv" / "bin" / "horovodrun"
    return str(local) if local.is_file() else shutil.which("horovodrun")


def launch(command: list[str], log_path: Path, repo: Path = REPO) -> int:
    """Run ``command`` from the repository root, echoing its output to the console and to
    ``log_path``; returns the exit status (KeyboardInterrupt stops the job, then re-raises)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(command) + "\n")
        proc = subprocess.Popen(command, cwd=repo, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace")
        try:
            for line in proc.stdout or ():
                sys.stdout.write(line)
                log.write(line)
            return proc.wait()
        except KeyboardInterrupt:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise


def failure_note(log_path: Path, code: int) -> str:
    """A short reason for a failed run: the last error-looking line of its log."""
    try:
        lines = [ln.strip() for ln in log_path.read_text(errors="replace").splitlines()
                 if ln.strip()]
    except OSError:
        lines = []
    errors = [ln for ln in lines[1:] if "error" in ln.lower()]
    text = errors[-1] if errors else f"exit code {code}"
    return (text[:197] + "...") if len(text) > 200 else text


def report_available(repo: Path = REPO) -> str | None:
    """None if ``import gravac.report`` works in a fresh interpreter, else the reason."""
    proc = subprocess.run([sys.executable, "-c", "import gravac.report"], cwd=repo,
                          capture_output=True, text=True)
    if proc.returncode == 0:
        return None
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    return lines[-1] if lines else f"exit code {proc.returncode}"


def run_report(run_dirs: Sequence[Path], out_dir: Path, baseline: Path | None,
               repo: Path = REPO) -> bool:
    """``python -m gravac.report RUN_DIR... --out OUT [--baseline DIR]``; False if it failed
    (a missing gravac.report only skips the report, with a message, and counts as success)."""
    reason = report_available(repo)
    if reason is not None:
        print(f"skipping the report: `import gravac.report` failed ({reason})")
        return True
    command = [sys.executable, "-m", "gravac.report", *map(str, run_dirs), "--out", str(out_dir)]
    if baseline is not None:
        command += ["--baseline", str(baseline)]
    print("$ " + " ".join(command), flush=True)
    code = subprocess.run(command, cwd=repo).returncode
    if code != 0:
        print(f"the report failed (exit code {code}); the results table is still in "
              f"{out_dir.parent}")
    return code == 0


# -- command line ------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    def positive(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
        return value

    parser = argparse.ArgumentParser(
        prog="sweep.py", description="Run a grid of gravac trainings and tabulate the results.",
        epilog="Example: .venv/bin/python hvd_scripts/sweep.py configs/sweeps/demo_sweep.yaml\n"
               "The sweep file format is described in hvd_scripts/sweep.py's docstring.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep_file", metavar="SWEEP_FILE", help="the sweep's YAML file")
    parser.add_argument("--np", type=positive, default=None,
                        help="ranks per run (default: the file's np, else 2)")
    parser.add_argument("--dry-run", action="store_true",
                        help="only validate every run and print the expanded runs")
    parser.add_argument("--out", metavar="DIR", default=None,
                        help="sweep directory (default: <repo>/runs/sweeps/<name>)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE",
                        help="extra override for every run, e.g. --set data.root=/data; "
                             "repeatable; applied after the file's overrides")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace runs left in the sweep directory by an earlier sweep")
    return parser.parse_args(argv)


def cli_overrides(texts: Sequence[str], overwrite: bool) -> list[tuple[str, Any]]:
    """``--set KEY=VALUE`` texts as (key, YAML value) pairs (plus run.overwrite=true).

    Example::

        cli_overrides(["data.root=/data"], False)   # [('data.root', '/data')]
    """
    out = []
    for text in texts:
        key, sep, raw = text.partition("=")
        if not sep:
            raise SweepError(f"--set {text!r}: expected KEY=VALUE, e.g. data.root=/data")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        out.append((check_key(f"--set {text!r}", key.strip()), value))
    if overwrite:
        out.append(("run.overwrite", True))
    return out


def describe(sweep: Sweep, runs: Sequence[RunSpec], sweep_dir: Path,
             extra: Sequence[tuple[str, Any]], baselines: dict[str, str | None]) -> str:
    """The expanded runs, one block each, as printed before validating."""
    lines = [f"sweep {sweep.name}: {len(runs)} runs on {sweep.np} ranks each, results in "
             f"{sweep_dir}"]
    width = max(len(r.name) for r in runs)
    for k, run in enumerate(runs, 1):
        axes = "  ".join(f"{a}={v}" for a, v in run.labels.items())
        base = baselines.get(run.name)
        mark = "  (baseline)" if base == run.name else (f"  baseline: {base}" if base else "")
        lines.append(f"  {k:>2}. {run.name:<{width}}  {axes}{mark}")
        lines.append("      train.py " + " ".join(run.train_args(sweep_dir, extra)))
    return "\n".join(lines)


def execute(sweep: Sweep, runs: Sequence[RunSpec], sweep_dir: Path,
            extra: Sequence[tuple[str, Any]], baselines: dict[str, str | None],
            horovodrun: str) -> int:
    """Launch the runs one after another, keeping the results files current; exit status."""
    status = {r.name: "pending" for r in runs}
    notes: dict[str, str] = {}

    def save() -> None:
        write_results(sweep, results_rows(sweep, runs, sweep_dir, status, notes, baselines),
                      sweep_dir)

    if sweep.source is not None:
        atomic_write_text(sweep_dir / "sweep.yaml", sweep.source.read_text())
    save()
    for k, run in enumerate(runs, 1):
        command = [horovodrun, "-np", str(sweep.np), "-H", f"localhost:{sweep.np}", "--gloo",
                   sys.executable, "train.py", *run.train_args(sweep_dir, extra)]
        print(f"\n=== [{k}/{len(runs)}] {run.name} ===\n$ {' '.join(command)}", flush=True)
        log_path = sweep_dir / "logs" / f"{run.name}.log"
        status[run.name] = "running"
        save()
        try:
            code = launch(command, log_path)
        except KeyboardInterrupt:
            status[run.name], notes[run.name] = "interrupted", "stopped by Ctrl-C"
            save()
            print(f"\ninterrupted; partial results in {sweep_dir / 'results.md'}")
            return 130
        finished = summarize_metrics(read_metrics(sweep_dir / "runs" / run.name)).finished
        if code == 0 and finished:
            status[run.name] = "ok"
        else:
            status[run.name] = "failed"
            notes[run.name] = failure_note(log_path, code) if code else \
                "no run_end record in metrics.jsonl"
            print(f"=== {run.name} FAILED: {notes[run.name]} (log: {log_path}) ===", flush=True)
        save()
    ok = [r for r in runs if status[r.name] == "ok"]
    print(f"\nsweep {sweep.name}: {len(ok)} of {len(runs)} runs ok; results: "
          f"{sweep_dir / 'results.md'}, {sweep_dir / 'results.csv'}")
    report_ok = True
    if ok:
        base = baselines.get(runs[0].name)
        base_dir = sweep_dir / "runs" / base if base and status.get(base) == "ok" else None
        report_ok = run_report([sweep_dir / "runs" / r.name for r in ok], sweep_dir / "report",
                               base_dir)
    return 0 if len(ok) == len(runs) and report_ok else 1


def main(argv: Sequence[str] | None = None,
         check: Callable[[list[str]], str | None] = dry_run_check) -> int:
    """Command-line entry point; returns the exit status (see the module docstring)."""
    args = parse_args(argv)
    try:
        sweep = load_sweep(args.sweep_file)
        extra = cli_overrides(args.overrides, args.overwrite)
        if args.np is not None:
            sweep.np = args.np
        runs = expand(sweep)
    except SweepError as exc:
        print(f"sweep error: {exc}", file=sys.stderr)
        return 2
    sweep_dir = Path(args.out).expanduser().resolve() if args.out else \
        REPO / "runs" / "sweeps" / sweep.name
    horovodrun = find_horovodrun() or ""
    if not args.dry_run and not horovodrun:
        print("sweep error: horovodrun not found (neither .venv/bin/horovodrun nor on PATH); "
              "run hvd_scripts/install.sh", file=sys.stderr)
        return 2

    print(f"validating {len(runs)} runs of sweep {sweep.name} (resolve + train.py --dry-run)")
    configs, errors = validate(runs, sweep_dir, extra, check, existing_is_error=not args.dry_run)
    controllers = {name: cfg.compression.controller for name, cfg in configs.items()}
    baselines = pick_baselines(sweep, runs, controllers)
    print(describe(sweep, runs, sweep_dir, extra, baselines))
    if errors:
        for line in errors:
            print(f"sweep error: {line}", file=sys.stderr)
        print(f"sweep error: {len(errors)} problem(s) in {len(runs)} runs; nothing was "
              f"launched", file=sys.stderr)
        return 2
    if args.dry_run:
        print(f"all {len(runs)} runs are valid (dry run: nothing launched)")
        return 0
    return execute(sweep, runs, sweep_dir, extra, baselines, horovodrun)


if __name__ == "__main__":
    sys.exit(main())
