"""The GraVAC controller (Tyagi & Swany, IEEE CLOUD 2023; docs/ALGORITHM.md §6).

Per step it compares two compression levels of the same gradient: θmin and a candidate
θc > θmin (multi-level: the optimizer compresses the θmin values further by θc/θmin).
With the EWMA-smoothed whole-model gains δmin, δc, agreed across ranks, it sends the
candidate if δc ≥ ε, else θmin if δmin ≥ ε, else dense. Every ``window`` steps rank 0
evaluates (the paper's CheckGraVAC): θmin scales up to θc when their gains are within ω,
θc climbs the ladder, and when the two best compression throughputs (T_sys · gain) are
within ω of the second best (Algorithm 1, line 36), θc becomes θideal, the lower of their
CFs (the paper's text). The evaluation runs every window on
the current table, so its answer follows the table: nothing is final. It is broadcast so
every rank adopts it.

``GraVAC()`` with default arguments is the paper's Algorithm 1. Points the paper leaves
open are settled in docs/ALGORITHM.md §7: δc restarts when θc moves; when θmin scales up
to θc, δmin continues from δc; T_compress uses the smoothed gain of what was sent (1 for
dense); a dense step's t_iter excludes the compression it threw away (the optimizer does
that); θideal is always a CF of the ladder (dense is reached per step through ε).

Extensions, each opt-in and measured in docs/notes/2026-11-benchmarks.md (docs/ALGORITHM.md §8):

* ``scale_up="epsilon"`` (E1): θmin also scales up to θc when the candidate's smoothed gain
  cleared ε at the window's end (the candidate was what the steps sent). With error
  feedback the gains of adjacent rungs often differ by more than ω although both are well
  above ε, and then the paper's rule keeps θmin at θmin₀ for good. A scale-up also drops
  the throughputs of CFs below the new θmin from the table (measured with a cheaper first
  level; the saturation rule would otherwise settle back on them).
* ``dense_probe_steps=N`` (E2): the last N steps of the first window are sent dense, so
  dense throughput is in the table from the first evaluation.
* ``settle_dense=True`` (E3): when dense's compression throughput beats the best CF's by
  more than ω, or when no step of a window cleared ε (every step went dense after paying
  for both compression levels), train dense without compressing; every ``dense_reprobe``
  dense windows, one window runs the ladder again (θmin and the next candidate, with the
  gain averages restarted from that window's samples) so a phase change is noticed.
* ``saturation="second_best"``: θideal is the CF of the second best throughput, as
  Algorithm 1's line 37 writes it (ct[-2]), which is the larger CF when the larger CF is
  the slightly slower one. The default keeps the paper's text, "the lower CF" of the two:
  of two CFs that train equally fast, the one that leaves less error in the residual.
* ``warmup_windows=W``: the first W windows run at θmin only (the paper: none).
* ``gain_measure="norm"``: Σ‖g_c‖ / Σ‖g‖ (the authors' public code) instead of the energy
  ratio Σ‖g_c‖² / Σ‖g_ef‖² of Algorithm 1; the optimizer measures it (``StepPlan``).
* ``decide="previous"`` (E7): a step sends the level that the smoothed gains agreed up to
  the previous step choose (the same rule: δc ≥ ε, else δmin ≥ ε, else dense; dense on the
  very first step, before any gain was measured), announced in the plan
  (``StepPlan.decided``) so that the optimizer can send each layer as soon as backward
  produced it (``overlap=True``). This step's gains still update δmin and δc. The paper
  (``"current"``) decides on the gains of the step itself, known only after every layer
  is compressed: a one-step lag in exchange for overlap.
"""
from __future__ import annotations

import copy
import math

from ..util.choices import one_of
from .base import (GAIN_MEASURES, SENT_CANDIDATE, SENT_DENSE, SENT_MIN, Controller, StepPlan,
                   StepRecord, Sync, decision_count, keep_decision)
from .ladder import POLICIES, build_ladder, next_rung

SCALE_UP_RULES = ("gain", "epsilon")
#: θideal when the two best compression throughputs are within ω of the second best: the
#: lower of their CFs (the paper's text) or the second best's CF (Algorithm 1, line 37).
SATURATION_RULES = ("lower_cf", "second_best")
#: Which gains decide what a step sends: this step's (Algorithm 1) or the previous step's (E7).
DECIDE_RULES = ("current", "previous")


def default_alpha(world_size: int) -> float:
    """The paper's EWMA weight: clamp(N / 100, 0.01, 1) for N ranks."""
    return min(1.0, max(0.01, world_size / 100.0))


class GraVAC(Controller):
    """Adaptive CF controller of GraVAC; the defaults are the paper's Algorithm 1.

    Args:
        theta_min: initial minimum CF θmin₀ (>= 1).
        theta_max: largest CF tried (>= theta_min).
        epsilon: gain threshold ε in (0, 1]: send a level only if its gain is at least ε.
        omega: relative tolerance ω >= 0 for θmin scale-up and throughput saturation.
        window: steps per evaluation (>= 1).
        policy: ladder of candidate CFs, ``"exponential"`` or ``"geometric"``.
        alpha: EWMA weight in (0, 1]; default clamp(N/100, 0.01, 1) for N ranks.
        gain_measure: ``"energy"`` (Σ‖g_c‖²/Σ‖g_ef‖², Algorithm 1) or ``"norm"``
            (Σ‖g_c‖/Σ‖g‖, the authors' code; the Random-k special case needs it).
        warmup_windows: windows at θmin only before candidates are evaluated (paper: 0).
        dense_probe_steps: send the last steps of the first window dense (extension E2).
        scale_up: when θmin scales up to θc at a window's end: ``"gain"`` (the paper:
            their gains are within ω) or ``"epsilon"`` (also when δc >= ε; extension E1).
        settle_dense: train dense while dense's compression throughput beats the best
            CF's by more than ω, or after a window in which no step cleared ε
            (extension E3).
        dense_reprobe: with ``settle_dense``, dense windows between two windows that run
            the ladder again (>= 1).
        decide: ``"current"`` (the paper: this step's agreed gains decide what it sends)
            or ``"previous"`` (the smoothed gains up to the previous step decide, so the
            level is known before backward; extension E7).
        saturation: when the best compression throughput is within ω of the second best
            (Algorithm 1, line 36), θideal is ``"lower_cf"`` the lower CF of the two (the
            paper's text) or ``"second_best"`` the second best's CF (line 37 as written).

    Example::

        ctrl = GraVAC(theta_min=10, theta_max=1000, epsilon=0.7, window=500)
        opt = gravac.DistributedOptimizer(opt, model.named_parameters(), compressor="topk",
                                          controller=ctrl, batch_size=32)
        ...
        ctrl.decisions[-1]   # {'step': ..., 'theta_min': ..., 'theta_c': ..., ...}
    """

    def __init__(self, theta_min: float = 10, theta_max: float = 1000, epsilon: float = 0.7,
                 omega: float = 0.01, window: int = 500, policy: str = "exponential",
                 alpha: float | None = None, gain_measure: str = "energy",
                 warmup_windows: int = 0, dense_probe_steps: int = 0, scale_up: str = "gain",
                 settle_dense: bool = False, dense_reprobe: int = 4, decide: str = "current",
                 saturation: str = "lower_cf"):
        _check_number("theta_min", theta_min, "a number >= 1", lambda v: v >= 1)
        _check_number("theta_max", theta_max, f"a number >= theta_min ({theta_min})",
                      lambda v: v >= theta_min)
        _check_number("epsilon", epsilon, "in (0, 1]", lambda v: 0 < v <= 1)
        _check_number("omega", omega, "a number >= 0", lambda v: v >= 0)
        _check_int("window", window, "an int >= 1 (steps)", lambda v: v >= 1)
        _check_choice("policy", policy, POLICIES)
        if alpha is not None:
            _check_number("alpha", alpha, "in (0, 1] or None", lambda v: 0 < v <= 1)
        _check_choice("gain_measure", gain_measure, GAIN_MEASURES)
        _check_int("warmup_windows", warmup_windows, "an int >= 0 (windows; the paper: 0)",
                   lambda v: v >= 0)
        _check_int("dense_probe_steps", dense_probe_steps,
                   f"an int in [0, window) = [0, {window})", lambda v: 0 <= v < window)
        _check_choice("scale_up", scale_up, SCALE_UP_RULES)
        if not isinstance(settle_dense, bool):
            raise ValueError(f"GraVAC(settle_dense={settle_dense!r}): settle_dense must be "
                             "true or false")
        _check_int("dense_reprobe", dense_reprobe, "an int >= 1 (windows)", lambda v: v >= 1)
        _check_choice("decide", decide, DECIDE_RULES)
        _check_choice("saturation", saturation, SATURATION_RULES)
        self.theta_min0 = float(theta_min)
        self.theta_max = float(theta_max)
        self.epsilon = float(epsilon)
        self.omega = float(omega)
        self.window = window
        self.policy = policy
        self.alpha_option = alpha
        self.gain_measure = gain_measure
        self.warmup_windows = warmup_windows
        self.dense_probe_steps = dense_probe_steps
        self.scale_up = scale_up
        self.settle_dense = settle_dense
        self.dense_reprobe = dense_reprobe
        self.decide_rule = decide
        self.saturation = saturation
        self.ladder = build_ladder(self.theta_min0, self.theta_max, policy)
        self._state = self._initial_state(alpha if alpha is not None else default_alpha(1))

    def _initial_state(self, alpha: float) -> dict:
        return {
            "alpha": alpha,
            "theta_min": self.theta_min0,
            "theta_c": next_rung(self.ladder, self.theta_min0),
            "delta_min": None,
            "delta_c": None,
            "settled": False,       # the last evaluation found saturation (θc = θideal)
            "on_dense": False,      # settle_dense: training dense (E3)
            "dense_windows": 0,     # settle_dense: dense windows since the last re-probe
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
        """Whether the latest evaluation found compression throughput saturated."""
        return self._state["settled"]

    @property
    def on_dense(self) -> bool:
        """Whether ``settle_dense`` has GraVAC training dense now."""
        return self._state["on_dense"]

    @property
    def alpha(self) -> float:
        return self._state["alpha"]

    @property
    def table(self) -> dict:
        return dict(self._state["table"])

    @property
    def decisions(self) -> list[dict]:
        return self._state["decisions"]

    @property
    def decisions_made(self) -> int:
        return decision_count(self._state)

    # -- per step -----------------------------------------------------------------------
    def _candidate_active(self, step: int) -> bool:
        return step >= self.warmup_windows * self.window and self.theta_c > self.theta_min

    def plan(self, step: int) -> StepPlan:
        if self.window - self.dense_probe_steps <= step < self.window:
            return StepPlan(theta_min=1.0)       # measuring dense throughput (E2)
        if self._state["on_dense"]:
            return StepPlan(theta_min=1.0)       # settled on dense (E3) until the re-probe
        theta_c = self.theta_c if self._candidate_active(step) else None
        decided = None
        if self.decide_rule == "previous" and self.theta_min > 1:
            decided = self._rule(self._state["delta_min"],
                                 self._state["delta_c"] if theta_c is not None else None)
        return StepPlan(theta_min=self.theta_min, theta_c=theta_c,
                        needs_gains=self.theta_min > 1, gain_measure=self.gain_measure,
                        decided=decided)

    def _rule(self, delta_min, delta_c) -> str:
        """Algorithm 1's choice from smoothed gains (None: not measured yet)."""
        if delta_c is not None and delta_c >= self.epsilon:
            return SENT_CANDIDATE
        if delta_min is not None and delta_min >= self.epsilon:
            return SENT_MIN
        return SENT_DENSE

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
        return self._rule(s["delta_min"], s["delta_c"] if gain_c is not None else None)

    def end_step(self, record: StepRecord, sync: Sync) -> None:
        """Record T_compress of what the step sent (``record.t_iter`` of a dense step must
        exclude the compression it did not use: Algorithm 1, line 23); every ``window``
        steps, adopt rank 0's evaluation."""
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
            self._state = {**state, "decisions": self._state["decisions"]}
            keep_decision(self._state, record_)

    # -- per window ---------------------------------------------------------------------
    def evaluate(self, step: int) -> tuple[dict, dict]:
        """Rank 0's window evaluation: (next state without the history, decision record).

        Nothing is adopted here; ``end_step`` adopts what rank 0 broadcasts.
        """
        s = {k: copy.deepcopy(v) for k, v in self._state.items() if k != "decisions"}
        measured_min, measured_c = s["delta_min"], s["delta_c"]
        theta_c0 = s["theta_c"]
        # Every step of the window sent dense: no level cleared ε, so both compression
        # passes were pure cost (E3 acts on it; the paper's rule keeps compressing).
        window_went_dense = bool(s["window_sums"]) and \
            all(float(cf) <= 1.0 for cf in s["window_sums"])
        for cf, (total, count) in s["window_sums"].items():
            s["table"][cf] = total / count
        s["window_sums"] = {}
        scaled_up = advanced = reprobe = False
        if s["on_dense"]:
            # E3: a dense window. After dense_reprobe of them, the next window runs the
            # ladder again (plan() sees on_dense False) and its evaluation decides anew.
            s["dense_windows"] += 1
            if s["dense_windows"] >= self.dense_reprobe:
                s["on_dense"], s["dense_windows"], reprobe = False, 0, True
                # No gains were measured on dense: averages from before would decide the
                # re-probe (with α = N/100 for many windows), not the gradients of now.
                s["delta_min"] = s["delta_c"] = None
        else:
            if s["candidate_measured"] and s["theta_c"] > s["theta_min"]:
                scaled_up = self._scale_up(s)
            # θc climbs after its window (not in a warm-up, where it was not measured);
            # also when saturation made it θmin, so that a table that stops saturating
            # sends the ladder on rather than leaving GraVAC at θmin with no candidate.
            if s["candidate_measured"] or s["theta_c"] <= s["theta_min"]:
                s["theta_c"] = next_rung(self.ladder, s["theta_c"])
                advanced = True
            # CheckGraVAC on the current table, every window: the answer may change.
            ideal = saturation_point(s["table"], self.omega, self.saturation)
            s["settled"] = ideal is not None
            if ideal is not None:
                s["theta_c"] = ideal
                if ideal < s["theta_min"]:
                    # θmin moves down to a CF whose gain δmin did not follow (it tracked
                    # the higher one): it restarts, as δc does when θc moves.
                    s["theta_min"], s["delta_min"] = ideal, None
            if self.settle_dense and (window_went_dense or dense_pays(s["table"], self.omega)):
                s["on_dense"], s["dense_windows"] = True, 0
        if s["theta_c"] != theta_c0:
            s["delta_c"] = None       # a new candidate: its gain restarts
        s["candidate_measured"] = False
        return s, {
            "step": step,
            "theta_min": s["theta_min"],
            "theta_c": s["theta_c"],
            "delta_min": measured_min,      # the gains this window ended with
            "delta_c": measured_c,
            "table": dict(s["table"]),
            "settled": s["settled"],
            "on_dense": s["on_dense"],
            "reprobe": reprobe,
            "scaled_up": scaled_up,
            "advanced": advanced,
        }

    def _scale_up(self, s: dict) -> bool:
        """θmin ← θc when the two gains agree within ω (or, E1, when δc cleared ε)."""
        d_min, d_c = s["delta_min"], s["delta_c"]
        close = d_min is not None and d_c is not None and d_min > 0 \
            and abs(d_min - d_c) / d_min <= self.omega
        sent_candidate = self.scale_up == "epsilon" and d_c is not None and d_c >= self.epsilon
        if not (close or sent_candidate):
            return False
        s["theta_min"] = s["theta_c"]
        s["delta_min"] = d_c      # δc measured exactly this CF
        if self.scale_up == "epsilon":
            # Throughputs of CFs below the new θmin were measured while every step also
            # paid the cheaper-CF first level; they are not comparable with what comes
            # next, and GraVAC does not go back there (dense stays).
            s["table"] = {cf: v for cf, v in s["table"].items()
                          if cf == 1.0 or cf >= s["theta_min"]}
        return True

    # -- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"hyper": self.describe(), "state": copy.deepcopy(self._state)}

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state, dict) or "state" not in state:
            raise ValueError("not a GraVAC state dict: expected keys 'hyper' and 'state'")
        mine, theirs = self.describe(), state.get("hyper", {})
        if theirs:
            # States saved before an option existed ran with what the code then did: a
            # warm-up window and a permanent settling that included dense; the paper's
            # decision on the step's own gains.
            theirs = {"dense_probe_steps": 0, "scale_up": "gain", "gain_measure": "energy",
                      "warmup_windows": 1, "settle_dense": "permanent (before the extensions)",
                      "dense_reprobe": None, "decide": "current",
                      "saturation": "lower_cf", **theirs}
        if theirs and theirs != mine:
            diff = {k: (theirs.get(k), mine.get(k)) for k in mine if theirs.get(k) != mine.get(k)}
            raise ValueError(f"GraVAC state was saved with other hyperparameters "
                             f"(saved, current): {diff}")
        self._state = copy.deepcopy(state["state"])

    def describe(self) -> dict:
        return {"controller": "GraVAC", "theta_min": self.theta_min0, "theta_max": self.theta_max,
                "epsilon": self.epsilon, "omega": self.omega, "window": self.window,
                "policy": self.policy, "alpha": self.alpha_option,
                "gain_measure": self.gain_measure, "warmup_windows": self.warmup_windows,
                "dense_probe_steps": self.dense_probe_steps, "scale_up": self.scale_up,
                "settle_dense": self.settle_dense, "dense_reprobe": self.dense_reprobe,
                "decide": self.decide_rule, "saturation": self.saturation}

    def __repr__(self) -> str:
        return (f"GraVAC(theta_min={self.theta_min0:g}, theta_max={self.theta_max:g}, "
                f"epsilon={self.epsilon}, omega={self.omega}, window={self.window}, "
                f"policy={self.policy!r})")


def saturation_point(table: dict, omega: float, rule: str = "lower_cf"):
    """θideal, where compression throughput saturates, or None while it still grows.

    The paper's CheckGraVAC (Algorithm 1, lines 36-37): with ct the throughputs sorted
    ascending, saturated when |ct[-1] - ct[-2]| / ct[-2] <= ω; θideal is the lower CF of the
    two (``rule="lower_cf"``, the paper's text) or the CF of ct[-2] (``"second_best"``, line
    37 as written). Only CFs of the ladder take part: dense (CF 1) may be in the table, but
    θideal sets the candidate θc, which dense cannot be (dense is reached per step through
    ε, or by ``dense_pays`` with ``settle_dense``).

    >>> saturation_point({1280.0: 1029.9, 2000.0: 1035.4, 640.0: 900.0}, 0.01)
    1280.0
    >>> saturation_point({10.0: 500.0, 20.0: 700.0}, 0.01) is None
    True
    >>> saturation_point({1.0: 1100.0, 10.0: 500.0, 20.0: 502.0}, 0.01)
    10.0
    >>> saturation_point({10.0: 502.0, 20.0: 500.0}, 0.01)
    10.0
    >>> saturation_point({10.0: 502.0, 20.0: 500.0}, 0.01, "second_best")
    20.0
    """
    compressed = {cf: t for cf, t in table.items() if float(cf) > 1.0}
    if len(compressed) < 2:
        return None
    (cf1, t1), (cf2, t2) = sorted(compressed.items(), key=lambda kv: kv[1], reverse=True)[:2]
    if t2 <= 0 or abs(t1 - t2) / t2 > omega:
        return None
    return cf2 if rule == "second_best" else min(cf1, cf2)


def dense_pays(table: dict, omega: float) -> bool:
    """E3's test: dense's compression throughput beats every measured CF's by more than ω.

    >>> dense_pays({1.0: 1100.0, 10.0: 500.0}, 0.01)
    True
    >>> dense_pays({1.0: 1000.0, 10.0: 995.0}, 0.01)   # within ω: compression stays
    False
    >>> dense_pays({10.0: 500.0}, 0.01)                   # dense never measured
    False
    >>> dense_pays({1.0: 500.0}, 0.01)                    # nothing to compare with
    False
    """
    dense = table.get(1.0)
    others = [t for cf, t in table.items() if float(cf) > 1.0]
    if dense is None or dense <= 0 or not others:
        return False
    return (dense - max(others)) / dense > omega


def _key(cf: float) -> float:
    return float(cf)


def _check_number(name, value, allowed, ok):
    # Finite too: an infinite theta_max overflowed the ladder (OverflowError, not a line).
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or not ok(value):
        raise ValueError(f"GraVAC({name}={value!r}): {name} must be {allowed}")


def _check_int(name, value, allowed, ok):
    if isinstance(value, bool) or not isinstance(value, int) or not ok(value):
        raise ValueError(f"GraVAC({name}={value!r}): {name} must be {allowed}")


def _check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"GraVAC({name}={value!r}): {name} {one_of(value, choices)}")
