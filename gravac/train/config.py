"""Experiment configuration: typed, validated, composable YAML.

A run is described by one or more YAML files (later files override earlier ones, key by
key) and ``--set key.path=value`` overrides (values parsed as YAML scalars, never with
``eval``). The result is checked against the dataclasses below before any work starts:
an unknown key, a wrong type or a value out of range raises ``ConfigError`` with one
line naming the key, the value and what is allowed. Every controller's section
(``compression.gravac``, ``.accordion``, ``.auto``) is checked, the ones of controllers not
in use too.

Example::

    cfg = load_config(["configs/demo.yaml", "configs/compression/gravac_exp_topk.yaml"],
                      ["run.steps=200", "compression.gravac.window=50"])
    cfg.compression.gravac.window     # 50
    to_dict(cfg)                      # the resolved config, as saved with the run
"""
from __future__ import annotations

import dataclasses
import inspect
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..comm.horovod_cycle import PROBLEM as CYCLE_PROBLEM
from ..comm.horovod_cycle import check_setting as check_cycle_setting
from ..controllers import Accordion, Auto, GraVAC, Method, Static
from ..engine.options import GravacOptions, OptionError
from ..util import yaml_strict
from ..util.choices import closest, one_of

CONTROLLERS = ("dense", "static", "gravac", "accordion", "auto")
#: How gravac's compression runs: its distributed optimizer, or a DDP communication hook.
FRONT_ENDS = ("optimizer", "ddp_hook")
DATASETS = ("digits", "cifar10", "cifar100", "ptb", "synthetic_images", "synthetic_text")
OPTIMIZERS = ("sgd",)
# auto: a tqdm bar on a terminal, else plain lines; always: the bar; plain: the lines
PROGRESS = ("auto", "always", "plain", "never")
#: ``run.device`` (gravac/train/device.py).
DEVICES = ("auto", "cpu", "cuda")


class ConfigError(ValueError):
    """A configuration problem, phrased as one line: key, value, what is allowed."""


@dataclass
class RunConfig:
    # Formatted with {model}, {data}, {controller}, {compressor} and {tag}, so composed
    # files (a model file + a compression file) give each combination its own directory.
    name: str = "{model}-{data}-{tag}"
    # Free text for {tag} in run.name (a sweep sets it to its run's label).
    tag: str = ""
    # The folder of the run folders: a run writes output_dir/name.
    output_dir: str = "runs"
    # Seed of the model's initial weights (rank 0's, broadcast), the data order and the
    # augmentation (each rank's derived from it).
    seed: int = 0
    # Length of the run: set exactly one of steps and epochs.
    steps: int | None = None
    # Length of the run in passes over the training data (each rank its shard).
    epochs: int | None = None
    # Steps between two evaluations during the run (0: only the final one).
    eval_interval: int = 0
    # Batches of each rank's evaluation shard an evaluation reads (null: all of them).
    eval_batches: int | None = None
    # Steps between two checkpoints (0: only at the end; a signal also writes one).
    checkpoint_interval: int = 0
    # Checkpoints kept in output_dir/name/checkpoints (older ones are removed).
    keep_checkpoints: int = 2
    # Steps between two records in metrics.jsonl and TensorBoard (the first and the last
    # step are always recorded).
    log_interval: int = 10
    # Every rank also writes its own step timings to ranks/rank{r}.jsonl (metrics.jsonl has
    # rank 0's): how the ranks differ, for benchmarks/step_profile.py --all-ranks.
    rank_phases: bool = False
    # Progress on rank 0: "auto" (a bar on a terminal, plain lines in a log), "always"
    # (the bar), "plain" (the lines), "never".
    progress: str = "auto"
    # Replace what a previous run left in the run folder (else the run refuses to start;
    # --resume continues it instead).
    overwrite: bool = False
    # torch threads per rank (null: the host's cores divided among its ranks).
    threads: int | None = None
    # Keep freed memory for reuse instead of returning it to the kernel each step (glibc
    # mallopt; gravac/util/malloc.py): fresh pages cost page faults in every step.
    keep_freed_memory: bool = True
    # Horovod's background cycle in ms (gravac/comm/horovod_cycle.py): "auto" makes it 5 ms
    # where a host's ranks cannot each have 2 cores (the 1 ms default then steals CPU from
    # compute: docs/notes/2026-11-benchmarks.md §4), a number sets it, "horovod" leaves Horovod's.
    horovod_cycle_time_ms: float | str = "auto"
    # How a rank waits for its Horovod collectives (gravac/comm/horovod.py): "sleep" polls
    # and sleeps (a waiting rank leaves its core to the others: with more ranks than cores
    # Horovod's own yield loop took a core per waiting rank, docs/notes/2026-11-benchmarks.md §6),
    # "spin" waits in Horovod's loop, "auto" sleeps where a machine's ranks outnumber its
    # cores and spins elsewhere.
    horovod_wait: str = "auto"
    # At the end, rank 0 writes report.md (tables and plots of the run) into the run folder.
    report: bool = True
    # The stall watchdog's floor, seconds: a rank gives up (a peer died or hangs) when a step,
    # an evaluation or a checkpoint takes 10x the slowest of its kind so far, never sooner
    # than this; the first of each kind (start-up, compilation) gets 10x this. 0: off.
    stall_timeout: float = 60.0
    # At most this many steps between two checks whether a rank got SIGINT/SIGTERM (a tiny
    # allreduce each: ~1.2 ms under Horovod); checks come about once a second of training,
    # every step when steps take a second or more.
    stop_check_interval: int = 10
    # Horovod Elastic (horovodrun --min-np/--max-np --host-discovery-script): ranks may
    # leave and join; the state is committed in memory every elastic_commit_interval steps.
    elastic: bool = False
    # Steps between two in-memory commits of the training state under run.elastic (a
    # reset rolls back to the last one).
    elastic_commit_interval: int = 10
    # Transport: "auto" (whichever launched this process: torchrun -> torch, else
    # horovod), "horovod", "torch" (torch.distributed: gloo on CPU, nccl on GPU) or "local"
    # (one process, no launcher, nothing communicated: DDP's options are not used; how a
    # torchrun-only config is dry-run in one process).
    backend: str = "auto"
    # Where each rank trains (gravac/train/device.py): "cuda" (the GPU of the rank's local
    # rank), "cpu", or "auto" (a GPU when this process sees one and the transport can move
    # GPU tensors, else the CPU).
    device: str = "auto"
    # --resume refuses config changes outside gravac/train/resume.py's MAY_CHANGE unless
    # named here (dotted keys or sections, e.g. [optimizer.lr]) or "all".
    resume_allow_changes: list[str] | str = field(default_factory=list)


@dataclass
class ModelConfig:
    # A model of gravac.models (MODEL_NAMES): small_cnn, wide_head_cnn, resnet18, resnet50,
    # resnet101, resnet101_paper, vgg16, vgg16_paper, lstm, lstm_paper.
    name: str = "small_cnn"
    # Keyword options of the model's constructor (e.g. {embedding_dim: 650} for lstm);
    # num_classes and the input channels come from the data.
    options: dict = field(default_factory=dict)


@dataclass
class DataConfig:
    # digits (scikit-learn's, embedded), cifar10, cifar100, ptb (files under data.root),
    # synthetic_images, synthetic_text (generated, no files).
    name: str = "digits"
    # The folder of the data set's files (cifar10, cifar100, ptb); never downloaded.
    root: str | None = None
    # Samples per rank per step (the global batch is this times the number of ranks).
    batch_size: int = 32
    # Samples per rank per evaluation batch.
    eval_batch_size: int = 256
    # Random crops and flips of the training images (CIFAR; digits: small shifts).
    augment: bool = True
    # Tokens per sequence of the language models (truncated backpropagation through time).
    bptt: int = 35
    # Options of the data set (synthetic sizes, e.g. {num_train: 4096}); unknown ones are
    # refused in one line listing the known.
    options: dict = field(default_factory=dict)


#: optimizer.implementation values (see OptimizerConfig).
OPTIMIZER_IMPLEMENTATIONS = ("auto", "fused", "foreach", "loop")


@dataclass
class OptimizerConfig:
    # The optimizer: sgd (torch.optim.SGD).
    name: str = "sgd"
    # Learning rate (of the global batch: scale it with the number of ranks yourself).
    lr: float = 0.1
    # SGD's momentum.
    momentum: float = 0.9
    # SGD's weight decay (L2).
    weight_decay: float = 0.0
    # Nesterov momentum.
    nesterov: bool = False
    # Steps at which the learning rate is multiplied by lr_gamma (MultiStepLR).
    lr_milestones: list[int] = field(default_factory=list)
    # The factor of each lr_milestones step.
    lr_gamma: float = 0.1
    # Steps of linear learning-rate warm-up (torchvision's --lr-warmup-epochs, counted in
    # iterations): the rate rises from lr_warmup_start x lr to lr. 0: none.
    lr_warmup_steps: int = 0
    # The warm-up's first fraction of lr (torchvision's --lr-warmup-decay).
    lr_warmup_start: float = 0.01
    # Clip the averaged gradients to this global norm before the update (null: no clipping).
    grad_clip: float | None = None
    # How torch runs the update: "fused" (one kernel per tensor: ~4x faster than the
    # per-tensor loop on CPU; the same update up to rounding in the last bit), "foreach",
    # "loop" (torch's CPU default), or "auto" (fused where torch supports it).
    implementation: str = "auto"


def options_of(component: type, name: str) -> type:
    """A config section whose keys are ``component``'s constructor options, with the types
    and defaults of its signature: the component owns its options, their defaults and
    their range checks (its constructor raises ValueError; ``validate`` names the key).

    Example::

        GraVACConfig = options_of(GraVAC, "GraVACConfig")
        GraVACConfig().window          # 500, GraVAC's own default
    """
    hints = typing.get_type_hints(component.__init__)
    fields = []
    for p in inspect.signature(component.__init__).parameters.values():
        if p.name == "self":
            continue
        if p.default is inspect.Parameter.empty:
            raise TypeError(f"{component.__name__}.{p.name} has no default: a config section "
                            "needs one for every option")
        fields.append((p.name, hints[p.name], field(default=p.default)))
    return dataclasses.make_dataclass(name, fields)


GraVACConfig = options_of(GraVAC, "GraVACConfig")
AccordionConfig = options_of(Accordion, "AccordionConfig")
AutoConfig = options_of(Auto, "AutoConfig")


#: The engine's options a config sets (``GravacOptions.config_fields``): their types,
#: defaults and rules are the engine's, written once in gravac/engine/options.py.
EngineOptionsConfig = dataclasses.make_dataclass("EngineOptionsConfig", [
    (f.name, typing.get_type_hints(GravacOptions)[f.name],
     field(default=f.default, metadata=f.metadata)) for f in GravacOptions.config_fields()])


@dataclass
class CompressionConfig(EngineOptionsConfig):
    # What decides the compression: "dense" (no compression: Horovod's optimizer, or DDP
    # under torchrun), "static" (compression.cf or compression.rank), "gravac", "accordion",
    # "auto" (a measured choice among methods: compression.auto).
    controller: str = "static"
    # topk, dgc, redsync, randomk (sparsifiers), powersgd (low rank) or none.
    compressor: str = "topk"
    # Keyword options of the compressor (e.g. {sample_fraction: 0.01} for dgc).
    compressor_options: dict = field(default_factory=dict)
    # The static controller's compression factor (100 keeps 1% of each compressed layer).
    cf: float = inspect.signature(Static).parameters["cf"].default
    # PowerSGD only: every compressed layer at this rank instead of compression.cf (Static).
    rank: int | None = inspect.signature(Static).parameters["rank"].default
    # Dense on torch.distributed is PyTorch DDP: with ddp_powersgd_rank, DDP's own PowerSGD
    # hook at that rank (what a torchrun user would pick instead of gravac), plain
    # allreduce for the first ddp_start_powersgd_iter steps (PyTorch's default: 1000).
    ddp_powersgd_rank: int | None = None
    # With ddp_powersgd_rank: the steps of plain allreduce before DDP's PowerSGD starts.
    ddp_start_powersgd_iter: int = 1000
    # How gravac runs (controllers other than dense): "optimizer", its distributed
    # optimizer; "ddp_hook", PyTorch DDP with gravac's communication hook
    # (gravac/torch/hooks.py; torchrun only), DDP's buckets cut at bucket_cap_mb with
    # overlap, one bucket without.
    front_end: str = "optimizer"
    gravac: GraVACConfig = field(default_factory=GraVACConfig)
    accordion: AccordionConfig = field(default_factory=AccordionConfig)
    auto: AutoConfig = field(default_factory=AutoConfig)


#: Keys that were renamed: the unknown-key error names the new one.
RENAMED = {"compression.horovod_compression": "compression.dense_wire (native or fp16)"}


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    compression: CompressionConfig = field(default_factory=CompressionConfig)


# -- loading and merging -------------------------------------------------------------------
def deep_merge(base: dict, override: dict) -> dict:
    """``override`` on top of ``base``, recursively for nested dicts (new dict)."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def read_yaml(path: str | Path) -> dict:
    path = Path(path).expanduser()
    if path.is_dir():
        raise ConfigError(f"config file {str(path)!r} is a folder; name the YAML files in "
                          f"it, e.g. {str(path / '*.yaml')!r}")
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} not found")
    try:
        data = yaml_strict.load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{yaml_strict.error_where(path, exc)}: not valid YAML: "
                          f"{yaml_strict.problem(exc)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of sections "
                          f"(run, model, data, optimizer, compression), got {type(data).__name__}")
    return data


def parse_override(text: str) -> dict:
    """``"a.b.c=value"`` as ``{"a": {"b": {"c": value}}}``; the value is a YAML scalar/list."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE, e.g. run.steps=100")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set {text!r}: the key must be a dotted path like optimizer.lr")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    nested: Any = value
    for part in reversed(key.split(".")):
        nested = {part: nested}
    return nested


def load_config(files: list[str | Path], overrides: list[str] = ()) -> Config:
    """Merge the YAML files and ``--set`` overrides, then type-check and validate."""
    data: dict = {}
    for f in files:
        data = deep_merge(data, read_yaml(f))
    for text in overrides:
        data = deep_merge(data, parse_override(text))
    cfg = from_dict(Config, data)
    # "~/runs" in a file or a --set is not expanded by the shell
    cfg.run.output_dir = os.path.expanduser(cfg.run.output_dir)
    if cfg.data.root:
        cfg.data.root = os.path.expanduser(cfg.data.root)
    resolve_name(cfg)
    validate(cfg)
    return cfg


def resolve_name(cfg: Config) -> None:
    """Fill the placeholders of ``run.name`` (the tag defaults to the controller)."""
    c = cfg.compression
    fields = {"model": cfg.model.name, "data": cfg.data.name, "controller": c.controller,
              "compressor": c.compressor, "tag": cfg.run.tag or c.controller}
    try:
        cfg.run.name = cfg.run.name.format(**fields)
    except (KeyError, IndexError, ValueError):
        raise ConfigError(f"run.name={cfg.run.name!r}: placeholders may only be "
                          f"{', '.join('{' + k + '}' for k in fields)}") from None


# -- typing ---------------------------------------------------------------------------------
def _type_name(tp) -> str:
    if tp is type(None):
        return "null"
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if origin is typing.Literal:
        return "one of " + ", ".join(map(str, typing.get_args(tp)))
    return {int: "an int", float: "a number", str: "a string", bool: "true/false",
            dict: "a mapping"}.get(tp, getattr(tp, "__name__", str(tp)))


def _coerce(tp, value, key: str):
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        choices = typing.get_args(tp)
        if value in choices and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}={value!r}: {one_of(value, choices)}")
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, key)
            except ConfigError:
                continue
        raise ConfigError(f"{key}={value!r}: expected {_type_name(tp)}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}={value!r}: expected a mapping with keys "
                              f"{', '.join(f.name for f in dataclasses.fields(tp))}")
        return from_dict(tp, value, key)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}={value!r}: expected {_type_name(tp)}")
        (inner,) = typing.get_args(tp)
        return [_coerce(inner, v, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):     # YAML reads 1e-4 as a string (no dot)
            try:
                number = float(value)
            except ValueError:
                pass
        if number is not None:
            if not math.isfinite(number):   # YAML's .inf / .nan, or "inf" / "nan"
                raise ConfigError(f"{key}={value!r}: must be a finite number")
            return number
    elif tp is str:
        if isinstance(value, str):
            return value
    elif tp is dict:
        if isinstance(value, dict):
            return dict(value)
    raise ConfigError(f"{key}={value!r}: expected {_type_name(tp)}, got {type(value).__name__}")


def from_dict(cls, data: dict, prefix: str = ""):
    """Build dataclass ``cls`` from ``data``; unknown keys and wrong types are errors."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            where = f"{prefix}." if prefix else ""
            if f"{where}{key}" in RENAMED:
                raise ConfigError(f"unknown key '{where}{key}': it is now "
                                  f"{RENAMED[where + key]}")
            raise ConfigError(f"unknown key '{where}{key}'{_key_hint(key, names, where)}; "
                              f"known keys{' of ' + prefix if prefix else ''}: {', '.join(names)}")
    kwargs = {}
    for name in names:
        if name in data:
            kwargs[name] = _coerce(hints[name], data[name], f"{prefix}.{name}" if prefix else name)
    return cls(**kwargs)


def _dotted_keys(cls, prefix: str = "") -> list[str]:
    """Every key of dataclass ``cls`` and of the sections it nests, dotted from ``prefix``."""
    keys = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        keys.append(key)
        tp = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            keys += _dotted_keys(tp, f"{key}.")
    return keys


def _key_hint(key: str, names: list[str], where: str) -> str:
    """ " (did you mean ...?)" for an unknown ``key`` among the keys ``names`` of the section
    ``where``: a near miss of one of them (``run.step``), else the same key in the section it
    belongs to (``cf`` at the top, ``compression.window`` for compression.gravac.window)."""
    sibling = closest(key, names)
    if sibling is not None:
        return f" (did you mean {where}{sibling}?)"
    elsewhere = [k for k in _dotted_keys(Config) if k.rsplit(".", 1)[-1] == key]
    return f" (did you mean {' or '.join(elsewhere)}?)" if elsewhere else ""


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


def dump_yaml(cfg) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=False)


# -- validation -----------------------------------------------------------------------------
def _shown(value) -> str:
    """A value as a config file writes it (true, null), else as Python shows it."""
    return "true" if value is True else "false" if value is False else \
        "null" if value is None else repr(value)


def _require(ok: bool, key: str, value, allowed: str):
    if not ok:
        raise ConfigError(f"{key}={_shown(value)}: {allowed}")


def _require_choice(key: str, value, choices) -> None:
    """``value`` is one of the names ``choices``; else the refusal names the near miss."""
    _require(value in choices, key, value, one_of(value, choices))


def validate(cfg: Config) -> None:
    """Range and consistency checks that types alone cannot express."""
    r, d, o, c = cfg.run, cfg.data, cfg.optimizer, cfg.compression
    # The run folder is output_dir/name, which run.overwrite clears: a name that leaves
    # output_dir ("..", or "." for output_dir itself) would clear another folder.
    _require(bool(r.name) and "/" not in r.name and r.name not in (".", ".."), "run.name",
             r.name, "must be a folder name inside run.output_dir: non-empty, without '/', "
             "not '.' or '..'")
    _require((r.steps is None) != (r.epochs is None), "run.steps", r.steps,
             f"set exactly one of run.steps and run.epochs (run.epochs={_shown(r.epochs)})")
    for key, value in (("run.steps", r.steps), ("run.epochs", r.epochs)):
        _require(value is None or value >= 1, key, value, "must be >= 1")
    for key, value in (("run.eval_interval", r.eval_interval),
                       ("run.checkpoint_interval", r.checkpoint_interval)):
        _require(value >= 0, key, value, "must be >= 0 (steps; 0 = only at the end)")
    _require(r.eval_batches is None or r.eval_batches >= 1, "run.eval_batches", r.eval_batches,
             "must be >= 1, or null for the whole evaluation set")
    _require(r.keep_checkpoints >= 1, "run.keep_checkpoints", r.keep_checkpoints, "must be >= 1")
    _require(r.log_interval >= 1, "run.log_interval", r.log_interval, "must be >= 1")
    _require_choice("run.progress", r.progress, PROGRESS)
    _require(r.threads is None or r.threads >= 1, "run.threads", r.threads, "must be >= 1 or null")
    try:
        check_cycle_setting(r.horovod_cycle_time_ms)
    except ValueError:
        raise ConfigError(f"run.horovod_cycle_time_ms={r.horovod_cycle_time_ms!r}: "
                          f"{CYCLE_PROBLEM}") from None
    from ..comm import HOROVOD_WAITS
    _require_choice("run.horovod_wait", r.horovod_wait, HOROVOD_WAITS)
    _require(r.stall_timeout >= 0, "run.stall_timeout", r.stall_timeout,
             "must be >= 0 seconds (0 turns the stall watchdog off)")
    _require(r.stop_check_interval >= 1, "run.stop_check_interval", r.stop_check_interval,
             "must be >= 1 (steps between two checks for SIGINT/SIGTERM)")
    _require(r.elastic_commit_interval >= 1, "run.elastic_commit_interval",
             r.elastic_commit_interval, "must be >= 1 (steps between in-memory commits)")
    _check_output_path(r)
    from .resume import unknown_allowed
    unknown = unknown_allowed(r.resume_allow_changes, to_dict(Config()))
    _require(not unknown, "run.resume_allow_changes", r.resume_allow_changes,
             f"names no config key: {', '.join(unknown)} (dotted keys or sections such as "
             "optimizer.lr or compression, or all)")
    from ..comm import BACKENDS
    _require_choice("run.backend", r.backend, BACKENDS)
    _require(not (r.elastic and r.backend in ("torch", "local")), "run.backend", r.backend,
             "cannot be combined with run.elastic=true: Horovod Elastic is Horovod-only; use "
             "run.backend=horovod (or auto under horovodrun) or drop run.elastic")

    _require_choice("run.device", r.device, DEVICES)

    from ..models import LANGUAGE_MODELS, MODEL_NAMES
    _require_choice("model.name", cfg.model.name, MODEL_NAMES)
    _require_choice("data.name", d.name, DATASETS)
    lm_model, lm_data = cfg.model.name in LANGUAGE_MODELS, d.name in ("ptb", "synthetic_text")
    _require(lm_model == lm_data, "model.name", cfg.model.name,
             f"does not fit data.name={d.name!r}: the language models "
             f"({', '.join(LANGUAGE_MODELS)}) need ptb or synthetic_text data, image models "
             "need image data")
    _require(d.name not in ("cifar10", "cifar100", "ptb") or bool(d.root), "data.root", d.root,
             f"must point at the folder holding the {d.name} files")
    _require(d.batch_size >= 1, "data.batch_size", d.batch_size, "must be >= 1 (per rank)")
    _require(d.eval_batch_size >= 1, "data.eval_batch_size", d.eval_batch_size, "must be >= 1")
    _require(d.bptt >= 1, "data.bptt", d.bptt, "must be >= 1")

    _require_choice("optimizer.name", o.name, OPTIMIZERS)
    _require(o.lr > 0, "optimizer.lr", o.lr, "must be > 0")
    _require(0 <= o.momentum < 1, "optimizer.momentum", o.momentum, "must be in [0, 1)")
    _require(o.weight_decay >= 0, "optimizer.weight_decay", o.weight_decay, "must be >= 0")
    _require(not o.nesterov or o.momentum > 0, "optimizer.nesterov", o.nesterov,
             "needs optimizer.momentum > 0")
    _require(all(m >= 1 for m in o.lr_milestones) and o.lr_milestones == sorted(set(o.lr_milestones)),
             "optimizer.lr_milestones", o.lr_milestones, "must be increasing iteration numbers >= 1")
    _require(0 < o.lr_gamma <= 1, "optimizer.lr_gamma", o.lr_gamma, "must be in (0, 1]")
    _require(o.lr_warmup_steps >= 0, "optimizer.lr_warmup_steps", o.lr_warmup_steps,
             "must be >= 0 (0: no warm-up)")
    _require(0 < o.lr_warmup_start <= 1, "optimizer.lr_warmup_start", o.lr_warmup_start,
             "must be in (0, 1]")
    _require_choice("optimizer.implementation", o.implementation, OPTIMIZER_IMPLEMENTATIONS)
    _require(o.grad_clip is None or o.grad_clip > 0, "optimizer.grad_clip", o.grad_clip,
             "must be > 0 or null")

    _require_choice("compression.controller", c.controller, CONTROLLERS)
    _require(c.ddp_powersgd_rank is None or c.ddp_powersgd_rank >= 1,
             "compression.ddp_powersgd_rank", c.ddp_powersgd_rank, "must be >= 1 or null")
    _require(c.ddp_powersgd_rank is None or c.controller == "dense",
             "compression.ddp_powersgd_rank", c.ddp_powersgd_rank,
             "is PyTorch DDP's PowerSGD hook: it needs compression.controller=dense (for "
             "gravac's own PowerSGD use compressor: powersgd)")
    _require(c.ddp_powersgd_rank is None or c.dense_wire == "native",
             "compression.ddp_powersgd_rank", c.ddp_powersgd_rank,
             "and dense_wire=fp16 are two DDP hooks; DDP takes one")
    _require_choice("compression.front_end", c.front_end, FRONT_ENDS)
    _require(c.front_end == "optimizer" or c.controller != "dense", "compression.front_end",
             c.front_end, "runs gravac's compression: with controller dense the run is plain "
                          "DDP already; pick a controller or front_end: optimizer")
    _require(c.ddp_start_powersgd_iter >= 2, "compression.ddp_start_powersgd_iter",
             c.ddp_start_powersgd_iter, "must be >= 2 (PyTorch's hook starts after DDP's "
             "first two iterations)")
    from .. import compressors
    # Before any rule below compares the name: the registry's lookup ignores case, the
    # rules do not ("PowerSGD" passed them as a sparsifier, then failed in the engine).
    _require_choice("compression.compressor", c.compressor, compressors.REGISTRY)
    if r.backend == "horovod":
        refuse_ddp_only(c, "horovod")
    try:
        auto = build_controller(c) if c.controller == "auto" else None
    except ValueError:
        auto = None                     # reported below, with its key
    try:
        options = engine_options(cfg)
        options.check() if c.controller == "dense" else options.check_with(
            _compressor_kind(c.compressor), auto)
    except OptionError as exc:
        _require(False, f"compression.{exc.name}", exc.value, exc.allowed)
    except ValueError as exc:
        raise ConfigError(f"compression.{exc}") from None
    _require(not c.overlap or c.controller != "dense", "compression.overlap", c.overlap,
             "applies to gravac's optimizer; controller=dense is plain Horovod or DDP, which "
             "overlap already (for gravac's dense path use controller: static with cf: 1)")
    _require(c.exchange == "allgather" or c.controller != "dense", "compression.exchange",
             c.exchange, "moves sparse selections: it needs a controller other than dense "
             "(dense travels by allreduce already: use exchange: allgather)")
    if r.elastic and "hierarchical" in exchanges_named(c):
        why = "its host groups are Horovod process sets, which elastic resets do not rebuild"
        _require(c.exchange != "hierarchical", "compression.exchange", c.exchange,
                 f"cannot be combined with run.elastic=true: {why}; use exchange: allgather "
                 "or shared_index with elastic runs")
        _require(False, "compression.auto.methods", c.auto.methods,
                 f"cannot name @hierarchical with run.elastic=true: {why}; name another "
                 "exchange")
    _require(c.controller == "dense" or c.compressor != "none", "compression.compressor",
             c.compressor, f"compression.controller={c.controller} needs a sparsifier "
             "(topk, dgc, redsync or randomk) or powersgd; for no compression use "
             "compression.controller=dense")
    # Ranks (PowerSGD's own knob): compression.rank for static, low_rank/high_rank for
    # accordion; a CF maps to a different rank per layer shape, a rank is what users state.
    a = c.accordion
    for key, value, controller in (("compression.rank", c.rank, "static"),
                                   ("compression.accordion.low_rank", a.low_rank, "accordion"),
                                   ("compression.accordion.high_rank", a.high_rank, "accordion")):
        if value is None:
            continue
        _require(c.compressor == "powersgd", key, value,
                 f"PowerSGD ranks need compression.compressor=powersgd (got "
                 f"{c.compressor!r}; sparsifiers take CFs)")
        _require(c.controller == controller, key, value,
                 f"applies to compression.controller={controller} (got {c.controller!r})")
    if c.controller != "dense":
        try:        # the name is known by now: what is wrong is an option
            compressors.get(c.compressor, **c.compressor_options)
        except ValueError as exc:
            raise ConfigError(f"compression.compressor_options={c.compressor_options!r} "
                              f"(compressor {c.compressor}): {exc}") from None
        try:
            build_controller(c)
        except ValueError as exc:
            raise ConfigError(_config_key_error(c.controller, str(exc))) from None
    # The sections of the controllers not in use are checked too: a sweep axis or a --set
    # of compression.controller turns them on, and a bad value found then wastes the runs
    # before it.
    for name in CONTROLLER_SECTIONS:
        if name != c.controller:
            try:
                _section_controller(c, name)
            except ValueError as exc:
                raise ConfigError(_config_key_error(name, str(exc))) from None


def engine_options(cfg: Config, **front_end) -> GravacOptions:
    """The engine's options of ``cfg.compression`` (``GravacOptions``), with the front
    end's own (``batch_size``, ...) given here.

    Example::

        opt = wrap_optimizer(sgd, named, comm, **dataclasses.asdict(engine_options(cfg)))
    """
    c = cfg.compression
    return GravacOptions(**{f.name: getattr(c, f.name) for f in GravacOptions.config_fields()},
                         **front_end)


def _compressor_kind(name: str):
    """The compressor class named ``name`` (its kind: dense, low rank or a sparsifier),
    for the option rules (the name is checked before)."""
    from .. import compressors
    return compressors.REGISTRY[name]


def _ddp_only(c: CompressionConfig) -> tuple[str, str] | None:
    """The first option set in ``c`` that only PyTorch DDP has (torchrun), as ("key=value",
    what to use instead), or None."""
    if c.ddp_powersgd_rank is not None:
        return (f"compression.ddp_powersgd_rank={c.ddp_powersgd_rank}",
                "with horovodrun use compressor: powersgd "
                "(configs/compression/static_powersgd_rank4.yaml)")
    if c.front_end == "ddp_hook":
        return "compression.front_end='ddp_hook'", "use front_end: optimizer"
    return None


def refuse_ddp_only(c: CompressionConfig, transport: str, hint: str = "") -> None:
    """``ConfigError`` where ``c`` asks for PyTorch DDP (its PowerSGD hook, gravac's DDP
    hook) and the run's transport is ``transport`` (``"horovod"``): under horovodrun the
    hook would not exist. The one-process ``local`` transport communicates nothing and is
    not refused: it is how such a config is dry-run without torchrun."""
    found = _ddp_only(c)
    if found is not None and transport == "horovod":
        key, instead = found
        raise ConfigError(f"{key}: PyTorch DDP runs on torch.distributed (torchrun, "
                          f"run.backend=torch), not {transport}; {instead}{hint}")


def _check_output_path(r: RunConfig) -> None:
    """The run folder (output_dir/name) must be creatable: no file where it or a parent
    folder goes, and the nearest existing folder writable."""
    run_dir = Path(r.output_dir) / r.name
    for path in [run_dir, *run_dir.parents]:
        if path.exists():
            if not path.is_dir():
                raise ConfigError(f"run.output_dir={r.output_dir!r}: {str(path)!r} is a file, "
                                  "not a folder; move it away or set run.output_dir / "
                                  "run.name to another place")
            if not os.access(path, os.W_OK | os.X_OK):
                raise ConfigError(f"run.output_dir={r.output_dir!r}: {str(path)!r} is not "
                                  "writable; set run.output_dir to a folder you can write")
            return


def check_launcher(cfg: Config, environ=None, launcher: str | None = None,
                   starts: bool = False) -> None:
    """Refuse a ``run.backend`` other than the launcher's (``ConfigError``): under torchrun,
    ``run.backend=horovod`` (or ``local``) makes every worker a 1-rank job of its own, all
    writing one run folder, and the other way round alike; and PyTorch DDP's options where
    the transport will be Horovod's. The launcher is ``launcher`` (its command,
    ``"horovodrun"`` or ``"torchrun"``: the one that will start the job, for ``train.py
    --check``), else the one that started this process (``environ``, default this
    process's: ``gravac.comm.launched_by``); without one every backend may be asked for,
    except, where this process ``starts`` the transport itself (train.py without --check),
    ``torch`` without the rendezvous that torchrun gives: it would fail in a traceback."""
    from ..comm import LAUNCHERS, launched_by, torch_launch_problem

    backend = cfg.run.backend
    launcher = {name: b for b, name in LAUNCHERS.items()}[launcher] if launcher \
        else launched_by(environ)
    if backend == "auto":       # a backend named outright: validate() refused it already
        refuse_ddp_only(cfg.compression, launcher)
    problem = starts and backend == "torch" and torch_launch_problem(environ)
    if problem:
        raise ConfigError(f"run.backend='torch' {problem}, or run.backend=local for one "
                          "process without a launcher (a dry run included)")
    if launcher is None or backend in ("auto", launcher):
        return
    other = f"launch with {LAUNCHERS[backend]}" if backend in LAUNCHERS else \
        "run train.py without a launcher"
    raise ConfigError(f"run.backend={backend!r} does not match {LAUNCHERS[launcher]}, which "
                      f"started this process (each of its ranks would run a job of its own "
                      f"in the same run folder); drop run.backend (auto follows the "
                      f"launcher), set run.backend={launcher}, or {other}")


def _config_key_error(controller: str, message: str) -> str:
    """A controller's "GraVAC(window=0): window must be ..." as the config key it came from:
    "compression.gravac.window=0: window must be ..." (static: "compression.cf=...")."""
    match = re.match(r"^\w+\((\w+)=(.*?)\): (.*)$", message, re.S)
    if match is None:
        return f"compression.{controller}: {message}"
    option, value, why = match.groups()
    key = f"compression.{option}" if controller == "static" else \
        f"compression.{controller}.{option}"
    return f"{key}={value}: {why}"


def exchanges_named(c: CompressionConfig) -> set[str]:
    """The exchanges a run may build: ``compression.exchange``, and those that
    ``compression.auto.methods`` name (``sparse:<cf>@<exchange>``), built at the method's
    first step (a method that does not parse names none: validate reports it)."""
    named = {c.exchange}
    if c.controller == "auto":
        for text in c.auto.methods or ():
            try:
                exchange = Method.parse(text).exchange
            except (ValueError, TypeError):
                continue
            if exchange is not None:
                named.add(exchange)
    return named


def build_controller(c: CompressionConfig):
    """The controller described by ``compression`` (None for plain Horovod ``dense``)."""
    if c.controller == "dense":
        return None
    if c.controller == "static":
        return Static(cf=c.cf, rank=c.rank)
    return _section_controller(c, c.controller)


#: The controllers configured by a section of their own (``compression.<name>``).
CONTROLLER_SECTIONS = {"gravac": GraVAC, "accordion": Accordion, "auto": Auto}


def _section_controller(c: CompressionConfig, name: str):
    """The controller of section ``compression.<name>`` (``CONTROLLER_SECTIONS``)."""
    return CONTROLLER_SECTIONS[name](**dataclasses.asdict(getattr(c, name)))
