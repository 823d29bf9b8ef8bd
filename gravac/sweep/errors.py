"""The sweep's one error: a problem with the sweep file or its runs, in one line naming
the field (what ``python -m gravac.sweep`` prints before exiting 2), and the lines that
name every run a problem applies to once."""
from __future__ import annotations

from typing import Sequence


class SweepError(ValueError):
    """A problem with the sweep file or its runs, in one line naming the field."""


def problem_lines(problems: Sequence[tuple[str, str]], total: int) -> list[str]:
    """One line per distinct problem, in the order first met, naming the runs it applies
    to: ``run A: P`` for one run, ``P (runs A, B)`` for several, ``P (all N runs)`` when it
    applies to all ``total`` runs (a bad data.root is one line, not one per run).

    Example::

        problem_lines([("a", "bad root"), ("b", "bad root"), ("c", "lr < 0")], 3)
        # ['bad root (runs a, b)', 'run c: lr < 0']
    """
    runs: dict[str, list[str]] = {}
    for name, problem in problems:
        names = runs.setdefault(problem, [])
        if name not in names:
            names.append(name)
    lines = []
    for problem, names in runs.items():
        if len(names) == 1:
            lines.append(f"run {names[0]}: {problem}")
        elif len(names) == total:
            lines.append(f"{problem} (all {total} runs)")
        else:
            lines.append(f"{problem} (runs {', '.join(names)})")
    return lines
