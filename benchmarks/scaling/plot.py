"""The projection's plot: speed-up of the step over dense fp32 against N, one panel per
link rate (matplotlib, imported when a plot is drawn).

Example::

    plot_projection(project(...), Path("docs/img/scaling_resnet101.png"))
"""
from __future__ import annotations

import math
from pathlib import Path

from .projection import Projection

#: A colour per exchange (``rounds.EXCHANGES``); an exchange without one is drawn black.
COLOURS = {"fp16": "grey", "allgather": "tab:red", "allgather_coded": "tab:purple",
           "hierarchical": "tab:orange", "shared_index": "tab:blue", "powersgd": "tab:green"}


def plot_projection(p: Projection, path: Path) -> None:
    """Speed-up over dense fp32 against N, one panel per link rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = ["-", "--", ":", "-."]
    fig, axes = plt.subplots(1, len(p.links), figsize=(5 * len(p.links), 4.8), squeeze=False,
                             sharey=True)
    for ax, gbit in zip(axes[0], p.links):
        seen: dict[str, int] = {}
        for case in p.cases:
            if case.exchange == "dense":
                continue
            lab = case.label()
            i = seen.setdefault(case.exchange, 0)
            seen[case.exchange] += 1
            y = [p.times[(gbit, n, "dense")].total / p.times[(gbit, n, lab)].total for n in p.ns]
            ax.plot(p.ns, y, styles[i % len(styles)], color=COLOURS.get(case.exchange, "black"),
                    marker=".", label=lab)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("workers N")
        ax.set_title(f"{p.model.name}, {gbit:g} Gbit/s")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("speed-up of the step over dense fp32")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(7, len(labels)), fontsize=8)
    rows = math.ceil(len(labels) / 7)
    fig.tight_layout(rect=(0, 0.06 * rows + 0.02, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
