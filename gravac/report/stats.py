"""Numbers derived from runs: summary row values, CF shares, compression throughput.

Example::

    base, run = load_run("runs/dense"), load_run("runs/gravac")
    row = summarize(run, baseline=base)
    print(row.speedup, row.comm_saving, cf_shares(run))
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..engine.run_record import (SENT_CANDIDATE, SENT_DENSE, SENT_MIN, SENT_SKIPPED,
                                 STEP_TIME_FIELDS)
from .load import Run

# What the trainer reports as gained by each kind of send: "gain" of a dense send is 1.
_GAIN_FIELD = {SENT_CANDIDATE: "gain_c", SENT_MIN: "gain_min"}


@dataclass(frozen=True)
class RunSummary:
    """One row of the report's summary table (``None`` where the run lacks the data).

    ``compared_at`` is the step at which speedup and communication saving were taken
    when the run and the baseline differ in length (else None); ``not_comparable``
    says why they were left out (e.g. a different model than the baseline's).

    ``final_metric`` is the metric at the run's end; a run that did not finish (no run_end
    record: killed, crashed, still running) has none, and ``last_eval`` holds the step and
    metric of its last evaluation instead, a mid-run one.
    """

    label: str
    controller: str
    compressor: str
    metric: str
    steps: int | None
    wall_time: float | None
    final_metric: float | None
    best_metric: float | None
    mean_samples_per_sec: float | None
    floats_vs_dense: float | None
    speedup: float | None = None
    comm_saving: float | None = None
    compared_at: int | None = None
    not_comparable: str | None = None
    finished: bool = True
    last_eval: tuple[int, float] | None = None


def summarize(run: Run, baseline: Run | None = None) -> RunSummary:
    """The summary-table row of ``run``, with speedup/saving vs ``baseline`` when given.

    Example::

        row = summarize(load_run("runs/gravac"), baseline=load_run("runs/dense"))
    """
    eval_steps, _, values = run.eval_series()
    finite = [v for v in values if not math.isnan(v)]
    best = (min(finite) if run.lower_is_better else max(finite)) if finite else None
    finished = run.end is not None
    row = RunSummary(
        label=run.label, controller=run.controller, compressor=run.compressor,
        metric=run.metric, steps=run.final_step, wall_time=run.wall_time,
        final_metric=values[-1] if values and finished else None, best_metric=best,
        mean_samples_per_sec=throughput(run),
        floats_vs_dense=floats_vs_dense(run), finished=finished,
        last_eval=(eval_steps[-1], values[-1]) if values and not finished else None)
    if baseline is None:
        return row
    reason = incomparable(run, baseline)
    if reason is not None:
        return replace(row, not_comparable=reason)
    # Runs of different lengths are compared at the last step both reached: say so.
    differ = run.final_step != baseline.final_step
    return replace(row, speedup=speedup(run, baseline), comm_saving=comm_saving(run, baseline),
                   compared_at=comparison_step(run, baseline) if differ else None)


def throughput(run: Run) -> float | None:
    """Samples per second over the logged steps: their samples (samples/s x t_iter, the
    global batch) over their summed step time, each logged step standing for the steps
    since the previous logged one. Not the mean of the steps' rates, which weighs a fast
    step as much as a slow one (164 samples/s where the steps' own time gave 139: the demo
    sweep, one line every 5 steps; 55% high for a resumed run); not the logged steps
    alone, which count step 1 (always logged, and paying the run's first-use costs)
    ``log_interval`` times (DDP's 428 samples/s where its later steps ran at 2,400-5,000)."""
    triples, previous = [], None
    for r in sorted(run.steps, key=lambda r: r["step"]):
        if r.get("samples_per_sec") is not None and r.get("t_iter"):
            weight = r["step"] - previous if previous is not None else 1
            triples.append((r["samples_per_sec"], r["t_iter"], max(weight, 1)))
        previous = r["step"]
    if triples:
        return (sum(rate * t * w for rate, t, w in triples)
                / sum(t * w for _, t, w in triples))
    _, rates = run.series("samples_per_sec")
    return float(np.mean(rates)) if rates else None


def floats_vs_dense(run: Run) -> float | None:
    """Last cum_floats_sent / last cum_dense_floats: the share of dense traffic sent."""
    for rec in reversed(run.steps):
        sent, dense = rec.get("cum_floats_sent"), rec.get("cum_dense_floats")
        if sent is not None and dense is not None:
            return sent / dense if dense > 0 else None
    return None


def incomparable(run: Run, baseline: Run) -> str | None:
    """Why ``run`` cannot be timed against ``baseline`` (different model or data), or None."""
    for what in ("model", "dataset"):
        mine, theirs = getattr(run, what), getattr(baseline, what)
        if mine and theirs and mine != theirs:
            return f"{what} {mine} differs from the baseline's {theirs}"
    return None


def comparison_step(run: Run, baseline: Run) -> int | None:
    """The largest step both runs reached (their final steps' minimum)."""
    if run.final_step is None or baseline.final_step is None:
        return None
    return min(run.final_step, baseline.final_step)


def time_at_step(run: Run, step: int) -> float | None:
    """Wall-clock seconds when ``step`` was done: its step line's time (exact at a logged
    step, linearly interpolated between them). Not run_end's time, even at the final step:
    that one also holds the final evaluation and checkpoint, which the longer run of a
    comparison has not done at this step (a 45-step run against a 60-step baseline showed
    1.38x where both runs' step-45 times gave 1.62x)."""
    return _interp([(r["step"], r["time"]) for r in run.steps if r.get("time") is not None],
                   step, origin=True)


def floats_at_step(run: Run, step: int) -> float | None:
    """cum_floats_sent at ``step`` (exact at a logged step, interpolated between them)."""
    return _interp([(r["step"], r["cum_floats_sent"]) for r in run.steps
                    if r.get("cum_floats_sent") is not None], step, origin=True)


def _interp(points: list[tuple[int, float]], step: int, origin: bool = False) -> float | None:
    # Step lines may be logged only every few steps: interpolating between the neighbours
    # is the best estimate in between; np.interp holds the end values beyond the ends.
    # With ``origin`` the series is known to start at 0 at step 0 (training time and
    # cumulative floats), which beats holding the first logged value before it.
    if not points:
        return None
    points.sort()
    if origin and points[0][0] > 0:
        points.insert(0, (0, 0.0))
    xs, ys = zip(*points)
    return float(np.interp(step, xs, ys))


def speedup(run: Run, baseline: Run) -> float | None:
    """Baseline wall time / run wall time over the same number of steps.

    Runs of equal length compare wall times (each with its final evaluation); otherwise
    both are timed when they had done the largest step both reached (``time_at_step``).

    Example::

        speedup(load_run("runs/gravac"), load_run("runs/dense"))  # e.g. 2.5
    """
    if run.final_step == baseline.final_step:
        mine, theirs = run.wall_time, baseline.wall_time
    else:
        step = comparison_step(run, baseline)
        if step is None:
            return None
        mine, theirs = time_at_step(run, step), time_at_step(baseline, step)
    return _ratio(theirs, mine)


def comm_saving(run: Run, baseline: Run) -> float | None:
    """Baseline cum_floats_sent / run cum_floats_sent at the last step both reached.

    Example::

        comm_saving(load_run("runs/gravac"), load_run("runs/dense"))  # e.g. 13.3
    """
    if run.final_step == baseline.final_step:
        mine, theirs = _last(run, "cum_floats_sent"), _last(baseline, "cum_floats_sent")
    else:
        step = comparison_step(run, baseline)
        if step is None:
            return None
        mine, theirs = floats_at_step(run, step), floats_at_step(baseline, step)
    return _ratio(theirs, mine)


def _last(run: Run, key: str) -> float | None:
    _, values = run.series(key)
    return values[-1] if values else None


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0 or math.isnan(num) or math.isnan(den):
        return None
    return num / den


def step_cf(rec: dict) -> float | None:
    """The CF a step line sent at (a dense send is CF 1 even when ``cf`` is missing; a step
    skipped for a non-finite gradient sent nothing and has no CF)."""
    if rec.get("sent") == SENT_SKIPPED:
        return None
    if rec.get("sent") == SENT_DENSE:
        return 1.0
    return rec.get("cf")


def cf_shares(run: Run) -> dict[float, float]:
    """Share of the logged step lines spent at each CF, sorted by CF.

    Steps that were not logged cannot be counted, so this is over the logged lines.

    Example::

        cf_shares(run)  # {10.0: 0.5, 20.0: 0.5}
    """
    cfs = [cf for cf in map(step_cf, run.steps) if cf is not None]
    counts: dict[float, int] = {}
    for cf in cfs:
        counts[cf] = counts.get(cf, 0) + 1
    return {cf: counts[cf] / len(cfs) for cf in sorted(counts)}


def compression_throughput(run: Run) -> dict[float, float]:
    """Compression throughput (samples/s x gain) per CF, sorted by CF.

    From the last window record's table when the run has one (GraVAC's own measurement);
    otherwise the mean over step lines of samples_per_sec x the gain of what was sent
    (gain_c for "candidate", gain_min for "min", 1 for "dense"; a missing gain counts 1).

    Example::

        compression_throughput(run)  # {10.0: 1500.0, 20.0: 1800.0}
    """
    for window in reversed(run.windows):
        if window["table"]:
            return dict(sorted(window["table"].items()))
    groups: dict[float, list[float]] = {}
    for rec in run.steps:
        cf, rate = step_cf(rec), rec.get("samples_per_sec")
        if cf is None or rate is None:
            continue
        gain = rec.get(_GAIN_FIELD.get(rec.get("sent"), ""))
        groups.setdefault(cf, []).append(rate * (1.0 if gain is None else gain))
    return {cf: float(np.mean(groups[cf])) for cf in sorted(groups)}


_TIME_HEADINGS = {"t_compute": "compute", "t_compress": "= local", "t_comm": "= waits",
                  "t_update": "update", "t_iter": "step"}
#: The columns of a step-time table (the report's, benchmarks/step_profile.py's):
#: (heading, step field), in step order; a phase is headed by its name (``select``).
TIME_COLUMNS = tuple((_TIME_HEADINGS.get(name, name[2:]), name) for name in STEP_TIME_FIELDS)


def time_breakdown(run: Run, skip: int = 10) -> dict[str, float] | None:
    """Median seconds of each ``TIME_COLUMNS`` field over the run's steps after the first
    ``skip`` (start-up); None for runs that logged no phases (dense baselines, older
    trainers). Medians, not means: one slow step (a checkpoint, a peer's hiccup) would
    otherwise show as a phase's cost."""
    steps = [s for s in run.steps if s["step"] > skip and s.get("sent") != SENT_SKIPPED]
    if not any(s.get("t_select") is not None for s in steps):
        return None
    out = {}
    for _, key in TIME_COLUMNS:
        values = [s[key] for s in steps if s.get(key) is not None]
        out[key] = float(np.median(values)) if values else None
    return out


@dataclass(frozen=True)
class Exploration:
    """What ``controller: auto``'s trials cost a run (:func:`exploration`).

    ``steps``: steps that ran a method other than the one chosen at the time (every step
    before the first choice, and the trials of the re-checks); ``seconds``: their time;
    ``excess``: their time minus what as many steps take at the median step time of the
    rest of the run (the chosen methods'), so what exploring cost against running the
    choices throughout; ``share``: ``excess`` over the run's whole step time. Time only: a
    trial's effect on the loss (its steps' gains) is not in it. ``stride``: where step
    lines were logged every ``stride`` > 1 steps (``run.log_interval``), each line stands
    for the steps since the one before: the figures are estimates (1: exact).
    """

    steps: int
    total_steps: int
    seconds: float
    excess: float
    share: float
    stride: int = 1


def exploration(run: Run) -> Exploration | None:
    """The trials' cost in ``run`` (an ``Exploration``), or None for a run without Auto's
    choices or whose every step was a trial.

    Example::

        cost = exploration(load_run("runs/lstm-auto"))
        print(f"{cost.steps} trial steps, {100 * cost.share:.1f}% of the run's time")
    """
    chosen = sorted((e["step"], e["method"]) for e in run.method_events
                    if e.get("event") == "chosen")
    steps = [s for s in run.steps if s.get("t_iter") is not None and s.get("method")]
    if not chosen or not steps:
        return None
    # (t_iter, steps it stands for): a line logged every k steps stands for the k steps
    # up to it (counting lines said "4 of 5 steps" for a 20-step run logged every 5).
    exploring, settled, before = [], [], 0
    for s in steps:
        # A choice logged at the end of step k holds from step k + 1.
        current = [method for step, method in chosen if step < s["step"]]
        weight = max(s["step"] - before, 1)
        before = s["step"]
        (settled if current and s["method"] == current[-1] else exploring).append(
            (s["t_iter"], weight))
    if not settled:
        return None
    seconds = sum(t * w for t, w in exploring)
    count = sum(w for _, w in exploring)
    total = seconds + sum(t * w for t, w in settled)
    median = float(np.median([t for t, _ in settled]))
    excess = seconds - count * median
    stride = max(w for _, w in exploring + settled)
    return Exploration(steps=count, total_steps=count + sum(w for _, w in settled),
                       seconds=seconds, excess=excess,
                       share=excess / total if total > 0 else 0.0, stride=stride)
