"""What ``--resume`` may change: the run's resolved config against the one it started with.

A resumed run continues the same experiment: its model, data, optimizer and compression
must be those the checkpoint was written with, or the checkpoint does not fit (another
model: a size mismatch) or the run silently becomes another experiment under the old name
(another compressor: the report still says the old one). Fields that only say how long to
train, how often to evaluate, checkpoint and log, and where things are, may change; any
other change is refused unless ``run.resume_allow_changes`` names it.

Example::

    old = yaml.safe_load((run_dir / "config.yaml").read_text())
    problem, notes = check_resume_config(old, cfg)   # problem: one line, or None
    problem = run_dir_problem(cfg, run_dir, resume=True)   # the folder as well
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from ..engine.run_record import METRICS_FILE
from .checkpoint import has_checkpoint, saved_config

#: Dotted config keys (or prefixes) a resumed run may change freely.
MAY_CHANGE = (
    "run.name", "run.tag", "run.output_dir",            # how the run was found
    "run.steps", "run.epochs",                           # how long to train
    "run.eval_interval", "run.eval_batches",             # evaluation
    "run.checkpoint_interval", "run.keep_checkpoints",   # checkpoints
    "run.log_interval", "run.progress", "run.report",    # logging
    "run.rank_phases",
    "run.overwrite", "run.threads", "run.keep_freed_memory",    # how the process runs
    "run.horovod_cycle_time_ms", "run.horovod_wait",
    "run.stall_timeout", "run.stop_check_interval",
    "run.elastic_commit_interval", "run.backend",        # the transport: same math
    "run.device",                                        # CPU <-> GPU: the same experiment
    "run.resume_allow_changes",
    "data.root",                                         # the same data, moved
    "data.eval_batch_size",
    "optimizer.implementation",                          # the same update, another kernel
    "compression.overlap", "compression.bucket_cap_mb",  # the same step, started earlier
)


def flatten(tree: dict, prefix: str = "") -> dict:
    """``{"a": {"b": 1}}`` as ``{"a.b": 1}``; lists and mapping-valued options whose keys
    are free (``compressor_options``, ``model.options``) are leaves compared as a whole."""
    flat = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and not path.endswith("options"):
            flat.update(flatten(value, path + "."))
        else:
            flat[path] = value
    return flat


def _covered(key: str, names) -> bool:
    return any(key == n or key.startswith(n + ".") for n in names)


def config_changes(old: dict, new: dict, defaults: dict) -> dict:
    """``{key: (old, new)}`` for every leaf that differs; a key the old config lacks (a
    field added since) counts as its default."""
    old_flat, new_flat, default_flat = flatten(old), flatten(new), flatten(defaults)
    changes = {}
    for key in sorted(set(old_flat) | set(new_flat)):
        before = old_flat.get(key, default_flat.get(key))
        after = new_flat.get(key, default_flat.get(key))
        if before != after:
            changes[key] = (before, after)
    return changes


def allow_list(value) -> list[str]:
    """``run.resume_allow_changes`` as a list (``all`` or one name may be given bare)."""
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def unknown_allowed(value, defaults: dict) -> list[str]:
    """Names in ``run.resume_allow_changes`` that are no config key or section."""
    keys = flatten(defaults)
    return [n for n in allow_list(value)
            if n != "all" and not any(k == n or k.startswith(n + ".") for k in keys)]


def check_resume_config(old: dict, cfg) -> tuple[str | None, list[str]]:
    """(the one-line refusal or None, lines naming the allowed changes) for resuming the
    run whose resolved config was ``old`` with ``cfg``."""
    # The defaults are a fresh config of cfg's own class: no import of config.py (which
    # imports this module to validate run.resume_allow_changes).
    allowed = allow_list(cfg.run.resume_allow_changes)
    changes = config_changes(old, dataclasses.asdict(cfg), dataclasses.asdict(type(cfg)()))
    free = {k: v for k, v in changes.items() if _covered(k, MAY_CHANGE)}
    rest = {k: v for k, v in changes.items() if k not in free}
    forced = rest if "all" in allowed else {k: v for k, v in rest.items()
                                           if _covered(k, allowed)}
    refused = {k: v for k, v in rest.items() if k not in forced}
    shown = lambda items: ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in items.items())
    if refused:
        names = ",".join(refused)
        return (f"--resume: the config differs from the run's in {shown(refused)}; a resumed "
                f"run continues the same experiment. Undo the change, start a new run "
                f"(another run.name), or force it with --set run.resume_allow_changes="
                f"[{names}] (or all)"), []
    return None, [f"resume: allowed change {k} {a!r} -> {b!r}" for k, (a, b) in forced.items()]


def occupied(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run (its metrics or checkpoints)."""
    return (run_dir / METRICS_FILE).exists() or (run_dir / "checkpoints").exists()


def world_size_problem(saved: int, ranks: int) -> str | None:
    """Why a checkpoint written by ``saved`` ranks cannot go on with ``ranks``, or None: the
    residuals, data shards and controller state are per rank."""
    if saved == ranks:
        return None
    return (f"--resume: the checkpoint was written by {saved} ranks, this job has {ranks}; run "
            f"it with {saved} ranks (horovodrun -np {saved} or torchrun --nproc-per-node ...)")


def run_dir_problem(cfg, run_dir: Path, resume: bool) -> str | None:
    """Why the run cannot start (or, ``resume``, continue) in ``run_dir``, or None. Reads
    only: the trainer's rank 0 asks it holding the folder's lock (and then clears an
    occupied folder under ``run.overwrite``); ``train.py --check`` asks it before a
    launch, so that a folder in use stops the check rather than every launched rank."""
    if resume:
        if not has_checkpoint(run_dir):
            return (f"--resume: no checkpoint in {run_dir / 'checkpoints'}; start without "
                    "--resume, or set run.output_dir/run.name to the run to continue")
        return _resume_config_problem(cfg, run_dir)
    if occupied(run_dir) and not cfg.run.overwrite:
        return (f"{run_dir} already holds a run; continue it with --resume, replace it "
                "with --set run.overwrite=true, or choose another run.name")
    return None


def _resume_config_problem(cfg, run_dir: Path) -> str | None:
    """The resumed config against the run's own (config.yaml, written when it started);
    prints the changes it allows."""
    import yaml

    try:
        old = yaml.safe_load((run_dir / "config.yaml").read_text())
    except (OSError, yaml.YAMLError) as exc:
        # Every checkpoint holds the run's config too (a folder copied without its
        # config.yaml accepted any change before).
        saved = saved_config(run_dir)
        if saved is None:
            print(f"resume: cannot compare with {run_dir / 'config.yaml'} ({exc}) nor with a "
                  "checkpoint's config; continuing with the config given", flush=True)
            return None
        old, source = saved
        print(f"resume: {run_dir / 'config.yaml'} unreadable ({type(exc).__name__}); "
              f"comparing with the config saved in {source}", flush=True)
    problem, notes = check_resume_config(old if isinstance(old, dict) else {}, cfg)
    for line in notes:
        print(line, flush=True)
    return problem
