"""The step's decision, checked: what the controller says is sent, or a clear error.

Both step paths (sparse in ``step.py``, low-rank in ``lowrank.py``) ask the controller the
same way, from gains every rank agreed on, so every rank gets the same answer.

Example::

    sent = checked_decision(controller, gain_min, gain_c, has_layers=True,
                            candidate_planned=True)      # "candidate", "min" or "dense"
"""
from __future__ import annotations

from ..controllers import SENT_CANDIDATE, SENT_DENSE, SENT_MIN


def checked_decision(controller, gain_min: float | None, gain_c: float | None,
                     has_layers: bool, candidate_planned: bool, decided: str | None = None) -> str:
    """``controller.decide(gain_min, gain_c)`` (``SENT_MIN`` when no layer is compressed),
    refusing an answer outside the three, or the candidate when none was planned. With a
    plan that ``decided`` before the step (GraVAC ``decide="previous"``), ``decide`` still
    sees the gains (they update its averages) and the plan's level is what is sent."""
    sent = controller.decide(gain_min, gain_c) if has_layers else SENT_MIN
    if decided is not None and has_layers:
        sent = decided
    if sent not in (SENT_CANDIDATE, SENT_MIN, SENT_DENSE):
        raise RuntimeError(f"controller returned {sent!r}; expected one of "
                           f"{SENT_CANDIDATE!r}, {SENT_MIN!r}, {SENT_DENSE!r}")
    if sent == SENT_CANDIDATE and not candidate_planned:
        raise RuntimeError("controller chose the candidate but its plan had no candidate CF "
                           "above theta_min")
    return sent
