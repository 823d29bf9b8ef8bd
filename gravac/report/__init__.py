"""gravac.report: plots and a markdown summary of training runs.

Reads each run's ``metrics.jsonl`` (written by the trainer), writes PNG plots comparing
the runs and a ``report.md`` with a summary table (final/best metric, wall time, speedup
and communication saving against a dense baseline) and GraVAC's window decisions.

Example::

    from gravac.report import build_report
    build_report(["runs/dense", "runs/gravac"], out_dir="report")   # -> report/report.md

or from the shell: ``python -m gravac.report runs/dense runs/gravac --out report``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from ..util.atomic import atomic_write_text
from .load import METRICS_FILE, Run, RunLoadError, load_rank_steps, load_run, load_runs
from .plots import PLOTS, write_plots
from .stats import (RunSummary, cf_shares, comm_saving, compression_throughput, speedup,
                    summarize)
from .summary import render_markdown

REPORT_FILE = "report.md"


def default_out_dir(run_dirs: Sequence[str | os.PathLike]) -> Path:
    """The run directory itself for one run, ``./report`` for several."""
    return Path(run_dirs[0]) if len(run_dirs) == 1 else Path("report")


def with_baseline(run_dirs: Sequence[str | os.PathLike],
                  baseline: str | os.PathLike | None) -> list[str | os.PathLike]:
    """``run_dirs`` with the baseline directory put first when it is not among them
    (the baseline is shown too, as the table's first row)."""
    dirs = list(run_dirs)
    if baseline is not None and Path(baseline).resolve() not in {Path(d).resolve()
                                                                  for d in dirs}:
        dirs.insert(0, baseline)
    return dirs


def pick_baseline(runs: Sequence[Run], baseline_dir: str | os.PathLike | None) -> Run | None:
    """The run loaded from ``baseline_dir``, else the first run whose controller is
    "dense", else None.

    Example::

        base = pick_baseline(runs, None)   # the first dense run, if any
    """
    if baseline_dir is None:
        return next((run for run in runs if run.controller == "dense"), None)
    wanted = Path(baseline_dir).resolve()
    found = next((run for run in runs if run.directory.resolve() == wanted), None)
    if found is None:
        raise ValueError(f"{baseline_dir}: baseline is not among the runs; pass it to "
                         f"with_baseline() first")
    return found


def build_report(run_dirs: Sequence[str | os.PathLike], out_dir: str | os.PathLike | None = None,
                 baseline: str | os.PathLike | None = None, dpi: int = 100) -> Path:
    """Write the plots and ``report.md`` for ``run_dirs`` into ``out_dir``; return report.md.

    Every run is read and checked before anything is written, so bad input (a missing,
    empty or malformed metrics file) raises :class:`RunLoadError` naming the file and
    leaves no output behind. Each output file is written atomically, report.md last.

    Example::

        build_report(["runs/dense", "runs/gravac"], out_dir="report",
                     baseline="runs/dense")
    """
    if not run_dirs:
        raise ValueError("no run directories given; pass at least one RUN_DIR")
    runs = load_runs(with_baseline(run_dirs, baseline))
    base = pick_baseline(runs, baseline)
    out = Path(out_dir) if out_dir is not None else default_out_dir(run_dirs)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out}: output path exists and is not a directory; choose "
                         f"another --out")
    rows = [summarize(run, base) for run in runs]
    images = write_plots(runs, out, dpi=dpi)
    # report.md goes last: when it exists, every image it links to exists too.
    return atomic_write_text(out / REPORT_FILE,
                             render_markdown(runs, rows, base, images, out))


__all__ = ["METRICS_FILE", "PLOTS", "REPORT_FILE", "Run", "RunLoadError", "RunSummary",
           "build_report", "cf_shares", "comm_saving", "compression_throughput",
           "default_out_dir", "load_rank_steps", "load_run", "load_runs", "pick_baseline", "speedup",
           "summarize", "with_baseline", "write_plots"]
