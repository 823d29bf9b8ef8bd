"""Least squares for the cost model's fits: nonnegative coefficients in pure Python, and
α, β of a link from timed collectives.

Example::

    least_squares([[1, 1], [1, 2], [1, 3]], [3, 5, 7])                  # [1.0, 2.0]
    link, quality = fit_link([("allreduce", 4, 8, 1.9e-4), ("allreduce", 4, 1e6, 1.4e-2)])
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

from .network import Link, collective_terms


def least_squares(rows: Sequence[Sequence[float]], y: Sequence[float],
                  weights: Sequence[float] | None = None, nonneg: bool = True) -> list[float]:
    """Coefficients c minimising Σ w_i (rows_i · c − y_i)², with c >= 0 when ``nonneg``
    (a negative coefficient is fixed at 0 and the others refitted). Pure Python: a few
    coefficients, columns scaled to 1 so that bytes and counts can share a fit.

    >>> [round(c, 6) for c in least_squares([[1, 1], [1, 2], [1, 3]], [3, 5, 7])]
    [1.0, 2.0]
    """
    p = len(rows[0])
    w = list(weights) if weights is not None else [1.0] * len(rows)
    scale = [max(abs(r[j]) for r in rows) or 1.0 for j in range(p)]
    active = [j for j in range(p) if any(r[j] for r in rows)]
    while True:
        sol = _solve_normal([[r[j] / scale[j] for j in active] for r in rows], y, w)
        coef = [0.0] * p
        for j, v in zip(active, sol):
            coef[j] = v / scale[j]
        negative = [j for j in active if coef[j] < 0]
        if not nonneg or not negative:
            return coef
        active.remove(min(negative, key=lambda j: coef[j] * scale[j]))
        if not active:
            return [0.0] * p


def _solve_normal(x: list[list[float]], y, w) -> list[float]:
    p = len(x[0]) if x and x[0] else 0
    if p == 0:
        return []
    a = [[sum(wi * r[i] * r[j] for r, wi in zip(x, w)) for j in range(p)] for i in range(p)]
    b = [sum(wi * r[i] * yi for r, yi, wi in zip(x, y, w)) for i in range(p)]
    # Gaussian elimination with partial pivoting; a (near-)singular column gets 0.
    m = [row + [bi] for row, bi in zip(a, b)]
    for col in range(p):
        pivot = max(range(col, p), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-300:
            continue
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(p):
            if r != col and m[r][col]:
                f = m[r][col] / m[col][col]
                m[r] = [vr - f * vc for vr, vc in zip(m[r], m[col])]
    return [m[i][p] / m[i][i] if abs(m[i][i]) > 1e-300 else 0.0 for i in range(p)]


def fit_link(points: Iterable[tuple[str, int, float, float]]) -> tuple[Link, dict]:
    """α and β from measured (collective, ranks, bytes, seconds): least squares on the
    collectives' α-β formulas, relative errors (weights 1/t²) so that 8-byte latencies
    count as much as 32 MB transfers. Returns the link and the fit's quality.

    >>> truth = Link(3e-5, 8e-9)
    >>> pts = [("allreduce", 4, b, truth.time(collective_terms("allreduce", b, 4)))
    ...        for b in (8, 1e6)]
    >>> link, _ = fit_link(pts); round(link.alpha_s * 1e6, 3), round(link.beta_s_per_byte * 1e9, 3)
    (30.0, 8.0)
    """
    pts = [p for p in points if p[3] > 0]
    if not pts:
        raise ValueError("no measurements to fit")
    rows = [collective_terms(kind, nbytes, n) for kind, n, nbytes, _ in pts]
    y = [t for *_, t in pts]
    alpha, beta = least_squares(rows, y, [1.0 / t ** 2 for t in y])
    link = Link(alpha, beta)
    errors = [link.time(r) / t - 1.0 for r, t in zip(rows, y)]
    return link, {"points": len(pts), "max_rel_err": max(abs(e) for e in errors),
                  "rms_rel_err": math.sqrt(sum(e * e for e in errors) / len(errors))}
