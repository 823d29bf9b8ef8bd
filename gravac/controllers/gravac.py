"""The GraVAC controller (Tyagi & Swany, IEEE CLOUD 2023; docs/ALGORITHM.md §6).

Per step it compares two compression levels of the same gradient: θmin and a candidate
θc > θmin (multi-level: the optimizer compresses the θmin values further by θc/θmin).
With the EWMA-smoothed whole-model gains δmin, δc, agreed across ranks, it sends the
candidate if δc ≥ ε, else θmin if δmin ≥ ε, else dense. Every ``window`` steps rank 0
evaluates: θmin scales up to θc when their gains are within ω, θc climbs the ladder, and
when the two best compression throughputs (T_sys · gain) are within ω the controller
settles at the smaller of their CFs. The evaluation is broadcast so every rank adopts it.

Points the paper leaves to the implementation, settled here (docs/ALGORITHM.md §7):

* The first window is a warm-up at θmin only; its evaluation neither scales θmin nor
  advances θc (the candidate has not been measured yet), but records throughput.
* When θc changes, δc restarts (its first new sample is taken as is); when θmin scales
  up to θc, δmin continues from δc (the same CF was being measured).
* T_compress uses the smoothed gain of what was sent (δc, δmin, or 1 for dense).
* Once settled, CFs stay fixed; the per-step ε rule still falls back to θmin or dense.
* Extensions (issue 5: on a fast link GraVAC must not slow training down): when dense has
  the best compression throughput of all measured CFs, GraVAC settles on dense; and
  ``dense_probe_steps`` > 0 sends the last steps of the warm-up window dense so that dense
  throughput is measured at all (otherwise it is only measured when gains fall below ε).
  The default 0 keeps the warm-up at θmin only (docs/ALGORITHM.md §8, E2 and E3).
* Extension ``scale_up="epsilon"`` (default ``"gain"``: the paper's rule; docs/ALGORITHM.md
  §8, E1): θmin also
  scales up to θc when the candidate's smoothed gain cleared ε at the window's end, i.e.
  when the candidate was what the step sent. With error feedback the gains of adjacent
  rungs often differ by more than ω (e.g. 0.93 at 10x, 0.88 at 20x) although both are
  well above ε; the spec's rule then keeps θmin at θmin₀ for good, every step pays the
  first-level compression at θmin₀ (on CPU the most expensive part), and once θc has
  climbed past what the gradients bear the fallback is θmin₀ instead of the last
  candidate that was sent. With this rule, a scale-up also drops the throughputs of CFs
  below the new θmin from the table (measured with another first-level cost; the
  saturation rule would otherwise settle back on them). Measured in docs/BENCHMARKS.md.
"""
from __future__ import annotations

import copy
import math

from .base import SENT_CANDIDATE, SENT_DENSE, SENT_MIN, Controller, StepPlan, StepRecord, Sync
from .ladder import POLICIES, build_ladder, next_rung

SCALE_UP_RULES = ("gain", "epsilon")


def default_alpha(world_size: int) -> float:
    """The paper's EWMA weight: clamp(N / 100, 0.01, 1) for N ranks."""
    return min(1.0, max(0.01, world_size / 100.0))


class GraVAC(Controller):
    """Adaptive CF controller of GraVAC.

    Args:
        theta_min: initial minimum CF θmin₀ (>= 1).
        theta_max: largest CF tried (>= theta_min).
        epsilon: gain threshold ε in (0, 1]: send a level only if its gain is at least ε.
        omega: relative tolerance ω >= 0 for θmin scale-up and throughput saturation.
        window: steps per evaluation (>= 1).
        policy: ladder of candidate CFs, ``"exponential"`` or ``"geometric"``.
        alpha: EWMA weight in (0, 1]; default clamp(N/100, 0.01, 1) for N ranks.
        dense_probe_steps: send the last steps of the warm-up window dense (extension).
        scale_up: when θmin scales up to θc at a window's end: ``"gain"`` (the paper:
            their gains are within ω) or ``"epsilon"`` (also when δc >= ε; extension).

    Example::

        ctrl = GraVAC(theta_min=10, theta_max=1000, epsilon=0.7, window=500)
        opt = gravac.DistributedOptimizer(opt, model.named_parameters(), compressor="topk",
                                          controller=ctrl, batch_size=32)
        ...
        ctrl.decisions[-1]   # {'step': ..., 'theta_min': ..., 'theta_c': ..., ...}
    """

    def __init__(self, theta_min: float = 10, theta_max: float = 1000, epsilon: float = 0.7,
                 omega: float = 0.01, window: int = 500, policy: str = "exponential",
                 alpha: float | None = None, dense_probe_steps: int = 0,
                 scale_up: str = "gain"):
        _check_number("theta_min", theta_min, "a number >= 1", lambda v: v >= 1)
        _check_number("theta_max", theta_max, f"a number >= theta_min ({theta_min})",
                      lambda v: v >= theta_min)
        _check_number("epsilon", epsilon, "in (0, 1]", lambda v: 0 < v <= 1)
        _check_number("omega", omega, "a number >= 0", lambda v: v >= 0)
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"GraVAC(window={window!r}): window must be an int >= 1 (steps)")
        if policy not in POLICIES:
            raise ValueError(f"GraVAC(policy={policy!r}): policy must be one of "
                             f"{', '.join(POLICIES)}")
        if alpha is not None:
            _check_number("alpha", alpha, "in (0, 1] or None", lambda v: 0 < v <= 1)
        if isinstance(dense_probe_steps, bool) or not isinstance(dense_probe_steps, int) \
                or not 0 <= dense_probe_steps < window:
            raise ValueError(f"GraVAC(dense_probe_steps={dense_probe_steps!r}): must be an int "
                             f"in [0, window) = [0, {window})")
        if scale_up not in SCALE_UP_RULES:
            raise ValueError(f"GraVAC(scale_up={scale_up!r}): must be one of "
                             f"{', '.join(SCALE_UP_RULES)}")
        self.scale_up = scale_up
        self.theta_min0 = float(theta_min)
        self.theta_max = float(theta_max)
        self.epsilon = float(epsilon)
        self.omega = float(omega)
        self.window = window
        self.policy = policy
        self.alpha_option = alpha
        self.dense_probe_steps = dense_probe_steps
        self.ladder = build_ladder(self.theta_min0, self.theta_max, policy)
        self._state = self._initial_state(alpha if alpha is not None else default_alpha(1))

    def _initial_state(self, alpha: float) -> dict:
        return {
            "alpha": alpha,
            "theta_min": self.theta_min0,
            "theta_c": next_rung(self.ladder, self.theta_min0),
            "delta_min": None,
            "delta_c": None,
            "settled": False,
            "table": {},            # CF -> mean T_compress in the latest window it was used
            "window_sums": {},      # CF -> [sum, count] of T_compress in the current window
            "candidate_measured": False,   # δc got a sample in the current window
            "decisions": [],
        }

    # -- set-up -----------------------------------------------------------------------
    def bind(self, layer_names, sync: Sync) -> None:
        if self.alpha_option is None:
            self._state["alpha"] = default_alpha(sync.size)

    def rebind(self, layer_names, sync: Sync) -> None:
        # The default α follows the number of ranks; everything learned is kept. (Window
        # means that straddle the reset mix step times of both world sizes.)
        super().rebind(layer_names, sync)
        self.bind(layer_names, sync)

    # -- read-only views ----------------------------------------------------------------
    @property
    def theta_min(self) -> float:
        return self._state["theta_min"]

    @property
    def theta_c(self) -> float:
        return self._state["theta_c"]

    @property
    def delta_min(self):
        return self._state["delta_min"]

    @property
    def delta_c(self):
        return self._state["delta_c"]

    def summary(self) -> dict:
        return {"delta_min": self.delta_min, "delta_c": self.delta_c}

    @property
    def settled(self) -> bool:
        return self._state["settled"]

    @property
    def alpha(self) -> float:
        return self._state["alpha"]

    @property
    def table(self) -> dict:
        return dict(self._state["table"])

    @property
    def decisions(self) -> list[dict]:
        return self._state["decisions"]

    # -- per step -----------------------------------------------------------------------
    def _candidate_active(self, step: int) -> bool:
        return step >= self.window and self.theta_c > self.theta_min

    def plan(self, step: int) -> StepPlan:
        if self.window - self.dense_probe_steps <= step < self.window:
            return StepPlan(theta_min=1.0)       # measuring dense throughput (warm-up's end)
        theta_c = self.theta_c if self._candidate_active(step) else None
        return StepPlan(theta_min=self.theta_min, theta_c=theta_c,
                        needs_gains=self.theta_min > 1)

    def _ewma(self, old, sample):
        if old is None:
            return float(sample)
        a = self._state["alpha"]
        return (1 - a) * old + a * float(sample)

    def decide(self, gain_min, gain_c) -> str:
        s = self._state
        if gain_min is not None:
            s["delta_min"] = self._ewma(s["delta_min"], gain_min)
        if gain_c is not None:
            s["delta_c"] = self._ewma(s["delta_c"], gain_c)
            s["candidate_measured"] = True
            if s["delta_c"] >= self.epsilon:
                return SENT_CANDIDATE
        if s["delta_min"] is not None and s["delta_min"] >= self.epsilon:
            return SENT_MIN
        return SENT_DENSE

    def end_step(self, record: StepRecord, sync: Sync) -> None:
        s = self._state
        if record.t_iter is not None and record.t_iter > 0 \
                and record.sent in (SENT_CANDIDATE, SENT_MIN, SENT_DENSE):
            t_sys = (record.samples or 1.0) / record.t_iter
            if record.sent == SENT_CANDIDATE:
                gain = s["delta_c"]
            elif record.sent == SENT_MIN:
                gain = s["delta_min"]
            else:
                gain = 1.0
            entry = s["window_sums"].setdefault(_key(record.cf), [0.0, 0])
            entry[0] += t_sys * (1.0 if gain is None else gain)
            entry[1] += 1
        if (record.step + 1) % self.window == 0:
            proposal = self.evaluate(record.step) if sync.rank == 0 else None
            # Rank 0's evaluation (timings are rank-local) becomes every rank's state. The
            # history stays out of the message: every rank appends the same new record.
            state, record_ = sync.broadcast_object(proposal, name="gravac.controller.window")
            decisions = self._state["decisions"]
            decisions.append(record_)
            self._state = {**state, "decisions": decisions}

    # -- per window ---------------------------------------------------------------------
    def evaluate(self, step: int) -> tuple[dict, dict]:
        """Rank 0's window evaluation: (next state without the history, decision record).

        Nothing is adopted here; ``end_step`` adopts what rank 0 broadcasts.
        """
        s = {k: copy.deepcopy(v) for k, v in self._state.items() if k != "decisions"}
        measured_min, measured_c = s["delta_min"], s["delta_c"]
        for cf, (total, count) in s["window_sums"].items():
            s["table"][cf] = total / count
        s["window_sums"] = {}
        scaled_up = advanced = False
        if not s["settled"] and s["candidate_measured"] and s["theta_c"] > s["theta_min"]:
            d_min, d_c = s["delta_min"], s["delta_c"]
            close = d_min is not None and d_c is not None and d_min > 0 \
                and abs(d_min - d_c) / d_min <= self.omega
            sent_candidate = self.scale_up == "epsilon" and d_c is not None \
                and d_c >= self.epsilon
            if close or sent_candidate:
                s["theta_min"] = s["theta_c"]
                s["delta_min"] = d_c      # δc measured exactly this CF
                scaled_up = True
                if self.scale_up == "epsilon":
                    # Throughputs of CFs below the new θmin were measured while every step
                    # also paid the cheaper-CF first level; they are not comparable with
                    # what comes next, and GraVAC does not go back there (dense stays).
                    s["table"] = {cf: v for cf, v in s["table"].items()
                                  if cf == 1.0 or cf >= s["theta_min"]}
            new_c = next_rung(self.ladder, s["theta_c"])
            if new_c != s["theta_c"]:
                s["theta_c"], s["delta_c"] = new_c, None
            advanced = True
        if not s["settled"]:
            ideal = saturation_point(s["table"], self.omega)
            if ideal is not None:
                s["theta_c"] = ideal
                s["theta_min"] = min(s["theta_min"], ideal)
                s["delta_c"] = None
                s["settled"] = True
        s["candidate_measured"] = False
        return s, {
            "step": step,
            "theta_min": s["theta_min"],
            "theta_c": s["theta_c"],
            "delta_min": measured_min,      # the gains this window ended with
            "delta_c": measured_c,
            "table": dict(s["table"]),
            "settled": s["settled"],
            "scaled_up": scaled_up,
            "advanced": advanced,
        }

    # -- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"hyper": self.describe(), "state": copy.deepcopy(self._state)}

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state, dict) or "state" not in state:
            raise ValueError("not a GraVAC state dict: expected keys 'hyper' and 'state'")
        mine, theirs = self.describe(), state.get("hyper", {})
        if theirs:   # states saved before an option existed used its default
            theirs = {"dense_probe_steps": 0, "scale_up": "gain", **theirs}
        if theirs and theirs != mine:
            diff = {k: (theirs.get(k), mine.get(k)) for k in mine if theirs.get(k) != mine.get(k)}
            raise ValueError(f"GraVAC state was saved with other hyperparameters "
                             f"(saved, current): {diff}")
        self._state = copy.deepcopy(state["state"])

    def describe(self) -> dict:
        return {"controller": "GraVAC", "theta_min": self.theta_min0, "theta_max": self.theta_max,
                "epsilon": self.epsilon, "omega": self.omega, "window": self.window,
                "policy": self.policy, "alpha": self.alpha_option,
                "dense_probe_steps": self.dense_probe_steps, "scale_up": self.scale_up}

    def __repr__(self) -> str:
        return (f"GraVAC(theta_min={self.theta_min0:g}, theta_max={self.theta_max:g}, "
                f"epsilon={self.epsilon}, omega={self.omega}, window={self.window}, "
                f"policy={self.policy!r})")


def saturation_point(table: dict, omega: float):
    """Where compression throughput saturates, or None while it still grows.

    The smaller CF of the two best compression throughputs when they are within ω
    (docs/ALGORITHM.md §6). Extension (§8, E3): when dense (CF 1) has the best compression throughput of all
    measured CFs, compression does not pay for itself (its speed-up is smaller than the
    gradient energy it drops, since every gain is <= 1), so the answer is dense.

    >>> saturation_point({1280.0: 1029.9, 2000.0: 1035.4, 640.0: 900.0}, 0.01)
    1280.0
    >>> saturation_point({10.0: 500.0, 20.0: 700.0}, 0.01) is None
    True
    >>> saturation_point({1.0: 1100.0, 10.0: 500.0}, 0.01)
    1.0
    """
    if len(table) < 2:
        return None
    (cf1, t1), (cf2, t2) = sorted(table.items(), key=lambda kv: kv[1], reverse=True)[:2]
    best = max(t1, t2)
    if best <= 0:
        return None
    if float(cf1) == 1.0:
        return 1.0
    if abs(t1 - t2) / best <= omega:
        return min(cf1, cf2)
    return None


def _key(cf: float) -> float:
    return float(cf)


def _check_number(name, value, allowed, ok):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) \
            or not ok(value):
        raise ValueError(f"GraVAC({name}={value!r}): {name} must be {allowed}")
