"""Accordion (Agarwal et al., MLSys 2021) as a baseline controller.

Each compressed layer switches between a low CF (critical regime: compress little) and a
high CF. Rank 0 accumulates its local gradient of every compressed layer over an
interval (one epoch, or ``interval_steps`` steps); every ``switch_freq`` intervals it
compares each layer's accumulated-gradient norm with the one ``switch_freq`` intervals
earlier: ``|‖old‖ − ‖new‖| / ‖old‖ ≥ η`` is critical (low CF), otherwise high CF. The
first intervals, until the first comparison, are critical. Decisions are broadcast from
rank 0 at every interval end, so every rank uses rank 0's per-layer CFs.

When the learning rate of any param group goes down, every layer goes to the low CF
until the next comparison. The optimizer detects the decay from the param groups, which
all ranks share (``hvd.broadcast_optimizer_state`` and the same schedule).

With PowerSGD the published Accordion switches ranks (rank 4 or 2 critical, rank 1
otherwise): ``low_rank``/``high_rank`` give them, and the plans then carry per-layer ranks
(``StepPlan.layer_rank``) instead of CFs. Ranks, not CFs, because one CF is a different
rank on every layer shape, and a rank is what the paper (and DDP's PowerSGD hook) states.
"""
from __future__ import annotations

import copy
from typing import Mapping

import torch

from .base import Controller, StepPlan, StepRecord, Sync, decision_count, keep_decision


class Accordion(Controller):
    """Per-layer low/high CF switching on critical regimes.

    Args:
        low_cf: CF in critical regimes (>= 1; 1 = dense).
        high_cf: CF otherwise (>= low_cf).
        switch_freq: intervals between comparisons (10 epochs for CNNs, the default; 5 for
            LSTMs).
        interval_steps: steps per accumulation interval; ``None`` means one epoch, and the
            training loop calls ``on_epoch_end()`` (or you ``end_interval()``) at the end of
            every epoch, on every rank.
        eta: threshold η on the relative change of the norm (> 0).
        low_rank, high_rank: PowerSGD ranks of the critical (low CF: the larger rank) and
            the other regime, both or neither (e.g. 4 and 1); the regimes are still told
            apart by low_cf < high_cf, whose values are then not used.

    Example::

        ctrl = Accordion(low_cf=10, high_cf=1000, switch_freq=10)
        opt = gravac.DistributedOptimizer(opt, model.named_parameters(), controller=ctrl)
        for epoch in range(epochs):
            train_one_epoch(...)
            ctrl.end_interval()
    """

    def __init__(self, low_cf: float = 10.0, high_cf: float = 1000.0, switch_freq: int = 10,
                 interval_steps: int | None = None, eta: float = 0.5,
                 low_rank: int | None = None, high_rank: int | None = None):
        for name, value in (("low_cf", low_cf), ("high_cf", high_cf)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 1:
                raise ValueError(f"Accordion({name}={value!r}): {name} must be a number >= 1")
        if high_cf < low_cf:
            raise ValueError(f"Accordion: high_cf ({high_cf}) must be >= low_cf ({low_cf})")
        if isinstance(switch_freq, bool) or not isinstance(switch_freq, int) or switch_freq < 1:
            raise ValueError(f"Accordion(switch_freq={switch_freq!r}): switch_freq must be an "
                             "int >= 1 (intervals between comparisons)")
        if interval_steps is not None and (isinstance(interval_steps, bool) or
                                           not isinstance(interval_steps, int) or interval_steps < 1):
            raise ValueError(f"Accordion(interval_steps={interval_steps!r}): must be an int >= 1, "
                             "or None for one epoch (then call end_interval() every epoch)")
        if isinstance(eta, bool) or not isinstance(eta, (int, float)) or not eta > 0:
            raise ValueError(f"Accordion(eta={eta!r}): eta must be a number > 0")
        for name, value in (("low_rank", low_rank), ("high_rank", high_rank)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ValueError(f"Accordion({name}={value!r}): {name} must be an int >= 1 "
                                 "(a PowerSGD rank), or None to use the CFs")
        if (low_rank is None) != (high_rank is None):
            given = "low_rank" if high_rank is None else "high_rank"
            raise ValueError(f"Accordion({given}={low_rank if high_rank is None else high_rank!r}): "
                             "give both low_rank and high_rank (e.g. 4 and 1), or neither")
        if low_rank is not None and low_rank < high_rank:
            raise ValueError(f"Accordion(low_rank={low_rank!r}): low_rank is the critical "
                             f"regime's rank and must be >= high_rank ({high_rank})")
        if low_rank is not None and not low_cf < high_cf:
            raise ValueError(f"Accordion(low_cf={low_cf!r}): with ranks, keep low_cf < high_cf "
                             "(the defaults): they mark the two regimes")
        self.low_rank, self.high_rank = low_rank, high_rank
        self.uses_ranks = low_rank is not None
        self.low_cf = float(low_cf)
        self.high_cf = float(high_cf)
        self.switch_freq = switch_freq
        self.interval_steps = interval_steps
        self.eta = float(eta)
        self.wants_gradients = False
        self.observes_gradients = True
        self._sync: Sync | None = None
        self._layers: list[str] = []
        self._acc: dict[str, torch.Tensor] = {}
        self._state = {"layer_cf": {}, "intervals": 0, "steps_in_interval": 0,
                       "reference_norms": None, "decisions": []}

    def bind(self, layer_names, sync: Sync) -> None:
        self._sync = sync
        self._layers = list(layer_names)
        self._state["layer_cf"] = {name: self.low_cf for name in self._layers}
        self.wants_gradients = sync.rank == 0   # only rank 0's accumulations are used

    @property
    def layer_cf(self) -> dict[str, float]:
        return dict(self._state["layer_cf"])

    @property
    def decisions(self) -> list[dict]:
        return self._state["decisions"]

    @property
    def decisions_made(self) -> int:
        return decision_count(self._state)

    def plan(self, step: int) -> StepPlan:
        layer_cf = dict(self._state["layer_cf"])
        if self.low_rank is not None:
            return StepPlan(theta_min=self.low_cf, layer_cf=layer_cf, layer_rank={
                name: self.low_rank if cf == self.low_cf else self.high_rank
                for name, cf in layer_cf.items()})
        return StepPlan(theta_min=self.low_cf, layer_cf=layer_cf)

    def observe_gradients(self, grads: Mapping[str, torch.Tensor]) -> None:
        for name, grad in grads.items():
            acc = self._acc.get(name)
            if acc is None:
                self._acc[name] = grad.detach().to(torch.float32, copy=True)
            else:
                acc.add_(grad.detach())

    def on_lr_decay(self) -> None:
        self._state["layer_cf"] = {name: self.low_cf for name in self._layers}

    def end_step(self, record: StepRecord, sync: Sync) -> None:
        self._state["steps_in_interval"] += 1
        if self.interval_steps is not None and self._state["steps_in_interval"] >= self.interval_steps:
            self.end_interval()

    def on_epoch_end(self) -> None:
        # The default interval is one epoch (interval_steps=None): the loop says when.
        if self.interval_steps is None:
            self.end_interval()

    def end_interval(self) -> None:
        """Close an accumulation interval (call on every rank; collective)."""
        if self._sync is None:
            raise RuntimeError("Accordion.end_interval() before the controller was given to "
                               "gravac.DistributedOptimizer")
        proposal = self._evaluate() if self._sync.rank == 0 else None
        # The history stays out of the message (it grew with every interval, a dict per
        # layer each): every rank keeps the same new record.
        state, record = self._sync.broadcast_object(proposal, name="gravac.accordion.interval")
        self._state = {**state, "decisions": self._state["decisions"]}
        if record is not None:
            keep_decision(self._state, record)
        self._acc.clear()

    def _evaluate(self) -> tuple[dict, dict | None]:
        """Rank 0's interval evaluation: (next state without the history, the decision
        record or None)."""
        s = {k: copy.deepcopy(v) for k, v in self._state.items() if k != "decisions"}
        record = None
        index = s["intervals"]
        norms = {name: float(self._acc[name].norm()) if name in self._acc else 0.0
                 for name in self._layers}
        s["intervals"] = index + 1
        s["steps_in_interval"] = 0
        if index % self.switch_freq == 0:
            old = s["reference_norms"]
            if old is not None:
                layer_cf = {}
                for name in self._layers:
                    ratio = abs(old[name] - norms[name]) / old[name] if old[name] > 0 else float("inf")
                    layer_cf[name] = self.low_cf if ratio >= self.eta else self.high_cf
                s["layer_cf"] = layer_cf
                record = {"interval": index, "layer_cf": dict(layer_cf),
                          "ratios": {n: abs(old[n] - norms[n]) / old[n] if old[n] > 0
                                     else None for n in self._layers}}
            s["reference_norms"] = norms
        return s, record

    def state_dict(self) -> dict:
        return {"hyper": self.describe(), "state": copy.deepcopy(self._state),
                "accumulators": {k: v.clone() for k, v in self._acc.items()}}

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state, dict) or "state" not in state:
            raise ValueError("not an Accordion state dict: expected keys 'hyper' and 'state'")
        if state.get("hyper", self.describe()) != self.describe():
            raise ValueError(f"Accordion state was saved with {state['hyper']}, "
                             f"but this controller is {self.describe()}")
        self._state = copy.deepcopy(state["state"])
        self._acc = {k: v.clone() for k, v in state.get("accumulators", {}).items()}

    def describe(self) -> dict:
        # Ranks only when set: set-ups and checkpoints from before they existed still match.
        ranks = {} if self.low_rank is None else {"low_rank": self.low_rank,
                                                   "high_rank": self.high_rank}
        return {"controller": "Accordion", "low_cf": self.low_cf, "high_cf": self.high_cf,
                "switch_freq": self.switch_freq, "interval_steps": self.interval_steps,
                "eta": self.eta, **ranks}

    def __repr__(self) -> str:
        if self.low_rank is not None:
            return (f"Accordion(low_rank={self.low_rank}, high_rank={self.high_rank}, "
                    f"switch_freq={self.switch_freq}, interval_steps={self.interval_steps}, "
                    f"eta={self.eta})")
        return (f"Accordion(low_cf={self.low_cf:g}, high_cf={self.high_cf:g}, "
                f"switch_freq={self.switch_freq}, interval_steps={self.interval_steps}, eta={self.eta})")
