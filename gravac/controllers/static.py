"""A fixed compression factor for every compressed layer, every step."""
from __future__ import annotations

from .base import SENT_DENSE, SENT_MIN, Controller, StepPlan


class Static(Controller):
    """Compress every compressed layer at ``cf`` (1 = dense allreduce).

    Example::

        opt = gravac.DistributedOptimizer(opt, model.named_parameters(),
                                          compressor="topk", controller=Static(cf=100))
    """

    def __init__(self, cf: float = 100):
        if isinstance(cf, bool) or not isinstance(cf, (int, float)) or not cf >= 1:
            raise ValueError(f"Static(cf={cf!r}): cf must be a number >= 1 "
                             "(1 = dense, 100 keeps 1% of each layer)")
        self.cf = float(cf)

    def plan(self, step: int) -> StepPlan:
        return StepPlan(theta_min=self.cf)

    def decide(self, gain_min, gain_c) -> str:
        return SENT_DENSE if self.cf <= 1 else SENT_MIN

    def describe(self) -> dict:
        return {"controller": "Static", "cf": self.cf}

    def __repr__(self) -> str:
        return f"Static(cf={self.cf:g})"
