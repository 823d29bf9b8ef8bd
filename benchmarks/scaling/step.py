"""The model's step: t_step = t_compute + t_local + t_comm, no overlap (docs/SCALING.md §1.1).

Example::

    t = step_time(StepCase("shared_index", theta=100), model, Layout(8, 8), net, costs, 0.05)
    t.total, t.comm                                  # seconds
"""
from __future__ import annotations

from dataclasses import dataclass

from .local import CompressionCosts, local_time
from .network import Layout, Network
from .rounds import StepCase, comm_time
from .shapes import ModelShapes


@dataclass(frozen=True)
class StepTime:
    compute: float
    local: float
    comm: float

    @property
    def total(self) -> float:
        return self.compute + self.local + self.comm


def step_time(case: StepCase, model: ModelShapes, layout: Layout, net: Network,
              costs: CompressionCosts, t_compute: float,
              solo: CompressionCosts | None = None) -> StepTime:
    """t_step = t_compute + t_local + t_comm (no overlap)."""
    return StepTime(t_compute, local_time(case, model, layout, costs, solo),
                    comm_time(case, model, layout, net))
