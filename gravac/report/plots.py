"""PNG plots comparing runs: one line (or bar group) per run, on shared axes.

Figures are built on matplotlib's Agg canvas directly (no pyplot), so no display is
needed, no global backend is switched and no figure stays open after it is saved.

Example::

    runs = load_runs(["runs/dense", "runs/gravac"])
    paths = write_plots(runs, "report/")   # [report/metric_vs_step.png, ...]
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..engine.run_record import SENT_SKIPPED
from ..util.atomic import atomic_savefig
from .load import Run
from .stats import cf_shares, compression_throughput, step_cf

METRIC_TITLES = {"top1": "Top-1 accuracy", "top5": "Top-5 accuracy",
                 "perplexity": "Perplexity", "loss": "Eval loss"}


def _figure(ncols: int = 1) -> tuple[Figure, list]:
    fig = Figure(figsize=(6.4 * ncols, 4.4), layout="constrained")
    FigureCanvasAgg(fig)  # attaches the Agg canvas: rendering needs no display
    return fig, list(fig.subplots(1, ncols, squeeze=False)[0])


def _color(index: int) -> str:
    # The same run keeps the same colour in every plot.
    return f"C{index % 10}"


def _no_data(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} in these runs", ha="center", va="center",
            transform=ax.transAxes, color="grey")


def _spans_decade(runs: Sequence[Run], metric: str) -> bool:
    # A log axis over less than a factor of 10 only gives unreadable tick labels.
    values = [v for run in runs if run.metric == metric for v in run.eval_series()[2]
              if v > 0]
    return bool(values) and max(values) > 10 * min(values)


def _finish(ax, xlabel: str, ylabel: str, title: str, has_data: bool, what: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if has_data:
        ax.legend(fontsize="small")
    else:
        _no_data(ax, what)


def metric_title(metric: str) -> str:
    return METRIC_TITLES.get(metric, metric)


def cf_label(cf: float) -> str:
    """Category label of a CF: ``1 (dense)``, ``10``, ``2.5``."""
    return "1 (dense)" if cf == 1 else f"{cf:g}"


# ------------------------------------------------------------------------------ plots


def plot_metric(runs: Sequence[Run], x: str = "step") -> Figure:
    """The eval metric vs ``x`` ("step" or "time"); one panel per distinct metric."""
    metrics = list(dict.fromkeys(run.metric for run in runs))
    fig, axes = _figure(len(metrics))
    for ax, metric in zip(axes, metrics):
        plotted = False
        for i, run in enumerate(runs):
            if run.metric != metric:
                continue
            steps, times, values = run.eval_series()
            pairs = [(s if x == "step" else t, v)
                     for s, t, v in zip(steps, times, values) if x == "step" or t is not None]
            if pairs:
                ax.plot(*zip(*pairs), marker="o", markersize=3, color=_color(i),
                        label=run.label)
                plotted = True
        if plotted and metric == "perplexity" and _spans_decade(runs, metric):
            ax.set_yscale("log")  # early perplexity is orders of magnitude above the end
        _finish(ax, "step" if x == "step" else "wall-clock time (s)", metric_title(metric),
                f"{metric_title(metric)} vs {x}", plotted, "eval records")
    return fig


def plot_loss(runs: Sequence[Run], x: str = "step") -> Figure:
    """Training loss from step lines vs ``x`` ("step" or "time": what a faster link or a
    higher CF buys shows only against wall-clock time)."""
    fig, (ax,) = _figure()
    plotted, positive = False, True
    for i, run in enumerate(runs):
        pairs = [(r["step"] if x == "step" else r["time"], r["loss"]) for r in run.steps
                 if r.get("loss") is not None and (x == "step" or r.get("time") is not None)]
        if pairs:
            ax.plot(*zip(*pairs), color=_color(i), label=run.label, linewidth=1.2)
            plotted = True
            positive = positive and all(loss > 0 for _, loss in pairs)
    if plotted and positive:
        # the first steps' loss is several times the rest: on a linear axis the rest of
        # the run is a flat line at the bottom
        ax.set_yscale("log")
    _finish(ax, "step" if x == "step" else "wall-clock time (s)", "training loss",
            f"Training loss vs {x}", plotted, "step records")
    return fig


def plot_cf(runs: Sequence[Run]) -> Figure:
    """CF sent per step (log scale): the rung (nominal) thick, the actual CF (compressible
    elements / values sent; DGC and RedSync keep about n/θ) thin and faint where it differs,
    and theta_min / theta_c dashed for GraVAC runs."""
    fig, (ax,) = _figure()
    plotted = False
    for i, run in enumerate(runs):
        points = [(r["step"], cf) for r in run.steps
                  if (cf := step_cf(r)) is not None and cf > 0]
        if not points:
            continue
        ax.plot(*zip(*points), drawstyle="steps-post", color=_color(i), linewidth=1.8,
                label=f"{run.label}: CF sent")
        plotted = True
        sent = [r for r in run.steps if r.get("sent") != SENT_SKIPPED and r.get("cf_actual")]
        if any(abs(r["cf_actual"] - (step_cf(r) or 0.0)) > 1e-6 * r["cf_actual"] for r in sent):
            ax.plot([r["step"] for r in sent], [r["cf_actual"] for r in sent], color=_color(i),
                    linewidth=0.7, alpha=0.6, label=f"{run.label}: actual CF")
        if run.is_gravac:
            for key, style, name in (("theta_min", "--", "θmin"), ("theta_c", ":", "θc")):
                steps, values = run.series(key)
                kept = [(s, v) for s, v in zip(steps, values) if v > 0]
                if kept:
                    ax.plot(*zip(*kept), drawstyle="steps-post", color=_color(i),
                            linewidth=0.8, linestyle=style, label=f"{run.label}: {name}")
    if plotted:
        ax.set_yscale("log")
    _finish(ax, "step", "compression factor (CF)", "CF per step", plotted, "CF values")
    return fig


def _grouped_bars(ax, runs: Sequence[Run], per_run: list[dict[float, float]]) -> bool:
    """Bars per CF category, one bar per run side by side; False when nothing to draw."""
    cfs = sorted({cf for values in per_run for cf in values})
    if not cfs:
        return False
    shown = [(i, run, values) for i, (run, values) in enumerate(zip(runs, per_run)) if values]
    width = 0.8 / len(shown)
    for slot, (i, run, values) in enumerate(shown):
        xs = [k + (slot - (len(shown) - 1) / 2) * width for k, cf in enumerate(cfs)
              if cf in values]
        ax.bar(xs, [values[cf] for cf in cfs if cf in values], width=width,
               color=_color(i), label=run.label)
    ax.set_xticks(range(len(cfs)), [cf_label(cf) for cf in cfs])
    return True


def plot_cf_density(runs: Sequence[Run]) -> Figure:
    """Share of logged steps spent at each CF, per run."""
    fig, (ax,) = _figure()
    plotted = _grouped_bars(ax, runs, [cf_shares(run) for run in runs])
    _finish(ax, "CF", "share of logged steps", "Steps spent at each CF", plotted,
            "CF values")
    return fig


def plot_compression_throughput(runs: Sequence[Run]) -> Figure:
    """Compression throughput (samples/s x gain) per CF, per run."""
    fig, (ax,) = _figure()
    plotted = _grouped_bars(ax, runs, [compression_throughput(run) for run in runs])
    _finish(ax, "CF", "samples/s × gain", "Compression throughput per CF", plotted,
            "throughput data")
    return fig


def plot_floats_sent(runs: Sequence[Run]) -> Figure:
    """Cumulative floats sent vs step, with the dense equivalent dashed."""
    fig, (ax,) = _figure()
    plotted = False
    for i, run in enumerate(runs):
        for key, style, suffix in (("cum_floats_sent", "-", ""),
                                   ("cum_dense_floats", "--", " (dense equivalent)")):
            if suffix and run.controller == "dense":
                continue  # a dense run sends exactly its dense equivalent: one line is enough
            kept = [(s, v) for s, v in zip(*run.series(key)) if v > 0]
            if kept:
                ax.plot(*zip(*kept), linestyle=style, color=_color(i),
                        label=f"{run.label}{suffix}")
                plotted = True
    if plotted:
        ax.set_yscale("log")  # compressed traffic is orders of magnitude below dense
    _finish(ax, "step", "cumulative floats sent", "Communication volume", plotted,
            "floats-sent records")
    return fig


# Output file name -> (figure builder, caption), in the order the report shows them.
PLOTS: dict[str, tuple[Callable[[Sequence[Run]], Figure], str]] = {
    "metric_vs_step.png": (lambda runs: plot_metric(runs, "step"), "Eval metric vs step"),
    "metric_vs_time.png": (lambda runs: plot_metric(runs, "time"),
                           "Eval metric vs wall-clock time"),
    "loss_vs_step.png": (plot_loss, "Training loss vs step"),
    "loss_vs_time.png": (lambda runs: plot_loss(runs, "time"),
                         "Training loss vs wall-clock time"),
    "cf_vs_step.png": (plot_cf, "CF sent per step"),
    "cf_density.png": (plot_cf_density, "Share of steps at each CF"),
    "compression_throughput.png": (plot_compression_throughput,
                                   "Compression throughput per CF"),
    "floats_sent.png": (plot_floats_sent, "Cumulative floats sent vs dense"),
}


def write_plots(runs: Sequence[Run], out_dir: str | os.PathLike, dpi: int = 100,
                ) -> list[Path]:
    """Write every plot in :data:`PLOTS` into ``out_dir`` (each file atomically).

    Example::

        write_plots(load_runs(["runs/a", "runs/b"]), "report", dpi=120)
    """
    out = Path(out_dir)
    paths = []
    for filename, (build, _) in PLOTS.items():
        fig = build(runs)
        paths.append(atomic_savefig(fig, out / filename, dpi=dpi))
    return paths
