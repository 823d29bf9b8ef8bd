"""The results table of a sweep: one row per run, read from the run directories. Every
number in a row is the report's (``gravac.report.stats.summarize``), so the sweep's table
and the report of the same runs cannot disagree. A grid with an axis over ``run.seed``
also gets the same numbers over its seeds (``seed_rows``): mean and sample standard
deviation per point of the other axes."""
from __future__ import annotations

import csv
import io
import statistics
from pathlib import Path
from typing import Any, Sequence

from ..report import Run, RunLoadError, RunSummary, load_run
from ..report.stats import summarize
from ..report.summary import unfinished_note
from ..util.atomic import atomic_write_text
from .spec import FIXED_COLUMNS, Axis, RunSpec, Sweep

# Row columns filled from the report's RunSummary field of the same meaning.
_SUMMARY_COLUMNS = {"steps": "steps", "wall_time_s": "wall_time", "metric": "metric",
                    "final_metric": "final_metric", "floats_vs_dense": "floats_vs_dense",
                    "mean_samples_per_sec": "mean_samples_per_sec", "speedup": "speedup",
                    "comm_saving": "comm_saving"}
#: The key whose axis the seed summary averages over.
SEED_KEY = "run.seed"
#: Row columns the seed summary gives as mean and standard deviation over the seeds.
SEED_MEASURES = ("final_metric", "wall_time_s", "mean_samples_per_sec", "speedup",
                 "comm_saving", "floats_vs_dense")


def finished(run_dir: Path) -> bool:
    """Whether ``run_dir/metrics.jsonl`` can be read and has the trainer's run_end record."""
    try:
        return load_run(run_dir).end is not None
    except RunLoadError:
        return False


def _summary_note(summary: RunSummary) -> str:
    if summary.not_comparable:
        return f"not compared: {summary.not_comparable}"
    if summary.compared_at is not None:
        return f"speedup and comm_saving at step {summary.compared_at}, the last both reached"
    return ""


def results_rows(sweep: Sweep, runs: Sequence[RunSpec], sweep_dir: Path,
                 status: dict[str, str], notes: dict[str, str],
                 baselines: dict[str, str | None]) -> list[dict[str, Any]]:
    """One row per run (columns: ``columns(sweep)``), read from the run directories. An
    axis over one key shows the key's value (``run.seed`` 0), any other axis its label.

    Speedup and communication saving are filled in only when the run and its baseline
    both finished ("ok"); a run's own note (e.g. why it failed) wins over the report's.

    Example::

        rows = results_rows(sweep, runs, Path("/tmp/sw"), {"s-dense": "ok"}, {}, baselines)
    """
    # Only the baselines stay loaded (each is compared with many runs); a run's own records
    # go once its row is made: a long run's take ~4 KB of memory per logged step, and
    # kept, every finished run of the sweep was held at once.
    baseline_names = set(baselines.values())
    loaded: dict[str, Run | str] = {}   # baseline name -> Run, or why it could not be read

    def load(name: str) -> Run | str:
        if name in loaded:
            return loaded[name]
        try:
            run = load_run(sweep_dir / "runs" / name)
        except RunLoadError as exc:
            run = str(exc)
        if name in baseline_names:
            loaded[name] = run
        return run

    rows = []
    for run in runs:
        state, base_name = status.get(run.name, "pending"), baselines.get(run.name)
        note = notes.get(run.name, "")
        values: dict[str, Any] = dict.fromkeys(_SUMMARY_COLUMNS)
        mine = load(run.name) if state != "pending" else None
        if isinstance(mine, Run):
            base = load(base_name) if state == "ok" and base_name and \
                status.get(base_name) == "ok" else None
            summary = summarize(mine, base if isinstance(base, Run) else None)
            values = {col: getattr(summary, field) for col, field in _SUMMARY_COLUMNS.items()}
            note = note or _summary_note(summary) or \
                (f"not compared: {base}" if isinstance(base, str) else "")
            if summary.last_eval is not None and state != "running":
                # final_metric stays empty: a mid-run evaluation is no final result
                note = "; ".join(filter(None, [note, unfinished_note(summary)]))
        elif isinstance(mine, str) and state != "running":
            # A running run may simply not have logged yet; anything else is worth saying.
            note = note or f"metrics not read: {mine}"
        rows.append({"name": run.name, **run.cells, "status": state, **values,
                     "baseline": base_name, "note": note})
    return rows


def report_groups(names: Sequence[str], status: dict[str, str],
                  baselines: dict[str, str | None]) -> list[tuple[str | None, list[str]]]:
    """The finished runs among ``names``, grouped by the baseline the results table compares
    them with: [(baseline run name, or None where it has none that finished, [run names])],
    in the order of ``names``. gravac.report takes one baseline, so each group is one report,
    and its speedups are the table's.

    Example::

        report_groups(["s-dense-seed_0", "s-topk-seed_0", "s-dense-seed_1"],
                      dict.fromkeys(["s-dense-seed_0", "s-topk-seed_0", "s-dense-seed_1"], "ok"),
                      {"s-dense-seed_0": "s-dense-seed_0", "s-topk-seed_0": "s-dense-seed_0",
                       "s-dense-seed_1": "s-dense-seed_1"})
        # [('s-dense-seed_0', ['s-dense-seed_0', 's-topk-seed_0']),
        #  ('s-dense-seed_1', ['s-dense-seed_1'])]
    """
    groups: dict[str | None, list[str]] = {}
    for name in names:
        if status.get(name) != "ok":
            continue
        base = baselines.get(name)
        groups.setdefault(base if base and status.get(base) == "ok" else None, []).append(name)
    return list(groups.items())


def seed_axis(sweep: Sweep) -> Axis | None:
    """The grid's axis over ``run.seed`` (each entry sets that key and nothing else), or
    None: ``run.seed: [0, 1, 2]``, or entries such as ``{set: {run.seed: 3}, tag: s3}``."""
    for axis in sweep.axes:
        if axis.values and all(not v.files and [k for k, _ in v.overrides] == [SEED_KEY]
                               for v in axis.values):
            return axis
    return None


def _other_axes(sweep: Sweep) -> tuple[Axis | None, list[str]]:
    """The axis over ``run.seed`` (or None) and the names of the other axes."""
    seeds = seed_axis(sweep)
    return seeds, [a.name for a in sweep.axes if a is not seeds]


def seed_columns(sweep: Sweep) -> list[str]:
    """Columns of ``seed_rows``: the other axes, ``seeds``, ``metric``, then each of
    ``SEED_MEASURES`` as ``<measure>_mean`` and ``<measure>_sd``."""
    _, others = _other_axes(sweep)
    return [*others, "seeds", "metric",
            *(f"{m}_{what}" for m in SEED_MEASURES for what in ("mean", "sd"))]


def seed_rows(sweep: Sweep, rows: Sequence[dict]) -> list[dict[str, Any]]:
    """The results over the seeds (``[]`` without an axis over ``run.seed``): one row per
    point of the other axes, in the table's order, with the mean and the sample standard
    deviation of each of ``SEED_MEASURES`` over the runs that finished ("ok") and have the
    number (the sd needs two; speedups are each seed's against its own baseline), and
    ``seeds``: how many of the point's runs finished.

    Example::

        seed_rows(sweep, rows)[0]
        # {'c': 'topk', 'seeds': '2 of 2', 'metric': 'top1', 'final_metric_mean': 0.91,
        #  'final_metric_sd': 0.004, 'wall_time_s_mean': 12.5, ...}
    """
    seeds, others = _other_axes(sweep)
    if seeds is None:
        return []
    points: dict[tuple, list[dict]] = {}
    for row in rows:
        points.setdefault(tuple(row.get(name) for name in others), []).append(row)
    out = []
    for point, runs in points.items():
        done = [r for r in runs if r["status"] == "ok"]
        summary: dict[str, Any] = {**dict(zip(others, point)),
                                   "seeds": f"{len(done)} of {len(runs)}",
                                   "metric": next((r["metric"] for r in done if r.get("metric")),
                                                  None)}
        for measure in SEED_MEASURES:
            values = [float(r[measure]) for r in done if r.get(measure) is not None]
            summary[f"{measure}_mean"] = statistics.fmean(values) if values else None
            summary[f"{measure}_sd"] = statistics.stdev(values) if len(values) > 1 else None
        out.append(summary)
    return out


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


def _seed_table(sweep: Sweep, rows: Sequence[dict]) -> list[str]:
    """``seed_rows`` as markdown lines: mean ± sd per measure ("" where none)."""
    summary = seed_rows(sweep, rows)
    if not summary:
        return []
    seeds, others = _other_axes(sweep)
    cols = [*others, "seeds", "metric", *SEED_MEASURES]

    def cell(row: dict, col: str) -> str:
        if col not in SEED_MEASURES:
            return _md_cell(col, row.get(col))
        mean, sd = row[f"{col}_mean"], row[f"{col}_sd"]
        return _md_cell(col, mean) + ("" if sd is None else f" ± {_md_cell(col, sd)}")
    lines = ["", f"## Over the seeds ({seeds.name})", "",
             f"Mean ± sample standard deviation over the runs that finished; speedup and "
             f"comm_saving are each run's against its own baseline. Also in "
             f"results_seeds.csv.", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(r, c) for c in cols) + " |" for r in summary]
    return lines


def to_markdown(sweep: Sweep, rows: Sequence[dict], cols: Sequence[str]) -> str:
    """A markdown page: a one-line summary, the results table and, for a grid with an
    axis over ``run.seed``, the results over the seeds.

    Example::

        print(to_markdown(sweep, rows, columns(sweep)))
    """
    done = sum(r["status"] == "ok" for r in rows)
    failed = sum(r["status"] not in ("ok", "pending", "running") for r in rows)
    lines = [f"# Sweep {sweep.name}", "",
             f"{len(rows)} runs on {sweep.np} ranks: {done} ok, {failed} failed, "
             f"{len(rows) - done - failed} pending or running. speedup = baseline wall time / "
             f"the run's, comm_saving = baseline floats sent / the run's, both at the last step "
             f"both reached; floats_vs_dense = share of dense traffic sent; every number as "
             f"gravac.report computes it.", ""]
    if sweep.link_description:
        lines += [f"Link: {sweep.link_description}.", ""]
    verdict = fastest_line(rows, sweep, with_link=False)
    if verdict:
        lines += [f"{verdict[0].upper()}{verdict[1:]}.", ""]
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        lines.append("| " + " | ".join(_md_cell(c, row.get(c)) for c in cols) + " |")
    lines += _seed_table(sweep, rows)
    return "\n".join(lines) + "\n"


def fastest_line(rows: Sequence[dict], sweep: Sweep, with_link: bool = True) -> str:
    """One line: the finished run with the most samples/s, against its baseline, and
    (``with_link``) the link it crossed; "" while no run has finished.

    Example::

        fastest_line(rows, sweep)
        # 'fastest: demo_sweep-gravac_w20, 512.3 samples/s, 1.84x its baseline
        #  demo_sweep-dense's speed; link: 100mbit (hvd_scripts/bandwidth_sandbox.sh)'
    """
    done = [r for r in rows if r["status"] == "ok" and r.get("mean_samples_per_sec")]
    if not done:
        return ""
    best = max(done, key=lambda r: r["mean_samples_per_sec"])
    by_name = {r["name"]: r for r in done}
    base = by_name.get(best.get("baseline") or "")
    against = ""
    if base is not None and base is not best:
        # The table's speedup (time to the same step) where it has one: the samples/s
        # ratio leaves out what is not a step (evaluations, checkpoints) and said 1.84x
        # beside a speedup of 2.47x.
        if best.get("speedup"):
            against = f", {best['speedup']:.2f}x its baseline {base['name']}'s speed"
        else:
            ratio = best["mean_samples_per_sec"] / base["mean_samples_per_sec"]
            against = f", {ratio:.2f}x its baseline {base['name']}'s samples/s"
    elif base is best:
        against = " (the baseline itself)"
    link = f"; link: {sweep.link_description}" if sweep.link_description and with_link \
        else ""
    return (f"fastest: {best['name']}, {best['mean_samples_per_sec']:.1f} samples/s"
            f"{against}{link}")


def write_results(sweep: Sweep, rows: Sequence[dict], sweep_dir: Path) -> None:
    """Write ``results.csv`` and ``results.md`` (and ``results_seeds.csv`` for a grid with
    an axis over ``run.seed``) atomically into ``sweep_dir``."""
    cols = columns(sweep)
    atomic_write_text(sweep_dir / "results.csv", to_csv(rows, cols))
    if seed_axis(sweep) is not None:
        atomic_write_text(sweep_dir / "results_seeds.csv",
                          to_csv(seed_rows(sweep, rows), seed_columns(sweep)))
    atomic_write_text(sweep_dir / "results.md", to_markdown(sweep, rows, cols))
