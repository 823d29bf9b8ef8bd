"""The ``report.md`` text: runs, summary table, GraVAC decisions, embedded plots.

Example::

    runs = load_runs(["runs/dense", "runs/gravac"])
    rows = [summarize(run, runs[0]) for run in runs]
    text = render_markdown(runs, rows, baseline=runs[0], images=[], out_dir="report")
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from ..engine.run_record import METHOD, WINDOW
from .load import Run
from .plots import PLOTS, metric_title
from .stats import TIME_COLUMNS, Exploration, RunSummary, exploration, time_breakdown

DASH = "—"  # a value the run did not log


def _cell(text: object) -> str:
    # A '|' inside a cell would split the markdown table row.
    return str(text).replace("|", "\\|")


def _num(value: float | None, fmt: str, suffix: str = "") -> str:
    return DASH if value is None else f"{value:{fmt}}{suffix}"


def format_metric(metric: str, value: float | None) -> str:
    """Perplexity with 2 decimals, accuracies (fractions) and others with 4."""
    return _num(value, ".2f" if metric == "perplexity" else ".4f")


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


#: Rows a per-event table (GraVAC's windows, Auto's events) lists at each end: a long run
#: has thousands of them (a window every 500 steps of a 500k-step run), all in
#: metrics.jsonl.
LISTED_ROWS = 100


def _event_table(header: Sequence[str], rows: Sequence[Sequence[str]], kind: str) -> list[str]:
    """``_table`` of the first and last ``LISTED_ROWS`` rows, with a line saying how many
    were left out between them and where they are (metrics.jsonl's ``kind`` lines)."""
    if len(rows) <= 2 * LISTED_ROWS:
        return _table(header, rows)
    left_out = len(rows) - 2 * LISTED_ROWS
    gap = [f"... {left_out} more" if i == 0 else DASH for i in range(len(header))]
    return _table(header, [*rows[:LISTED_ROWS], gap, *rows[-LISTED_ROWS:]]) + [
        "", f"{left_out} of {len(rows)} rows left out here; every one is a "
            f"`\"kind\": \"{kind}\"` line of metrics.jsonl."]


def summary_table(rows: Sequence[RunSummary], baseline: Run | None) -> list[str]:
    """Markdown lines of the summary table, plus footnotes on unfinished runs and baseline
    comparisons."""
    header = ["Run", "Controller", "Compressor", "Steps", "Wall time (s)", "Metric",
              "Final", "Best", "Samples/s", "Floats sent vs dense"]
    if baseline is not None:
        header += ["Speedup vs baseline", "Comm. saving vs baseline"]
    body, notes = [], []
    for row in rows:
        if not row.finished:
            notes.append(f"- {_cell(row.label)}: {unfinished_note(row)}.")
        cells = [row.label, row.controller, row.compressor, _num(row.steps, "d"),
                 _num(row.wall_time, ".1f"), row.metric,
                 format_metric(row.metric, row.final_metric) if row.finished else
                 "did not finish",
                 format_metric(row.metric, row.best_metric),
                 _num(row.mean_samples_per_sec, ".1f"), _num(row.floats_vs_dense, ".4f")]
        if baseline is not None:
            cells += [_num(row.speedup, ".2f", "x"), _num(row.comm_saving, ".2f", "x")]
            if row.not_comparable:
                notes.append(f"- {_cell(row.label)}: not compared with the baseline "
                             f"({row.not_comparable}).")
            elif row.compared_at is not None:
                notes.append(f"- {_cell(row.label)}: compared with the baseline at step "
                             f"{row.compared_at}, the last step both runs reached.")
        body.append(cells)
    lines = _table(header, body)
    if notes:
        lines += [""] + notes
    return lines


def unfinished_note(row: RunSummary) -> str:
    """What a run without a run_end record reached: "the run did not finish (no run_end
    record); last evaluation at step 80: top1 0.4500" (its last, mid-run evaluation is no
    final result)."""
    text = "the run did not finish (no run_end record)"
    if row.last_eval is not None:
        step, value = row.last_eval
        text += f"; last evaluation at step {step}: {row.metric} {format_metric(row.metric, value)}"
    return text


def decisions_section(run: Run) -> list[str]:
    """Markdown lines listing a GraVAC run's window records."""
    lines = [f"### {run.label}", ""]
    if not run.windows:
        return lines + ["No window records logged.", ""]
    rows = [[str(i if w.get("window") is None else w["window"]), str(window_end_step(w)),
             _num(w.get("theta_min"), "g"), _num(w.get("theta_c"), "g"), _num(w.get("delta_min"), ".4g"),
             _num(w.get("delta_c"), ".4g"),
             DASH if w.get("settled") is None else ("yes" if w["settled"] else "no")]
            for i, w in enumerate(run.windows, start=1)]
    return lines + _event_table(["Window", "After step", "θmin", "θc", "δmin", "δc",
                                 "Settled"], rows, WINDOW) + [""]


def method_section(run: Run) -> list[str]:
    """Markdown lines: what ``controller: auto`` measured, pruned and chose, in order."""
    # The residual's lag only where it was measured (``low_rank_lag``).
    lag = any(e.get("lag") is not None for e in run.method_events)
    rows = [[str(e["step"]), e.get("event") or DASH, e.get("method") or DASH,
             _num(None if e.get("t") is None else 1000 * e["t"], ".1f"),
             _num(e.get("gain"), ".3f"), _num(e.get("gain_next"), ".3f"),
             *([_num(e.get("lag"), ".3f")] if lag else []),
             _num(e.get("score"), ".4g"), _why(e)]
            for e in run.method_events]
    lines = [f"### {run.label}", ""] + _event_table(
        ["After step", "Event", "Method", "Step ms", "Gain", "Next CF's gain",
         *(["Lag"] if lag else []), "Score", "Why"], rows, METHOD) + [""]
    cost = exploration(run)
    if cost is not None:
        lines += [exploration_line(cost), ""]
    return lines


def _why(event: dict) -> str:
    """An event's reason, and the layers a split method sends dense."""
    why = event.get("reason") or ""
    if event.get("dense_layers"):
        why += f"; sent dense: {', '.join(event['dense_layers'])}"
    return why


def exploration_line(cost: Exploration) -> str:
    """One sentence: what Auto's trials cost the run (``stats.exploration``)."""
    estimate = "" if cost.stride <= 1 else \
        f" (estimated from a step line every {cost.stride} steps: run.log_interval)"
    return (f"Exploration: {cost.steps} of {cost.total_steps} steps ran a method other than "
            f"the one chosen at the time ({cost.seconds:.1f} s); against the chosen methods' "
            f"median step they cost {cost.excess:+.1f} s, {100 * cost.share:+.1f}% of the "
            f"run's step time{estimate}.")


def time_section(runs: Sequence[Run]) -> list[str]:
    """Markdown lines: where each run's step time goes (median ms per phase), or nothing
    when no run logged phases."""
    rows = []
    for run in runs:
        times = time_breakdown(run)
        if times is not None:
            rows.append([_cell(run.label)] + [_num(None if times[key] is None else 1000 * times[key],
                                                   ".1f") for _, key in TIME_COLUMNS])
    if not rows:
        return []
    return (["## Where the step time goes", "",
             "Median milliseconds per step after the first 10 steps. Local work (its sum is "
             "t_compress) and waits in the collectives (the NaN/Inf flag, the gains, the "
             "exchange; their sum is t_comm) are timed apart: a wait includes the peers' "
             "lateness. Phases are defined in gravac/engine/phases.py.", ""]
            + _table(["Run"] + [heading for heading, _ in TIME_COLUMNS], rows) + [""])


def window_end_step(record: dict) -> int:
    """Steps done when the window ended, counted like step and eval records (from 1).
    Records without a "window" number come from trainers that logged the controller's
    0-based index of the window's last step."""
    return int(record["step"]) if record.get("window") is not None else int(record["step"]) + 1


def render_markdown(runs: Sequence[Run], rows: Sequence[RunSummary], baseline: Run | None,
                    images: Sequence[str | os.PathLike], out_dir: str | os.PathLike) -> str:
    """The whole report.md text; ``images`` are linked relative to ``out_dir``.

    Example::

        text = render_markdown(runs, rows, None, ["report/cf_vs_step.png"], "report")
    """
    lines = ["# GraVAC training report", "", "## Runs", ""]
    for run in runs:
        what = ", ".join(str(v) for v in (run.controller, run.compressor, run.model,
                                          run.dataset) if v)
        by = f", {run.gravac}" if run.gravac else ""
        lines.append(f"- **{run.label}** ({what}, metric: {metric_title(run.metric)}{by}): "
                     f"`{run.directory}`")
    lines.append("")
    if baseline is not None:
        lines += [f"Baseline: **{baseline.label}** (`{baseline.directory}`). Speedup is "
                  "baseline wall time / run wall time over the same steps; communication "
                  "saving is baseline floats sent / run floats sent.", ""]
    lines += ["## Summary", ""] + summary_table(rows, baseline) + [""]
    gravac_runs = [run for run in runs if run.is_gravac]
    if gravac_runs:
        lines += ["## GraVAC decisions", ""]
        for run in gravac_runs:
            lines += decisions_section(run)
    auto_runs = [run for run in runs if run.method_events]
    if auto_runs:
        lines += ["## Method choices (controller: auto)", "",
                  "Step ms is the median step time of a trial (or of the chosen method's "
                  "run); score is gain / step time; the highest score among the methods "
                  "whose gain clears ε is chosen.", ""]
        for run in auto_runs:
            lines += method_section(run)
    lines += time_section(runs)
    lines += ["## Plots", ""]
    captions = {name: caption for name, (_, caption) in PLOTS.items()}
    for image in images:
        rel = Path(os.path.relpath(image, out_dir)).as_posix()
        caption = captions.get(Path(image).name, Path(image).stem)
        lines += [f"### {caption}", "", f"![{caption}]({rel})", ""]
    return "\n".join(lines)
