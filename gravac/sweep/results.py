"""The results table of a sweep: one row per run, read from the run directories; speedup
and communication saving are the report's definitions (``gravac.report.stats``)."""
from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..engine.record import METRICS_FILE
from ..report import RunLoadError, load_run
from ..report.stats import comm_saving, speedup
from ..util.atomic import atomic_write_text
from .spec import FIXED_COLUMNS, RunSpec, Sweep


def read_metrics(run_dir: Path) -> list[dict]:
    """The records of ``run_dir/metrics.jsonl`` (missing file: []; a torn line is skipped)."""
    path = Path(run_dir) / METRICS_FILE
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


def compare(run_dir: Path, baseline_dir: Path) -> tuple[float | None, float | None, str]:
    """(speedup, communication saving, problem) of a run against its baseline, exactly as
    the report computes them (``gravac.report.stats``): wall time and cumulative floats
    sent at the last step both runs reached."""
    try:
        run, base = load_run(run_dir), load_run(baseline_dir)
    except RunLoadError as exc:
        return None, None, f"not compared: {exc}"
    return speedup(run, base), comm_saving(run, base), ""


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
        base_ok = bool(base_name) and status.get(base_name) == "ok"
        gain = saving = None
        note = notes.get(run.name, "")
        if ok and base_ok:
            gain, saving, problem = compare(sweep_dir / "runs" / run.name,
                                            sweep_dir / "runs" / base_name)
            note = note or problem
        rows.append({"name": run.name, **run.labels,
                     "status": status.get(run.name, "pending"), "steps": m.steps,
                     "wall_time_s": m.wall_time, "metric": m.metric,
                     "final_metric": m.final_metric, "floats_vs_dense": m.floats_vs_dense,
                     "mean_samples_per_sec": m.mean_samples_per_sec,
                     "speedup": gain, "comm_saving": saving,
                     "baseline": base_name, "note": note})
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
             f"{len(rows) - done - failed} pending or running. speedup = baseline wall time / "
             f"the run's, comm_saving = baseline floats sent / the run's, both at the last step "
             f"both reached (as gravac.report computes them); floats_vs_dense = share of dense "
             f"traffic sent.", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        lines.append("| " + " | ".join(_md_cell(c, row.get(c)) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def write_results(sweep: Sweep, rows: Sequence[dict], sweep_dir: Path) -> None:
    """Write ``results.csv`` and ``results.md`` atomically into ``sweep_dir``."""
    cols = columns(sweep)
    atomic_write_text(sweep_dir / "results.csv", to_csv(rows, cols))
    atomic_write_text(sweep_dir / "results.md", to_markdown(sweep, rows, cols))
