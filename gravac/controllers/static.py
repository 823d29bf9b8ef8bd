"""A fixed compression factor (or, for PowerSGD, a fixed rank) for every compressed layer."""
from __future__ import annotations

from .base import SENT_DENSE, SENT_MIN, Controller, StepPlan


class Static(Controller):
    """Compress every compressed layer at ``cf`` (1 = dense allreduce).

    ``rank`` (PowerSGD only): send every compressed layer at this rank instead; ``cf`` is
    then not used. A rank is the knob PowerSGD users know (and DDP's PowerSGD hook takes),
    while one CF is a different rank per layer shape (rows·cols / (r·(rows+cols))).

    Example::

        opt = gravac.DistributedOptimizer(opt, model.named_parameters(),
                                          compressor="topk", controller=Static(cf=100))
        opt = gravac.DistributedOptimizer(opt, model.named_parameters(),
                                          compressor="powersgd", controller=Static(rank=4))
    """

    def __init__(self, cf: float = 100, rank: int | None = None):
        if isinstance(cf, bool) or not isinstance(cf, (int, float)) or not cf >= 1:
            raise ValueError(f"Static(cf={cf!r}): cf must be a number >= 1 "
                             "(1 = dense, 100 keeps 1% of each layer)")
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 1):
            raise ValueError(f"Static(rank={rank!r}): rank must be an int >= 1 (the PowerSGD "
                             "rank of every compressed layer), or None to use cf")
        self.cf = float(cf)
        self.rank = rank
        self.uses_ranks = rank is not None
        self._layers: list[str] = []

    def bind(self, layer_names, sync) -> None:
        self._layers = list(layer_names)

    def plan(self, step: int) -> StepPlan:
        if self.rank is not None:
            return StepPlan(theta_min=self.cf, layer_rank=dict.fromkeys(self._layers, self.rank))
        return StepPlan(theta_min=self.cf)

    def decide(self, gain_min, gain_c) -> str:
        return SENT_DENSE if self.cf <= 1 and self.rank is None else SENT_MIN

    def describe(self) -> dict:
        # rank only when set: set-ups and checkpoints from before it existed still match.
        return {"controller": "Static", "cf": self.cf,
                **({} if self.rank is None else {"rank": self.rank})}

    def __repr__(self) -> str:
        return f"Static(rank={self.rank})" if self.rank is not None else f"Static(cf={self.cf:g})"
