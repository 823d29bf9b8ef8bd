"""Reading train.py run directories: the config, the step records, and the ``StepCase``
each record is (docs/SCALING.md §4).

Example::

    cfg = load_run_config(Path("runs/x"))
    exchange = exchange_of(cfg)                       # CliError for what is not modelled
    cases = [case_of(rec, cfg, exchange) for rec in read_steps(Path("runs/x"), warmup=10)]
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from gravac.engine.options import EXCHANGE_KINDS

from .errors import CliError
from .rounds import EXCHANGES, StepCase


def load_run_config(run_dir: Path):
    from gravac.train.config import ConfigError, load_config

    path = run_dir / "config.yaml"
    if not path.is_file():
        raise CliError(f"run directory {run_dir}: no config.yaml (not a train.py run directory?)")
    try:
        return load_config([path])
    except ConfigError as exc:
        raise CliError(f"run directory {run_dir}: config.yaml: {exc}") from None


def exchange_of(cfg) -> str:
    """The cost model's exchange for a run config; CliError for what it does not model."""
    c = cfg.compression
    if c.controller == "dense" or c.compressor == "none":
        return "fp16" if c.dense_wire == "fp16" else "dense"
    if c.controller == "accordion":
        raise CliError("controller accordion: per-layer CFs are not modelled (use static, "
                       "gravac or dense runs)")
    if c.overlap:
        raise CliError("compression.overlap: true: overlap with backward is not modelled "
                       "(the model adds compute, local work and communication)")
    if c.ddp_powersgd_rank:
        raise CliError("compression.ddp_powersgd_rank: DDP's PowerSGD hook is not modelled")
    exchange = "powersgd" if c.compressor == "powersgd" else c.exchange
    if exchange not in EXCHANGES:
        raise CliError(f"compression.exchange={c.exchange!r}: not an exchange the cost model "
                       f"prices ({', '.join(EXCHANGE_KINDS)})")
    return exchange


def case_of(record: dict, cfg, exchange: str) -> StepCase:
    """The StepCase of one step record of a run."""
    c = cfg.compression
    wire = 2 if c.dense_wire == "fp16" else 4
    if exchange in ("dense", "fp16"):
        return StepCase(exchange)
    sent = "dense" if record.get("sent") == "dense" else "sparse"
    theta_min = record.get("theta_min")
    # GraVAC agrees gains unless it planned the step dense (θmin 1: E2's probes, E3).
    gains = c.controller == "gravac" and (theta_min or 0) > 1
    theta_c = record.get("theta_c")
    if theta_c is not None and theta_min is not None and theta_c <= theta_min:
        theta_c = None
    theta = float(record.get("cf") or 1.0)
    # Random-k draws the same indices on every rank unless told otherwise (its default).
    shared = c.compressor == "randomk" and bool(c.compressor_options.get("same_across_ranks",
                                                                         True))
    if exchange == "powersgd":
        rank = c.rank if c.controller == "static" and c.rank else None
        return StepCase("powersgd", theta=theta if sent == "sparse" else 1.0,
                        theta_min=theta_min if not rank else None, theta_c=theta_c,
                        rank=rank, sent=sent, gains=gains, dense_wire=wire)
    if sent == "dense" and (theta_min is None or theta_min <= 1 or c.controller == "static"
                            and (c.cf or 1) <= 1):
        theta_min = None            # planned dense: nothing selected
    return StepCase(exchange, theta=theta if sent == "sparse" else 1.0,
                    theta_min=theta_min if theta_min and theta_min > 1 else None,
                    theta_c=theta_c, sent=sent, gains=gains, dense_wire=wire,
                    shared_selection=shared)


def read_steps(run_dir: Path, warmup: int) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise CliError(f"run directory {run_dir}: no metrics.jsonl")
    steps = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        # (a step skipped for a NaN/Inf on some rank sends nothing: not modelled)
        if rec.get("kind") == "step" and rec.get("step", 0) > warmup and rec.get("t_iter") \
                and rec.get("sent") != "skipped":
            steps.append(rec)
    if not steps:
        raise CliError(f"run directory {run_dir}: no step records after the {warmup} warm-up "
                       f"steps (run with run.log_interval=1)")
    return steps


def run_backend(run_dir: Path, cfg) -> str:
    """The transport a run used: its run_start record's (``run.backend: auto`` resolved),
    else the config's."""
    with open(run_dir / "metrics.jsonl") as f:
        for line in f:
            rec = json.loads(line) if line.strip() else {}
            if rec.get("kind") == "run_start":
                return rec.get("backend") or cfg.run.backend
    return cfg.run.backend


def median_compute(steps: list[dict]) -> float | None:
    """Median of t_compute + t_update (forward, backward, data, optimizer update)."""
    vals = [s["t_compute"] + (s.get("t_update") or 0.0) for s in steps
            if s.get("t_compute") is not None]
    return statistics.median(vals) if vals else None
