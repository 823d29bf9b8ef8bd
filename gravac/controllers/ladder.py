"""Candidate CF ladders of GraVAC, in absolute CFs, built once from θmin₀ and θmax.

>>> build_ladder(10, 1000, "exponential")
[10.0, 20.0, 40.0, 160.0, 1000.0]
>>> build_ladder(10, 2000, "geometric")
[10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0, 1280.0, 2000.0]
"""
from __future__ import annotations

POLICIES = ("exponential", "geometric")


def build_ladder(theta_min: float, theta_max: float, policy: str) -> list[float]:
    """Rungs from ``theta_min`` up to ``theta_max`` (both included, increasing).

    geometric: θmin·2^j for j = 0, 1, 2, … below θmax, then θmax.
    exponential: θmin, then θmin·2^(2^(j-1)) for j ≥ 1 below θmax, then θmax
    (factors 2, 4, 16, 256, …).
    """
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    if not theta_min >= 1:
        raise ValueError(f"theta_min must be >= 1, got {theta_min}")
    if not theta_max >= theta_min:
        raise ValueError(f"theta_max ({theta_max}) must be >= theta_min ({theta_min})")
    rungs = [float(theta_min)]
    j = 1
    while True:
        factor = 2.0 ** j if policy == "geometric" else 2.0 ** (2 ** (j - 1))
        rung = theta_min * factor
        if rung >= theta_max:
            break
        rungs.append(float(rung))
        j += 1
    if rungs[-1] != theta_max:
        rungs.append(float(theta_max))
    return rungs


def next_rung(ladder: list[float], theta: float) -> float:
    """The smallest rung above ``theta``, or the top rung when there is none."""
    for rung in ladder:
        if rung > theta:
            return rung
    return ladder[-1]
