"""A sweep file: parsing, validation of its shape, expansion into runs, baselines.

The format is described in ``gravac/sweep/__init__.py``.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import yaml

from ..util import yaml_strict
from ..util.choices import did_you_mean
from .errors import SweepError
from .link import check_rate


#: The repository root: where train.py, configs/ and runs/ are.
REPO = Path(__file__).resolve().parents[2]

TOP_KEYS = ("name", "np", "configs", "set", "grid", "baseline", "link")
ENTRY_KEYS = ("files", "set", "tag")
# Keys the sweep chooses for every run: a sweep file may not set them.
RESERVED_KEYS = ("run.name", "run.output_dir")
FIXED_COLUMNS = ("name", "status", "steps", "wall_time_s", "metric", "final_metric",
                 "floats_vs_dense", "mean_samples_per_sec", "speedup", "comm_saving",
                 "baseline", "note")
MAX_NAME = 120
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")


# -- the sweep file ---------------------------------------------------------------------------
@dataclass(frozen=True)
class AxisValue:
    """One entry of a grid axis: config files and overrides, shown as ``label``."""

    label: str
    files: tuple[str, ...] = ()
    overrides: tuple[tuple[str, Any], ...] = ()
    #: What the axis's column of the results shows: the value of an axis over one key
    #: (``0`` for ``run.seed``), else the label (the label, ``seed_0``, names the run).
    cell: str = ""


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
    #: The link rate the runs cross (``link.py``), None for the plain loopback.
    link: str | None = None
    #: What they did cross, as ``link.link_plan`` says it (set when the sweep runs).
    link_description: str | None = None


@dataclass
class RunSpec:
    """One run of the sweep: its name, grid position and train.py arguments."""

    name: str
    index: tuple[int, ...]
    labels: dict[str, str]
    files: list[str]
    overrides: list[tuple[str, Any]] = field(default_factory=list)
    #: Axis name -> what its column shows (``AxisValue.cell``; the labels when not given).
    cells: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.cells = {axis: self.cells.get(axis) or label for axis, label in self.labels.items()}

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
        return AxisValue(label=_override_label([(axis, raw)]), overrides=((axis, raw),),
                         cell=_value_text(raw)), False
    if isinstance(raw, (str, list)):
        files = _file_list(where, raw, repo)
        return AxisValue(label="+".join(Path(f).stem for f in files), files=files), False
    if not isinstance(raw, dict):
        raise SweepError(f"{where}: expected a mapping with keys {', '.join(ENTRY_KEYS)} or a "
                         f"list of config files, got {raw!r} (for an axis over one key's "
                         f"values name the axis by the dotted key, e.g. optimizer.lr)")
    unknown = [k for k in raw if k not in ENTRY_KEYS]
    if unknown:
        raise SweepError(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(ENTRY_KEYS)}"
                         f"{did_you_mean(unknown[0], ENTRY_KEYS)}")
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
        # AxisValue(label='lr_0.05', files=(), overrides=(('optimizer.lr', 0.05),),
        #           cell='0.05')
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
        values.append(AxisValue(label=label, files=value.files, overrides=value.overrides,
                                cell=value.cell or label))
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
        from ..train.config import Config
        hint = did_you_mean(unknown[0], TOP_KEYS)
        # a train.py config given where the sweep file goes
        if unknown[0] in {f.name for f in dataclasses.fields(Config)}:
            hint = (f"; {unknown[0]!r} is a section of a train.py config: a sweep file "
                    "names such files under configs: and single keys under set:")
        raise SweepError(f"unknown top-level key {unknown[0]!r}; allowed: {', '.join(TOP_KEYS)}"
                         f"{hint}")
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
                 baseline=_baseline(data.get("baseline"), axes),
                 link=check_rate("link", data.get("link")))


def load_sweep(path: str | Path, repo: Path = REPO) -> Sweep:
    """Read and check a sweep file (a relative path not found from the current directory
    is looked up from the repository root).

    Example::

        sweep = load_sweep("configs/sweeps/demo_sweep.yaml")
    """
    path = Path(path).expanduser()
    if not path.is_file() and not path.is_absolute() and (repo / path).is_file():
        path = repo / path                 # e.g. configs/sweeps/x.yaml from elsewhere
    if path.is_dir():
        inside = sorted(str(p) for p in path.glob("*.yaml"))
        raise SweepError(f"sweep file {str(path)!r} is a folder; name one sweep file in it"
                         + (f", e.g. {inside[0]}" if inside else " (it holds no .yaml file)"))
    if not path.is_file():
        raise SweepError(f"sweep file {str(path)!r} not found (looked in the current "
                         f"directory and in {repo})")
    try:
        data = yaml_strict.load(path.read_text())
    except yaml.YAMLError as exc:
        raise SweepError(f"sweep file {yaml_strict.error_where(path, exc)}: not valid YAML: "
                         f"{yaml_strict.problem(exc)}") from None
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
                            files=files, overrides=overrides,
                            cells={a.name: v.cell for a, v in zip(sweep.axes, values)}))
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
