"""``Auto``: GraVAC's measured choice, over methods instead of one compressor's CFs
(docs/ALGORITHM.md §15; ``controller: auto`` in configs).

The candidates are methods (``methods.py``): dense, fp16 on the wire, PowerSGD at a few
ranks, the configured sparsifier at GraVAC's CF ladder. GraVAC's criterion chooses among
them: a method is eligible while its agreed compression gain is at least ε (dense's gain
is 1: always eligible); among the eligible, the highest compression throughput
(samples/s x gain, i.e. gain / step time) wins.

How it explores, cheaply:

* **Trials.** A candidate runs for ``settle_steps`` + ``trial_steps`` steps (the first
  ``settle_steps`` are not measured: first-use costs); its entry in the table is the
  median step time and the mean agreed gain of the measured steps, taken from rank 0 and
  broadcast, so every rank holds the same table and makes the same choices.
* **Gains measured for free.** A sparse trial also compresses its kept values further, to
  the next CF of the list (multi-level compression), so the next CF's gain is known
  without running it; a gain below ε at CF c rules out every CF >= c (Top-k keeps less
  energy the fewer entries it keeps). A PowerSGD rank whose gain is below ε rules out the
  lower ranks.
* **Predicted, not run.** Before a trial, a lower bound of the candidate's step time is
  predicted: the least local time measured so far (step time minus waits and the wire
  buffers' packing) plus the bytes it would put on the link (``gravac.util.sizes``: ring
  allreduce / allgather terms) at the best bandwidth measured so far. A candidate whose
  bound cannot beat the best measured score (with ``tolerance``) is not run. fp16 runs
  first (dense when fp16 is not a candidate): it calibrates the link at half dense's
  bytes. Its settling step, the run's first, runs the candidate that puts the fewest
  bytes on the link: it is not measured, and on a slow link fp16's is a dear step.
  Dense, the floor every choice is measured against, is not pruned by the byte
  prediction: where latency or the CPU dominates the waits (loopback, few cores) it is no
  lower bound, and it once priced dense out where dense was the fastest. Its bound is
  fp16's measured step divided by ``DENSE_FROM_FP16`` (3: the same values at twice the
  bytes), which prunes it only on a slow link, where its step is the dearest of all.
* **Probes.** Two trials measure one step (a probe) instead of ``trial_steps``: the
  calibration, and dense's first (without settling). On a slow link they are the
  dearest steps. Before the choice, a probed method that could still win (its step time
  divided by ``PROBE_NOISE``, the noise of one step, could beat the best score) runs a
  full trial.
* **Re-checked.** After ``recheck_every`` steps of the chosen method, its entry is
  replaced by what those steps measured, and the methods whose score was within
  ``recheck_within`` of the best run a trial again, with the next sparse CF when the
  chosen method's smoothed candidate gain now clears ε and the safe end of a family whose
  gains ruled it out, so a change of phase or link is noticed. The re-check comes at
  once when the chosen method's smoothed gain falls below ε, when its candidate gain
  clears ε for a CF not yet eligible or eligible and faster at that gain than the run
  (the ladder is climbed as GraVAC climbs it), or when its recent gain fell more than
  ``recheck_within`` below the gain it was chosen with (a trial's few steps see the gain
  before error feedback filled the residual) and that gain is below ε or leaves another
  method's score within ``recheck_within`` of the run's. Each
  re-check also measures again one compressed method whose step time would beat the best
  score at a gain of 1 and whose last gain was within ``recheck_within`` of ε, the one
  measured longest ago: gains change during training. The re-check's choice keeps the
  method that was running while its score is within ``switch_margin`` of the best: a
  score measured again moves by a few percent, and a switch costs settling steps.

* **Split layers** (``split_layers``, off by default). A sparse CF's steps also agree
  their gains per layer (the same allreduce, three values a layer). When a sparse trial or
  run ends and its CF's, or its next CF's, gain over every layer is below ε, the layers
  of low gain may go dense instead: the split keeps compressed the layers that send the
  fewest bytes while their gain, as the engine measures it (over the compressed layers),
  clears ε (``split.py``). It becomes a method of its own, ``<cf>/split`` (e.g.
  ``sparse:40/split``), queued and pruned by its predicted time like any other, and its
  trial measures its time and gain.

* **PowerSGD's own threshold** (``epsilon_low_rank``, unset by default: ε). With error
  feedback a rank-r approximation's gain falls as the residual fills (PowerSGD rank 4 on
  the wide CNN: 0.49 in its first steps, 0.2 after 80), while it trains to dense's loss
  where Top-k at 0.5-0.6 does not: the one ε of GraVAC rules out the fastest method there.
  Set, it replaces ε for the PowerSGD methods wherever ε decides (eligibility, fallback,
  pruning of lower ranks, abandoning a trial); the sparsifier keeps ε.

* **PowerSGD judged by its residual's lag** (``low_rank_lag``, unset by default). The
  PowerSGD plans also measure Σ⟨r, g⟩ / Σ‖g‖² (``StepPlan.measure_lag``: the residual's
  part along the step's raw gradient, in steps of it), and a PowerSGD method is eligible
  while that lag, not its gain, is at most ``low_rank_lag`` wherever ε decides, and its
  score is 1 - that lag (at most 1) over its step time: its energy gain, which decays as
  error feedback fills the residual, neither rules it out nor values its steps. The lag
  is pooled over the method's last ``LAG_POOL`` measured steps, across its trials and
  runs, and judged with its standard error: the method that holds the run is dropped
  once its lag is above the threshold by more than that error, any other is admitted
  once its lag is below it by as much (one step's lag can be mostly batch noise, and a
  trial's few steps admitted a method that then ran until its lag ruled it out). Its
  latest ``LAG_RECENT`` steps are judged on their own as well, less their error: a lag
  that rises as the residual fills is shown above the threshold there before the pool's
  older steps let it show. A step right after a switch of method does not count (it
  measures the residual the method before left). A lag counts only once the method's
  steps have sent a step's energy in all (its residual filled); a trial whose gain cannot
  fill it is no verdict, and the method is tried again after as many steps as the run
  had run then (the wait doubling while it does not fill), unless a rank that keeps more
  is eligible. Over a whole run the lag tells the methods that train within 2% of dense
  from those that do not (docs/notes/2026-11-auto.md §7b).

Per step, a chosen compressed method whose smoothed gain (EWMA with ``alpha``, started
from the gain that chose it) falls below ε sends dense (GraVAC's fallback); its residual
stays in error feedback. A trial sends its method in every step: it measures that method's
time, and its mean gain decides eligibility. Unless the mean of its measured steps' gains
so far is far below ε, under (1 - ``recheck_within``) x ε: then that step (sent as the
method) is the trial's last (``abandoned``), its entry holding that mean, so a method that
cannot become eligible sends no more steps at that gain. A settling step's gain does not
count: right after a switch it sees the residual the previous method left (Top-k 20x's
first step after 40x measured 0.59 on the LSTM, where its trial 14 steps before had
measured 0.75). Every choice, trial,
abandoned trial and pruned candidate is in ``decisions`` (the trainer writes them as
``method`` lines).

Example::

    opt = gravac.DistributedOptimizer(sgd, model.named_parameters(), compressor="topk",
                                      controller=Auto())   # dense, fp16, PowerSGD, Top-k
    Auto(methods=["dense", "fp16", "powersgd:4", "sparse:40"], trial_steps=6)
"""
from __future__ import annotations

import copy
import dataclasses
import math
import statistics
from typing import Mapping, Sequence

from ..util import sizes
from ..util.choices import one_of
from .base import (SENT_DENSE, SENT_MIN, Controller, StepPlan, StepRecord, Sync, decision_count,
                   keep_decision)
from .gravac import DECIDE_RULES, default_alpha
from .ladder import build_ladder
from .methods import Method
from .split import LayerGain, compressed_layers, measured_gain

#: The candidates of ``Auto()``: both dense wires, PowerSGD at ranks 1 and 4 (DDP's hook's
#: usual ranks), the sparsifier at GraVAC's exponential ladder from 10 to 1000.
DEFAULT_METHODS = ("dense", "fp16", "powersgd:1", "powersgd:4",
                   *(f"sparse:{cf:g}" for cf in build_ladder(10, 1000, "exponential")))
#: Bytes of one value on the wire as the prediction counts them (fp32 gradients).
VALUE_BYTES = 4
#: How much slower than its trial's median one measured step may be: a probe's method is
#: confirmed by a full trial unless it could not win even this much faster. Measured: the
#: calibration's first measured step took up to 1.38x its trial's median (the LSTM at
#: 1 Gbit/s, second step of training), a dense step after other methods 0.96-1.12x, and
#: fp16's first step after the run's first sent another method up to 1.64x (ResNet-18 on
#: 2 hosts x 2 ranks; ``Auto._warm_method``): within (1 + tolerance) x 1.5 = 1.65, so no
#: probe ruled out a method that would have won.
PROBE_NOISE = 1.5
#: How much faster than fp16's measured step a dense step may be (``Auto._bound``): the
#: same values at twice the bytes, without the casts. Where the CPU sums the values fp16
#: can be the slower: Horovod's local fp16 allreduce moves a value in 1.65x fp32's time
#: (0.568 against 1.87 Gbit/s, docs/SCALING.md's calibration), and one probed step may be
#: ``PROBE_NOISE`` slow: 1.65 x 1.5 = 2.5; the largest ratio in Auto's tables is fp16's
#: calibration at 1.73x dense's step (the LSTM on 2 hosts at 1 Gbit/s).
DENSE_FROM_FP16 = 3.0
#: How many of a PowerSGD method's latest measured steps its residual's lag is pooled over
#: (``low_rank_lag``, ``Auto._judged_lag``): across its trials and runs, so a trial after a
#: run adds to what the run measured. Over 64 steps a per-step deviation of 0.2 (the
#: noisiest measured, the wide CNN on 2 ranks) leaves a standard error of 0.025.
LAG_POOL = 64
#: The latest of a method's pooled steps whose lag is also judged on its own
#: (``Auto._bounded_lag``): a lag that rises as the residual fills is shown above the
#: threshold there well before the pool's older steps let it show. Replayed over the
#: per-step lags of the benchmark runs: rank 1 on the LSTM (2 hosts, 1 Gbit/s) is shown
#: above 0.1 at step 64 by its last 16 against step 100 by its 64; rank 4 on the wide
#: CNN, per-step deviation 0.35-0.42, never is over 130-141 steps (its last 8 are, at
#: step 147-148).
LAG_RECENT = 16
#: ``switch_margin``'s default: how much better than the running method's score another
#: method's must be for a re-check to switch (``Auto._choose``).
SWITCH_MARGIN = 0.05
#: ``decide``'s default: the step's own gains decide its fall-back (Algorithm 1).
DECIDE = "current"
#: A split method's key: its sparse CF's, then this (``split_layers``).
SPLIT = "/split"


def _mean_and_error(values: Sequence[float]) -> tuple[float, float]:
    """The mean of ``values`` and its standard error (0 over one value). In floats: read
    several times a step, where statistics.stdev's exact arithmetic takes ~55 us over 64
    values."""
    n, mean = len(values), statistics.fmean(values)
    se = math.sqrt(sum((x - mean) ** 2 for x in values) / (n - 1) / n) if n > 1 else 0.0
    return mean, se


class Auto(Controller):
    """Choose the method (dense, fp16, PowerSGD rank, sparse CF) by measured compression
    throughput among the methods whose gain clears ε (see the module doc).

    Args:
        methods: candidates, written as ``Method.parse`` reads them; must include dense.
        epsilon: gain threshold ε in (0, 1] (GraVAC's; the default is GraVAC
            recommended's: lower, a sparse CF whose gain barely clears it can cost final
            loss, docs/notes/2026-11-auto.md §9).
        trial_steps: measured steps of a trial (>= 1).
        settle_steps: steps of a trial before measuring (>= 0); the first trial's (the
            run's first steps, at least one: the run's first step has no step time) send
            the candidate of the fewest link bytes.
        recheck_every: steps of the chosen method between two re-checks (>= 1).
        recheck_within: methods whose score was within this fraction of the best run a
            trial again at a re-check; a trial whose mean gain so far is more than this
            fraction below ε ends at once (>= 0).
        tolerance: a candidate is run unless its predicted best score is below the best
            measured one by more than this fraction (>= 0; the prediction is a bound).
        alpha: EWMA weight of the per-step gain in (0, 1]; default clamp(N/100, 0.01, 1).
        split_layers: a sparse CF whose gain is below ε may run with its layers of low
            gain sent dense, where the gain over the layers it still compresses clears ε
            (a split method, e.g. ``sparse:40/split``; docs/ALGORITHM.md §15).
        epsilon_low_rank: the gain threshold of the PowerSGD methods, in (0, 1]; None
            (default): ε, GraVAC's one threshold. A rank-r approximation with error
            feedback trains at gains where Top-k does not (docs/ALGORITHM.md E13).
        low_rank_lag: instead of a gain threshold, the PowerSGD methods are eligible while
            their residual's lag, Σ⟨r, g⟩ / Σ‖g‖² (what error feedback holds back along
            the next raw gradient, in steps of it), pooled over their last 64 measured
            steps, is at most this, in (0, 1]: less its standard error for the method
            running, plus it for the others (dropped or admitted on evidence); their score
            is 1 - that lag (at most 1) over the step time. None (default): the
            gain decides (``epsilon_low_rank`` or ε). Not with ``epsilon_low_rank``.
        switch_margin: at a re-check, the method that was running stays while it is
            eligible and its score is within this fraction of the best (>= 0; 0: the
            best score always wins). Scores of one method measured again differ by 3-5%.
        decide: which gains decide whether a chosen compressed method's step falls back
            to dense: ``"current"`` (this step's agreed gain, GraVAC's Algorithm 1: its
            exchange waits for the gains' allreduce) or ``"previous"`` (the smoothed gain
            up to the previous step, GraVAC's E7: the exchange starts at once and the
            gains' allreduce runs beside it). A trial sends its method in every step, so
            its exchange never waits for the gains.
    """

    def __init__(self, methods: list[str] | None = None, epsilon: float = 0.7,
                 trial_steps: int = 4, settle_steps: int = 1, recheck_every: int = 300,
                 recheck_within: float = 0.15, tolerance: float = 0.1,
                 alpha: float | None = None, split_layers: bool = False,
                 epsilon_low_rank: float | None = None,
                 low_rank_lag: float | None = None,
                 switch_margin: float = SWITCH_MARGIN, decide: str = DECIDE):
        def bad(name, value, allowed):
            return ValueError(f"Auto({name}={value!r}): {allowed}")

        def number(value):
            # (A str or None would fail the range checks below with a bare TypeError, and
            # True would pass them as 1.)
            return isinstance(value, (int, float)) and not isinstance(value, bool)
        if isinstance(methods, str):     # list("dense") would be five one-letter methods
            raise bad("methods", methods, "must be a list of methods, e.g. "
                      "['dense', 'fp16', 'powersgd:4', 'sparse:40']")
        texts = list(DEFAULT_METHODS if methods is None else methods)
        parsed = []
        for text in texts:
            try:
                parsed.append(Method.parse(text))
            except ValueError as exc:
                raise bad("methods", texts, str(exc)) from None
        keys = [m.key for m in parsed]
        if "dense" not in keys:
            raise bad("methods", texts, "must include 'dense' (the floor every choice is "
                      "measured against)")
        if len(set(keys)) != len(keys):
            raise bad("methods", texts, "lists a method twice")
        if not (number(epsilon) and 0 < epsilon <= 1):
            raise bad("epsilon", epsilon, "must be in (0, 1]")
        if epsilon_low_rank is not None and not (
                number(epsilon_low_rank) and 0 < epsilon_low_rank <= 1):
            raise bad("epsilon_low_rank", epsilon_low_rank, "must be in (0, 1] or None")
        if low_rank_lag is not None and not (number(low_rank_lag) and 0 < low_rank_lag <= 1):
            raise bad("low_rank_lag", low_rank_lag, "must be in (0, 1] or None")
        if low_rank_lag is not None and epsilon_low_rank is not None:
            raise bad("low_rank_lag", low_rank_lag, "set it or epsilon_low_rank, not both "
                      "(each decides when a PowerSGD method is eligible)")
        for name, value, low in (("trial_steps", trial_steps, 1), ("settle_steps", settle_steps, 0),
                                 ("recheck_every", recheck_every, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise bad(name, value, f"must be an int >= {low}")
        for name, value in (("recheck_within", recheck_within), ("tolerance", tolerance),
                            ("switch_margin", switch_margin)):
            if not (number(value) and value >= 0):
                raise bad(name, value, "must be a number >= 0")
        if alpha is not None and not (number(alpha) and 0 < alpha <= 1):
            raise bad("alpha", alpha, "must be in (0, 1] or None")
        if not isinstance(split_layers, bool):
            raise bad("split_layers", split_layers, "must be true or false")
        if decide not in DECIDE_RULES:
            raise bad("decide", decide, one_of(decide, DECIDE_RULES))
        self.method_texts = [m.key for m in parsed]
        self.epsilon, self.trial_steps, self.settle_steps = epsilon, trial_steps, settle_steps
        self.recheck_every, self.recheck_within = recheck_every, recheck_within
        self.tolerance, self.alpha_option = tolerance, alpha
        self.split_layers = split_layers
        self.epsilon_low_rank = epsilon_low_rank
        self.low_rank_lag = low_rank_lag
        self.switch_margin = switch_margin
        self.decide_rule = decide
        self.candidates: list[Method] = parsed
        self._by_key = {m.key: m for m in parsed}
        self._layers: list[str] = []
        self._shapes: dict[str, tuple] = {}
        self._other_numel = 0
        self._world = 1
        self._exchange = "allgather"
        self._s = self._initial_state()

    # -- set-up ---------------------------------------------------------------------------
    @property
    def methods(self) -> list[Method]:
        """The methods its plans may name (the engine prepares what each needs)."""
        return list(self.candidates)

    def bind(self, layer_names, sync: Sync) -> None:
        self._layers = list(layer_names)
        self._world = sync.size
        self._alpha = self.alpha_option if self.alpha_option is not None \
            else default_alpha(sync.size)

    def observe_layers(self, shapes: Mapping[str, tuple], other_numel: int,
                       exchange: str) -> None:
        """The compressed layers' shapes, the other layers' elements and the engine's
        sparse exchange (``options.exchange``): what the byte prediction needs."""
        self._shapes = {name: tuple(shape) for name, shape in shapes.items()}
        self._other_numel = int(other_numel)
        self._exchange = exchange

    @property
    def calibration(self) -> str:
        """The method of the first trial, which calibrates the link: fp16 (half dense's
        bytes, gain 1) when it is a candidate, else dense."""
        return "fp16" if "fp16" in self._by_key else "dense"

    def _initial_state(self) -> dict:
        first = self.calibration
        return {"phase": "trial", "current": first, "round": 1, "step_in_phase": 0,
                "queue": [m.key for m in self.candidates if m.key != first],
                "samples": [], "trial_gains": [], "pending": None, "delta": None,
                "delta_c": None, "table": {}, "measured_at": {},
                "splits": {}, "layer_energy": {}, "decisions": []}

    def _method(self, key: str) -> Method:
        """The method of ``key`` (a split method's: its sparse CF's)."""
        return self._by_key[key[:-len(SPLIT)] if key.endswith(SPLIT) else key]

    def _dense_layers(self, key: str) -> list[str]:
        """The compressed layers a split method sends dense (none for other methods)."""
        return self._s.get("splits", {}).get(key, []) if key.endswith(SPLIT) else []

    def _keys(self) -> list[str]:
        """Every method's key in a fixed order: the candidates', then the splits'."""
        return [*self.method_texts, *sorted(self._s.get("splits", {}))]

    # -- per step -------------------------------------------------------------------------
    def plan(self, step: int) -> StepPlan:
        warm = self._warm_method()
        if warm is not None:
            # Not measured, so neither its lag nor its layers' gains are recorded: they
            # would count under the calibration's name.
            return dataclasses.replace(self._plan_of(warm), measure_lag=False,
                                       layer_gains=False)
        return self._plan_of(self._s["current"])

    def _plan_of(self, key: str) -> StepPlan:
        """The step plan of method ``key`` in the current phase."""
        m = self._method(key)
        if m.dense:
            return StepPlan(theta_min=1.0, method=m)
        decided = self._decided()
        if m.kind == "powersgd":
            return StepPlan(theta_min=1.0, layer_rank=dict.fromkeys(self._layers, m.rank),
                            needs_gains=True, method=m, decided=decided,
                            measure_lag=self.low_rank_lag is not None)
        dense = self._dense_layers(key)
        if dense:
            return StepPlan(theta_min=m.level, layer_cf=dict.fromkeys(dense, 1.0),
                            needs_gains=True, method=m, method_name=key, decided=decided)
        return StepPlan(theta_min=m.level, theta_c=self._next_cf(m), needs_gains=True,
                        method=m, decided=decided, layer_gains=self.split_layers and
                        m.exchange_for(self._world, self._exchange) != "hierarchical")

    def _warm_method(self) -> str | None:
        """The method the calibration's settling steps run (None at any other step): the
        candidate that puts the fewest bytes on the link (``wire_bytes``; the calibration
        itself where none puts fewer). Settling steps are not measured, and the run's
        first step pays first-use costs whatever it sends (fp16's waited up to 6x as long
        as a later one on ResNet-18 at 10 Gbit/s); on a slow link an fp16 settling step
        was among the dearest of a run (1.0 s on the wide CNN at 100 Mbit/s, a tenth of
        its run's step time; 3.7 s on ResNet-18, where PowerSGD's steps take 0.045 s and
        0.41 s). The calibration's measured step is then its method's first, at most as
        slow as ``PROBE_NOISE`` allows for. The calibration's step sends the residual
        this step leaves whole (fp16 and dense send g_ef). From the layers' shapes and
        the trial's step count: the same on every rank."""
        s, first = self._s, self.calibration
        if (s["table"] or s["phase"] != "trial" or s["current"] != first
                or s["step_in_phase"] >= self._trial_length()[0]):
            return None
        return min(self.method_texts, key=lambda k: (self.wire_bytes(k), k != first))

    def _decided(self) -> str | None:
        """What a compressed method's step sends, when known before the step (None: the
        step's own gains decide, ``decide="current"``). A trial sends its method; a run
        falls back to dense while the smoothed gain up to the previous step is below ε
        (``decide="previous"``). Known before the step, the level lets the exchange start
        at once: the gains' allreduce runs beside it instead of before it."""
        s = self._s
        if s["phase"] == "trial":
            return SENT_MIN
        quality = self._run_quality()
        if self.decide_rule == "current" or quality is None:
            return None
        return SENT_MIN if quality >= self._epsilon(s["current"]) else SENT_DENSE

    def observe_layer_gains(self, rows: Mapping[str, tuple[float, float, float]]) -> None:
        """Sums the agreed per-layer energies over the phase's steps: what a split is
        chosen from when the phase ends (``_propose_splits``)."""
        energy = self._s.setdefault("layer_energy", {})
        for name, row in rows.items():
            acc = energy.setdefault(name, [0.0, 0.0, 0.0])
            for i in range(3):
                acc[i] += row[i]

    def _next_cf(self, m: Method) -> float | None:
        """The next larger CF among the sparse candidates (its gain is measured for free)."""
        above = [c.level for c in self.candidates if c.kind == "sparse" and c.level > m.level]
        return min(above) if above else None

    def observe_lag(self, lag: float) -> None:
        """This step's agreed lag (``low_rank_lag``'s PowerSGD steps), before ``decide``."""
        self._s["pending_lag"] = lag

    def decide(self, gain_min, gain_c) -> str:
        s = self._s
        s["pending"] = (gain_min, gain_c)
        if gain_min is None:
            return SENT_MIN
        s["delta"] = self._smooth(s["delta"], gain_min)
        if gain_c is not None:
            s["delta_c"] = self._smooth(s.get("delta_c"), gain_c)
        lag = s.pop("pending_lag", None)     # (only a lag-gated plan measures it)
        if lag is not None and s["step_in_phase"] >= s.get("lag_settle", 0):
            # (Not right after a switch: that lag is of the residual the method before left,
            # rank 4's 0.38 after rank 1 on the wide CNN.)
            pool = s.setdefault("lag_pool", {}).setdefault(s["current"], [])
            pool.append(lag)
            del pool[:-LAG_POOL]
        if s["phase"] == "trial":
            # A trial measures its method: a step sent dense would enter dense's time
            # under the method's name. Its mean gain decides eligibility; what a step
            # does not send stays in error feedback. A mean gain so far far below ε makes
            # this step the trial's last; it still goes out compressed: its compression
            # is done, and a dense step is the dearest step on a slow link. Settling
            # steps' gains do not count (``_measured_gains``).
            gains = s.setdefault("trial_gains", [])
            gains.append([gain_min, gain_c])
            measured = self._measured_gains()
            if measured and self._trial_quality(measured) < self._near_epsilon(s["current"]):
                s["abandon"] = True
            return SENT_MIN
        quality = self._run_quality()
        return SENT_MIN if quality is None or quality >= self._epsilon(s["current"]) \
            else SENT_DENSE

    def _smooth(self, average: float | None, sample: float) -> float:
        return sample if average is None else (1 - self._alpha) * average + self._alpha * sample

    def end_step(self, record: StepRecord, sync: Sync) -> None:
        s = self._s
        s["step_in_phase"] += 1
        pending, s["pending"] = s["pending"], None
        # A step without a step time (a resumed process's first) still measures its
        # gains; the times are the medians of the steps that have one (``_summarise``).
        measured = record.sent in (SENT_MIN, SENT_DENSE)
        settle, length = self._trial_length() if s["phase"] == "trial" else (0, 0)
        if measured and s["step_in_phase"] > settle:
            gain_min, gain_c = pending if pending is not None else (1.0, None)
            s["samples"].append([record.t_iter, gain_min, gain_c, record.extra.get("t_comm"),
                                 record.extra.get("t_pack")])
        if s.pop("abandon", False):
            self._end_trial(record.step, sync, abandoned=True)
        elif s["phase"] == "trial" and s["step_in_phase"] >= settle + length:
            self._end_trial(record.step, sync, may_run_on=s.get("unmeasured", 0) < length)
        elif s["phase"] == "run":
            reason = self._recheck_reason(s["step_in_phase"], record.step)
            if reason is not None:
                self._recheck(record.step, sync, reason)

    def _recheck_reason(self, steps: int, step: int) -> str | None:
        """Why the chosen method is re-checked after ``steps`` steps of its run (at the
        run's ``step``), or None. The same on every rank: it reads agreed gains, step
        counts and the table (rank 0's entries, broadcast), never this rank's own step
        times (``_run_score``)."""
        if steps >= self.recheck_every:
            return f"recheck_every={self.recheck_every} steps"
        if self._fell_below(steps):
            if self._lag_gated(self._s["current"]):
                return (f"{self._lag_shown(self._s['current'])} above "
                        f"low_rank_lag={self.low_rank_lag:g}")
            return f"smoothed gain below epsilon={self._epsilon(self._s['current']):g}"
        if self._next_clears(steps):
            return f"{self._next_cf_key()}'s gain clears epsilon={self.epsilon:g}"
        if self._drifted():
            return (f"recent gain more than recheck_within={self.recheck_within:g} below "
                    "the gain it was chosen with")
        due = self._retrials_due(step)
        if due:
            return (f"{due[0]}'s residual did not fill in its trial to step "
                    f"{self._s['unfilled'][due[0]][0]}: tried again after as many steps")
        return None

    def _note_fill(self, step: int, key: str, abandoned: bool) -> None:
        """After ``key``'s trial (``abandoned``: ended early): under ``low_rank_lag``, a
        PowerSGD method whose steps did not fill its residual (``_entry_fills``; a trial
        ended early: whose gain could not fill it over ``trial_steps``, ``_trial_fills``,
        not one ended for its lag) is not ruled out but not yet judged, so it is tried
        again (``_retrials_due``) once the run has run as many steps again as it had at
        this ``step`` (at most ``recheck_every`` more). A low-rank method keeps little of
        a high-rank gradient: in ResNet-18's learning-rate warm-up rank 4 kept 0.18-0.22
        of g_ef's energy a step (its residual could not fill over 4 steps), 0.50 at step
        117, while at 100 Mbit/s its steps took 0.41 s against fp16's 3.7 s
        (``cpu_auto_resnet18_100mbit_2026-11-29``); judged only at the next
        ``recheck_every`` it was never run. Doubling the wait keeps the re-trials few
        (log2 of the run's length at most) where it never fills."""
        entry = self._s["table"][key]
        if self._lag_gated(key) and not (self._trial_fills(entry["gain"]) if abandoned
                                         else self._entry_fills(entry)):
            self._defer(key, step)
        else:
            self._s.get("unfilled", {}).pop(key, None)

    def _defer(self, key: str, step: int) -> None:
        """``key``'s next re-trial (``_note_fill``): after as many steps again as the run
        has run at ``step``, at most ``recheck_every`` more."""
        done = step + 1         # steps done, as step records and ``method`` lines count
        self._s.setdefault("unfilled", {})[key] = [done, min(2 * done,
                                                             done + self.recheck_every)]

    def _retrials_due(self, step: int) -> list[str]:
        """The methods whose residual did not fill in their last trial (``_note_fill``)
        and are due to be tried again at ``step``: not the running method, only where
        their measured step time could still beat the best score (``_cannot_win``), and
        not while a rank of their family that keeps more is eligible. The re-trial
        brings back a family its warm-up kept out; a lower rank beside an eligible
        higher one waits for the re-checks: on the wide CNN rank 1, tried again beside
        rank 4, kept 0.30 for its 4 steps, was admitted (lag -0.001 ± 0.054) and ran 13
        steps until its lag, 0.163, ruled it out, and the run took 1.16x the time of
        DDP's PowerSGD rank 4 against 0.62x
        (``cpu_auto_wide_cnn_1gbit_retrial_lower_rank_2026-11-29``). From the agreed
        table and step counts: the same on every rank."""
        s = self._s
        due = [k for k, (_, at) in s.get("unfilled", {}).items()
               if step + 1 >= at and k != s["current"]]
        if not due:
            return []           # (read every run step: no score is computed then)
        best = self._best_score()
        return [k for k in due
                if not any(self._eligible(c.key) for c in self._safer(k))
                and not self._cannot_win(s["table"][k]["t"] or 0.0, best)]

    def _fell_below(self, steps: int) -> bool:
        """The chosen method's smoothed gain fell below ε, or under ``low_rank_lag`` its
        judged lag (``_judged_lag``) rose above it (after a trial's length of steps): it
        is no longer eligible, so the re-check comes now, not after more steps that each
        fall back to dense."""
        s, quality = self._s, self._run_quality()
        return (steps >= self.settle_steps + self.trial_steps and quality is not None
                and quality < self._epsilon(s["current"]))

    def _recent_gain(self) -> float | None:
        """The mean agreed gain of the run's last 2 x ``trial_steps`` measured steps (None
        before that many): the gain the chosen method sends at now, where the smoothed one
        (GraVAC's EWMA, alpha = N/100) still remembers the switch."""
        samples = self._s["samples"][-2 * self.trial_steps:]
        if len(samples) < 2 * self.trial_steps:
            return None
        return statistics.fmean(x[1] for x in samples)

    def _recent_quality(self) -> float | None:
        """What the chosen method's threshold is compared with, over the recent steps: its
        gain, or under ``low_rank_lag`` 1 - its judged lag (``_judged_lag``: already over
        its last steps)."""
        if self._lag_gated(self._s["current"]):
            return self._run_quality()
        return self._recent_gain()

    def _run_quality(self) -> float | None:
        """The chosen method's smoothed gain, or 1 - its judged lag under
        ``low_rank_lag`` (None before a step measured it)."""
        s = self._s
        if self._lag_gated(s["current"]):
            lag = self._judged_lag(s["current"])
            return None if lag is None else 1.0 - lag
        return s["delta"]

    def _pooled_lag(self, key: str) -> dict:
        """``key``'s lag over its last ``LAG_POOL`` measured steps, across its trials and
        runs: {"lag": the mean, "lag_se": its standard error}, and once the pool holds
        more than ``LAG_RECENT`` steps the same over those latest ("lag_recent",
        "lag_recent_se"). Empty before a step measured it; the error is 0 over one
        step."""
        lags = self._s.get("lag_pool", {}).get(key, [])
        if not lags:
            return {}
        mean, se = _mean_and_error(lags)
        pooled = {"lag": mean, "lag_se": se}
        if len(lags) > LAG_RECENT:
            recent, recent_se = _mean_and_error(lags[-LAG_RECENT:])
            pooled.update(lag_recent=recent, lag_recent_se=recent_se)
        return pooled

    @staticmethod
    def _bounded_lag(pooled: Mapping, held: bool = True) -> float:
        """A pooled lag (``_pooled_lag``, or a table entry holding one) as it is compared
        with ``low_rank_lag``: less its standard error for the method that holds the run
        (``held``: it is dropped once its lag is shown above the threshold), plus it for
        any other (admitted once its lag is shown below it). A trial's few steps leave
        the error large: rank 1's trial on the wide CNN measured 0.085 ± 0.114, was chosen
        on the benefit of that doubt and ran 17 steps until its lag, 0.159 ± 0.059, ruled
        it out, while its residual set the loss back
        (``cpu_auto_wide_cnn_1gbit_lagscore_unfilled_2026-11-29``). The latest
        ``LAG_RECENT`` steps' lag less their error counts too, whichever is higher: a
        method shown above the threshold there is dropped, or not admitted, though its
        older steps keep the pool's mean below it (rank 1 on the LSTM, 2 hosts: 0.181 ±
        0.064 over its last 16 steps at step 64, the pool's 64 shown above only at step
        100, ``cpu_auto_2hosts_lstm_1gbit_lagscore_2026-11-29``)."""
        se = pooled.get("lag_se", 0.0)
        bound = pooled["lag"] - se if held else pooled["lag"] + se
        if pooled.get("lag_recent") is not None:
            bound = max(bound, pooled["lag_recent"] - pooled["lag_recent_se"])
        return bound

    def _lag_shown(self, key: str) -> str:
        """Which of ``key``'s lags its judged lag (``_judged_lag``) is, in words: a
        decision's reason names it."""
        pooled = self._pooled_lag(key)
        if self._bounded_lag(pooled) > pooled["lag"] - pooled["lag_se"]:
            return f"lag of its last {LAG_RECENT} steps less their standard error"
        return "pooled lag less its standard error"

    def _holds(self, key: str) -> bool:
        """``key`` is the method that holds the run: the one running, or during a
        re-check's trials the one that was (``_bounded_lag``)."""
        s = self._s
        holder = s.get("incumbent") or (s["current"] if s["phase"] == "run" else None)
        return key == holder

    def _judged_lag(self, key: str) -> float | None:
        """The lag that decides ``key``'s eligibility under ``low_rank_lag``: its pooled
        lag less one standard error (``_pooled_lag``), or its latest ``LAG_RECENT`` steps'
        where that is higher (``_bounded_lag``), or None before a step measured it.
        One step's lag is mostly batch noise where the batch is noisy: on the wide CNN
        (40% random labels, 2 ranks) rank 4's per-step lags had a standard deviation of
        0.20 around a mean of 0.045, and the mean of 8 steps, 0.1003, ruled it out at
        ``low_rank_lag: 0.1`` after it had run 21 steps at 0.05 s against fp16's 1.0 s
        (``cpu_auto_wide_cnn_100mbit_lag_2026-11-28``). Pooled over a method's steps and
        given the benefit of its noise, a lag is judged above the threshold when it is
        above it by more than that noise: rank 1's, 0.24 on that workload, from its 15th
        step (``cpu_residual_lag_2026-11-28``, one process)."""
        pooled = self._pooled_lag(key)
        return self._bounded_lag(pooled) if pooled else None

    def _run_score(self) -> float | None:
        """The run's score at its recent quality (``_recent_quality``: its recent gain, or
        1 - its judged lag under ``low_rank_lag``): what that is worth over the step time
        of its table entry (None before it is known). Only agreed values: the gains and
        lags are agreed and the entry is rank 0's, broadcast, while this run's own step
        times are each rank's. A re-check is a broadcast, so a trigger read from local
        timings could start it on one rank and not on another: a hang."""
        recent = self._recent_quality()
        entry = self._s["table"].get(self._s["current"])
        if recent is None or entry is None or not entry.get("t"):
            return None
        return self._worth(recent) / entry["t"]

    def _drifted(self) -> bool:
        """The chosen compressed method's recent gain fell more than ``recheck_within``
        below the gain it was chosen with (PowerSGD's gain, measured right after a switch,
        decays as error feedback fills the residual), and the re-check has something to
        try: that gain is below the method's threshold, or another eligible method's score
        is within ``recheck_within`` of the run's own (the re-check's queue). A drift that
        leaves the method well ahead does not start trials: on the LSTM at 100 Mbit/s a
        split's gain, drifting without changing the choice, re-checked every 10-30 steps
        (28% of the run exploring, ``cpu_auto_lstm_100mbit_split_2026-11-28``). Not a
        method judged by its lag (``low_rank_lag``): its decaying gain says nothing of its
        lag, which ``_fell_below`` judges."""
        s, recent = self._s, self._recent_gain()
        key = s["current"]
        entry = s["table"].get(key)
        if (recent is None or entry is None or self._method(key).dense
                or self._lag_gated(key)
                or recent >= (1 - self.recheck_within) * entry["gain"]):
            return False
        if recent < self._epsilon(key):
            return True
        run = self._run_score()
        rivals = [self._score(k) for k in s["table"] if k != key]
        return run is None or max(rivals, default=0.0) >= (1 - self.recheck_within) * run

    def _next_cf_key(self) -> str | None:
        """The chosen sparse method's next CF, when it is a candidate."""
        key = self._s["current"]
        m = self._method(key)
        nxt = self._next_cf(m) if m.kind == "sparse" and not key.endswith(SPLIT) else None
        key = None if nxt is None else Method("sparse", nxt, m.exchange).key
        return key if key in self.method_texts else None

    def _next_clears(self, steps: int) -> bool:
        """The chosen sparse method's smoothed candidate gain (the next CF's) cleared ε,
        and that CF is not an eligible entry of the table (never run, or ruled out earlier
        in training) or is one whose step time at that gain beats the run's own score: it
        is tried now, as GraVAC climbs its ladder, not after ``recheck_every`` steps. The
        second case: on the LSTM at 100 Mbit/s, after Top-k 40x's gain drifted below ε, a
        re-check chose 10x (0.96 / 0.52 s) while 20x was eligible (0.72 / 0.42 s), and 10x
        ran 100 steps although 20x's candidate gain, 0.84 after its climb's gap, would
        have scored 2.0 against 10x's 1.8 (``cpu_auto_lstm_100mbit_split_2026-11-28``)."""
        key = self._next_cf_key()
        if key is None or steps < self.settle_steps + self.trial_steps:
            return False
        gain = self._next_gain(key)
        if gain < self.epsilon:
            return False
        if not self._eligible(key):
            return True
        run = self._run_score()
        return run is not None and gain / self._s["table"][key]["t"] > run

    def _next_gain(self, key: str) -> float:
        """The next CF's own gain as the run's smoothed candidate gain predicts it: that
        gain less the gap its last climb measured (the candidate gain at the climb minus
        the gain its trial measured). The second pass over the kept values overestimates
        a CF whose own steps leave more in the residual: on the LSTM, Top-k 160x's
        candidate gain cleared ε = 0.7 from 40x every ~10 steps while its own trials
        measured 0.59-0.63, and each climb re-checked every method."""
        s = self._s
        return (s.get("delta_c") or 0.0) - s.get("climb_gap", {}).get(key, 0.0)

    # -- between phases (every rank, same order; rank 0's measurements) --------------------
    def _measure(self, step: int, sync: Sync, reason: str | None = None,
                 gains: dict | None = None, untimed: bool = False) -> dict | None:
        """The current method's table entry from this phase's samples: rank 0's,
        broadcast (only rank 0's timings count, as in GraVAC). ``reason``: why a run is
        re-checked (logged with the entry); ``gains``: the entry's gains, where they are
        not the measured steps' (an abandoned trial). ``untimed``: an entry without a step
        time is not entered; None instead, on every rank alike (the broadcast says it: a
        rank's own steps may have had times where rank 0's had none)."""
        entry = self._summarise() if sync.rank == 0 else None
        if entry is not None and gains is not None:
            entry.update(gains)
        if entry is not None and self._s["phase"] == "trial" and self._probing():
            entry["probe"] = True
        if entry is not None and self._s["phase"] == "run" and \
                not self._method(self._s["current"]).dense:
            # A run's gain: what it sends at as it ends (recent, else the smoothed one).
            recent = self._recent_gain()
            delta = self._s["delta"]
            entry["gain"] = recent if recent is not None else \
                delta if delta is not None else entry["gain"]
        if entry is not None and self._lag_gated(self._s["current"]):
            entry.update(self._pooled_lag(self._s["current"]))
            if self._s["phase"] == "run":
                # Chosen, it had filled its residual (``_quality``); a re-check a few
                # steps into its run must not find it unfilled on those few steps' gains
                # (rank 4 on the wide CNN, 1 step at 0.49 after a trial of 4).
                entry["filled"] = True
        entry = sync.broadcast_object(entry, name="gravac.auto.measure")
        if untimed and entry["t"] is None:
            return None
        self._s["table"][self._s["current"]] = entry
        self._s.setdefault("measured_at", {})[self._s["current"]] = step
        extra = {} if reason is None else {"reason": reason}
        self._log(step, "measured", self._s["current"], **entry, **extra)
        return entry

    def _summarise(self) -> dict:
        samples = self._s["samples"]
        dense = self._method(self._s["current"]).dense
        if not samples:
            return {"t": None, "t_comm": None, "t_pack": None,
                    "gain": 1.0 if dense else 0.0, "gain_next": None, "steps": 0}

        def median_of(i):
            # Sample: [t_iter, gain, next CF's gain, t_comm, t_pack] (t_pack: not in a
            # checkpoint written before it was measured).
            values = [x[i] for x in samples if len(x) > i and x[i] is not None]
            return statistics.median(values) if values else None
        nexts = [x[2] for x in samples if x[2] is not None]
        return {"t": median_of(0), "t_comm": median_of(3), "t_pack": median_of(4),
                "gain": 1.0 if dense else statistics.fmean(x[1] for x in samples),
                "gain_next": statistics.fmean(nexts) if nexts else None,
                "steps": len(samples)}

    def _measured_gains(self) -> list:
        """The trial's (gain, next CF's gain) of its steps after settling."""
        return self._s.get("trial_gains", [])[self._trial_length()[0]:]

    def _trial_quality(self, measured: list) -> float:
        """The trial's mean gain over its ``measured`` (gain, next gain) steps so far, or
        under ``low_rank_lag`` 1 - the method's judged lag (``_judged_lag``: its pooled
        lag counts the trial's steps with its earlier ones), 0 where its mean gain so far
        could not fill its residual by the trial's end (``_fills``) by a margin of
        ``recheck_within``."""
        key = self._s["current"]
        gain = statistics.fmean(g for g, _ in measured)
        lag = self._judged_lag(key) if self._lag_gated(key) else None
        if lag is None:
            return gain
        return 1.0 - lag if self._trial_fills(gain) else 0.0

    @staticmethod
    def _fills(sent: float, margin: float = 0.0) -> bool:
        """Steps that sent ``sent`` of g_ef's energy in all (their gains' sum) had their
        residual fill to its size, so that its lag says what the method holds back: at
        least one step's worth (less ``margin``, a fraction of it). A method that sends a
        fraction γ a step fills its residual over about 1 / γ steps; before, its lag is
        small whatever the method: over a 4-step trial in ResNet-18's warm-up, ranks 4
        and 1 (gains 0.16, 0.09) measured -0.015 and 0.043; rank 1 was chosen, its lag
        reached 0.18 over the 43 steps it ran, and the run ended 9% above dense's loss
        (``cpu_auto_resnet18_1gbit_lagscore_unfilled_2026-11-29``)."""
        return sent >= 1.0 - margin

    def _trial_fills(self, mean_gain: float) -> bool:
        """A trial whose measured steps' mean gain is ``mean_gain`` would fill its residual
        (``_fills``) over ``trial_steps``, within ``recheck_within``."""
        return self._fills(mean_gain * self.trial_steps, self.recheck_within)

    def _entry_fills(self, entry: Mapping) -> bool:
        """A table entry's steps filled its method's residual (``_fills``): their mean gain
        x their count, or a run's entry (``filled``: it was chosen filled)."""
        return entry.get("filled", False) or self._fills(entry["gain"] * entry.get("steps", 0))

    def _lag_gated(self, key: str) -> bool:
        """``key``'s eligibility is decided by its residual's lag (``low_rank_lag``: the
        PowerSGD methods), not by its gain."""
        return self.low_rank_lag is not None and self._method(key).kind == "powersgd"

    def _quality(self, key: str, entry: dict) -> float:
        """What ``key``'s threshold (``_epsilon``) is compared with: the entry's gain, or
        under ``low_rank_lag`` 1 - its lag, less its standard error for the method that
        holds the run and plus it for the others (``_bounded_lag``), or 0 where the
        entry's steps did not fill its residual (``_fills``: their mean gain x their
        count below 1); an entry without a lag, e.g. read from a checkpoint written
        before, counts its gain."""
        if self._lag_gated(key) and entry.get("lag") is not None:
            if not self._entry_fills(entry):
                return 0.0          # its lag shows nothing yet (``_fills``)
            return 1.0 - self._bounded_lag(entry, held=self._holds(key))
        return entry["gain"]

    def _epsilon(self, key: str) -> float:
        """The threshold of ``key``'s method (compared with ``_quality``): 1 -
        ``low_rank_lag`` or ``epsilon_low_rank`` for PowerSGD where set, else ε."""
        if self._lag_gated(key):
            return 1.0 - self.low_rank_lag
        if self.epsilon_low_rank is not None and self._method(key).kind == "powersgd":
            return self.epsilon_low_rank
        return self.epsilon

    def _near_epsilon(self, key: str) -> float:
        """The gain within ``recheck_within`` of ``key``'s threshold: a method measured
        below it is far from eligible (its trial ends at once; it is not re-measured as
        stale)."""
        return (1 - self.recheck_within) * self._epsilon(key)

    def _end_trial(self, step: int, sync: Sync, abandoned: bool = False,
                   may_run_on: bool = False) -> None:
        """The trial's entry, its gains' verdict on the queue, the next trial or the choice.
        ``abandoned``: its mean gain so far fell far below ε (``decide``); the entry's gain
        is that mean over the trial's measured steps. ``may_run_on``: a trial none of whose
        steps had a step time on rank 0 runs on a step instead (``_measure``'s
        ``untimed``)."""
        if abandoned:
            gains = self._measured_gains()
            nexts = [c for _, c in gains if c is not None]
            key = self._s["current"]
            mean = statistics.fmean(g for g, _ in gains)
            if not (self._lag_gated(key) and self._judged_lag(key) is not None):
                reason = (f"mean gain below (1 - recheck_within) x epsilon = "
                          f"{self._near_epsilon(key):.4g}")
            elif not self._trial_fills(mean):
                reason = (f"mean gain {mean:.3g} x trial_steps={self.trial_steps} below "
                          f"(1 - recheck_within) = {1 - self.recheck_within:g}: its residual "
                          "cannot fill for its lag to show")
            else:
                reason = (f"{self._lag_shown(key)} above 1 - (1 - "
                          f"recheck_within) x (1 - low_rank_lag) = "
                          f"{1 - self._near_epsilon(key):.4g}")
            self._log(step, "abandoned", key, steps=len(self._s["trial_gains"]), reason=reason)
            self._measure(step, sync, gains={
                "gain": statistics.fmean(g for g, _ in gains),
                "gain_next": statistics.fmean(nexts) if nexts else None})
        elif self._measure(step, sync, untimed=may_run_on) is None:
            # No step of the trial had a step time on rank 0, whose times count (a resumed
            # process's first step has none, nor has a skipped step): it runs on, up to its
            # length again. Its entry would hold no time, and the method would never be
            # eligible (fp16's calibration, resumed right after its settling step).
            self._s["unmeasured"] = self._s.get("unmeasured", 0) + 1
            return
        s = self._s
        self._note_fill(step, s["current"], abandoned)
        climb = s.get("climb")
        if climb is not None and climb[0] == s["current"]:
            # The trial of a climb: how far its own gain fell below the candidate gain
            # that started it (``_next_gain``).
            s["climb"] = None
            if climb[1] is not None:
                gap = climb[1] - s["table"][climb[0]]["gain"]
                s.setdefault("climb_gap", {})[climb[0]] = max(gap, 0.0)
        s["queue"] += [k for k in self._propose_splits(step) if k not in s["queue"]]
        self._prune_by_gain(step)
        kind = self._method(s["current"]).kind
        if kind in ("sparse", "powersgd"):
            # A trial that ruled its family out (a re-check's, typically: the family's
            # other entries were older) tries the safe end now, not at the next re-check:
            # on the LSTM at 1 Gbit/s, Top-k 40x drifted below ε, 20x's trial then measured
            # 0.69, and with 10x never measured (pruned by its time in the first round)
            # fp16 ran 100 steps at 1.20x the fastest peer's time
            # (cpu_auto_lstm_1gbit_low_rank_2026-11-28, round 1).
            key = self._safe_end(kind, step, s["queue"])
            if key is not None:
                s["queue"].append(key)
        self._advance(step)

    def _recheck(self, step: int, sync: Sync, reason: str) -> None:
        self._measure(step, sync, reason)
        s = self._s
        s["incumbent"] = s["current"]       # the run this re-check may replace (_choose)
        best = self._best_score()
        queue = [k for k, e in s["table"].items() if k != s["current"] and self._eligible(k)
                 and self._score(k) >= best * (1 - self.recheck_within)]
        nxt = self._next_cf_key()
        s["climb"] = None
        if nxt is not None and self._next_gain(nxt) >= self.epsilon and nxt not in queue:
            queue.append(nxt)
            s["climb"] = [nxt, s.get("delta_c")]
        for kind in ("sparse", "powersgd"):
            key = self._safe_end(kind, step, queue)
            if key is not None:
                queue.append(key)
        stale = self._stale_candidate(queue, best)
        if stale is not None:
            queue.append(stale)
        for key in self._retrials_due(step):
            self._defer(key, step)          # due again later, whether it runs or is pruned
            if key not in queue:
                queue.append(key)
        s["round"] += 1
        queue += self._propose_splits(step)
        s["queue"] = [k for k in self._keys() if k in queue]
        self._advance(step)

    def _safe_end(self, kind: str, step: int, queue: list[str]) -> str | None:
        """The safe end of family ``kind`` (its lowest CF, its highest rank) to try again,
        or None: where no method of the family is eligible or queued, gains ruled it out,
        and gains change as training goes on. Not the current method, and once per
        ``recheck_every`` steps: re-checks that gains start may come every few steps."""
        s = self._s
        family = [c for c in self.candidates if c.kind == kind]
        if not family or any(self._eligible(c.key) or c.key in queue for c in family):
            return None
        key = (min if kind == "sparse" else max)(family, key=lambda c: c.level).key
        last = s.get("measured_at", {}).get(key)
        if key == s["current"] or (last is not None and step - last < self.recheck_every):
            return None
        return key

    def _stale_candidate(self, queue: list[str], best: float) -> str | None:
        """One compressed method to measure again at a re-check, or None: of those not
        queued whose measured step time would beat the best score at a gain of 1 and
        whose last gain was at least ``recheck_within`` close to ε, the one measured
        longest ago. Gains change as training goes on (Top-k's rise with the residual,
        PowerSGD's fall), so an entry measured early may be stale; one per re-check keeps
        the cost to one trial. A method measured far below ε is left out: a trial sends
        its method, and re-trying one that cannot become eligible would send steps at a
        gain far below ε at every re-check (a fast, low PowerSGD rank); a family that
        gains rule out is re-tried from its safe end instead."""
        s = self._s
        at = s.get("measured_at", {})
        stale = [k for k, e in s["table"].items()
                 if k != s["current"] and k not in queue and not self._method(k).dense
                 and e["t"] is not None and e["t"] > 0 and 1.0 / e["t"] > best
                 and self._quality(k, e) >= self._near_epsilon(k)]
        keys = self._keys()
        return min(stale, key=lambda k: (at.get(k, -1), keys.index(k)),
                   default=None)

    def _advance(self, step: int) -> None:
        """The next trial (the queued candidate with the lowest predicted time that may
        still win), or the choice when none is left."""
        s = self._s
        best = self._best_score()
        for key in list(s["queue"]):
            bound = self._bound(key)
            if self._cannot_win(bound, best):
                s["queue"].remove(key)
                why = (f"fp16's measured step / DENSE_FROM_FP16={DENSE_FROM_FP16:g}"
                       if key == "dense" else "predicted step time")
                self._log(step, "pruned", key, reason=f"{why} >= {bound:.4g}s cannot beat "
                          "the best measured score")
        ready = [k for k in s["queue"] if self._ready(k)]
        if ready:
            key = min(ready, key=self._predicted)
            s["queue"].remove(key)
            self._switch(key, "trial")
            return
        probe = self._probe_to_confirm()
        if probe is not None:
            self._switch(probe, "trial", confirming=True)
            return
        self._choose(step)

    def _choose(self, step: int) -> None:
        """Run the eligible method of the best score; at a re-check, the method that was
        running instead while its score is within ``switch_margin`` of the best. A score
        measured again moves by a few percent (fp16's 4.53, 4.67, 4.77 in one run of the
        LSTM on two hosts), and a switch costs settling steps: near-ties went back and
        forth between methods of different speed (PowerSGD rank 4 at 9.06 against fp16's
        9.38 on the wide CNN at 1 Gbit/s, ``cpu_auto_wide_cnn_1gbit_low_rank_2026-11-28``;
        Top-k 40x split at 4.92 against 20x split's 5.01, 0.150 s a step against 0.185 s,
        ``cpu_auto_2hosts_lstm_1gbit_2026-11-28``)."""
        s = self._s
        # Dense is always eligible once measured; a run whose every dense step was
        # skipped (NaN/Inf) has nothing measured: dense, until the re-check.
        best = max((k for k in s["table"] if self._eligible(k)), key=self._score,
                   default="dense")
        incumbent, extra = s.get("incumbent"), {}
        if (incumbent is not None and incumbent != best and self._eligible(incumbent)
                and self._score(incumbent) >= (1 - self.switch_margin) * self._score(best)):
            extra = {"reason": f"within switch_margin={self.switch_margin:g} of {best}'s "
                               f"score {self._score(best):.4g}"}
            best = incumbent
        self._log(step, "chosen", best, score=self._score(best), round=s["round"],
                  scores={k: self._score(k) for k in s["table"]}, **extra)
        s.pop("incumbent", None)        # (read by the scores above: ``_holds``)
        self._switch(best, "run")

    def _cannot_win(self, bound: float, best: float) -> bool:
        """A method whose step time is at least ``bound`` cannot beat the ``best`` score,
        even at a gain of 1 and with ``tolerance`` (False when either is unknown)."""
        return bound > 0 and best > 0 and (1 + self.tolerance) / bound < best

    def _trial_length(self) -> tuple[int, int]:
        """(settling, measured) steps of the current trial: ``settle_steps`` and
        ``trial_steps``, or a probe's one measured step.

        Two trials are probes: the run's first (the calibration: nothing is measured yet
        to say whether its method could win, and on a slow link it is among the dearest:
        fp16 at 1.77 s a step on the LSTM at 100 Mbit/s, against 0.17 s for the method
        chosen), and dense's first. Dense is not pruned by the byte prediction (the floor
        every choice is measured against; ``_bound``), and where fp16's step does not rule
        it out its steps are still the dearest: its full trial was most of what exploring
        cost on ResNet-18 at 1 Gbit/s (5 steps of 0.84 s against fp16's 0.48 s). Dense's
        probe does not settle: its first step after other methods measured 0.96-1.12x the
        median of its trial's later steps (the LSTM, ResNet-18 and wide CNN cells'
        trials). A probe that may still win is run again in full before the choice
        (``_probe_to_confirm``), so where dense is the fastest it costs one step more. A
        re-check runs dense again only when its score was close to the best: in full.
        Read from the agreed table and step counts: the same on every rank."""
        s = self._s
        if s.get("confirming"):
            return self.settle_steps, self.trial_steps
        if not s["table"]:
            # At least one step settles: the run's first step has no step time (it is
            # timed from the previous step's end), so a calibration measured there would
            # enter the table without one and never score (settle_steps=0).
            return max(self.settle_steps, 1), 1
        if s["current"] == "dense" and "dense" not in s["table"]:
            return 0, 1
        return self.settle_steps, self.trial_steps

    def _probing(self) -> bool:
        """A trial shorter than a full one: fewer measured steps, or none settled."""
        settle, measured = self._trial_length()
        return measured != self.trial_steps or settle < self.settle_steps

    def _probe_to_confirm(self) -> str | None:
        """The method measured by a probe (``_trial_length``) that may still win, or None:
        the one of the best score among those whose probed step time, divided by
        ``PROBE_NOISE``, could beat the best score (with ``tolerance``). One step is
        noisier than a trial's median, so a probe rules its method out only by a margin;
        its confirmation, a full trial, replaces the probe's entry."""
        s, best = self._s, self._best_score()
        probed = [k for k, e in s["table"].items() if e.get("probe") and self._eligible(k)
                  and not self._cannot_win(e["t"] / PROBE_NOISE, best)]
        return max(probed, key=self._score, default=None)

    def _ready(self, key: str) -> bool:
        """A level is tried after the levels that keep more (a lower CF, a higher rank)
        were measured (or left the queue, pruned): their gains bound its gain, so a family
        is climbed from its safe end, as GraVAC climbs its ladder."""
        table, queue = self._s["table"], self._s["queue"]
        if key.endswith(SPLIT):
            return True         # proposed by its CF's own measurement (_propose_splits)
        return all(c.key in table or c.key not in queue for c in self._safer(key))

    def _safer(self, key: str) -> list[Method]:
        """The candidates of ``key``'s family that keep more than it: a lower CF, a higher
        rank (none for dense and fp16)."""
        m = self._method(key)
        if m.kind == "sparse":
            return [c for c in self.candidates if c.kind == "sparse" and c.level < m.level]
        if m.kind == "powersgd":
            return [c for c in self.candidates if c.kind == "powersgd" and c.level > m.level]
        return []

    def _switch(self, key: str, phase: str, confirming: bool = False) -> None:
        """Make ``key`` the current method, for a trial or a run. A run's smoothed gains
        start from its table entry (the mean over the steps that chose it), not from its
        first step alone: at GraVAC's alpha (N/100) one first gain below ε would send
        dense for dozens of steps of a method chosen as eligible."""
        s = self._s
        # A switch of method settles before the lag counts (``decide``), in a run as in a
        # trial: its first steps measure the residual the previous method left.
        s["lag_settle"] = self.settle_steps if key != s["current"] else 0
        if key != s["current"]:
            s["delta"] = s["delta_c"] = None
        entry = s["table"].get(key)
        if phase == "run" and entry is not None and not self._method(key).dense:
            s["delta"], s["delta_c"] = entry["gain"], entry.get("gain_next")
        s.update(phase=phase, current=key, step_in_phase=0, samples=[], trial_gains=[],
                 confirming=confirming, layer_energy={}, unmeasured=0)

    def _prune_by_gain(self, step: int) -> None:
        """Gains only fall with a higher CF or a lower rank: a gain below ε rules out every
        queued method that keeps less."""
        s = self._s
        key = s["current"]
        m, entry = self._method(key), s["table"][key]
        out = []
        if key.endswith(SPLIT):
            return          # its gain is over the layers it compresses: no bound on others
        if m.kind == "sparse":
            cap = m.level if entry["gain"] < self.epsilon else None
            nxt = self._next_cf(m)
            if cap is None and nxt is not None and entry["gain_next"] is not None \
                    and entry["gain_next"] < self.epsilon:
                cap = nxt
            if cap is not None:
                out = [k for k in s["queue"] if self._method(k).kind == "sparse"
                       and self._method(k).level >= cap and not k.endswith(SPLIT)]
        elif m.kind == "powersgd" and self._quality(key, entry) < self._epsilon(key):
            # (A lower rank leaves more in the residual: a larger lag as well.)
            out = [k for k in s["queue"] if self._method(k).kind == "powersgd"
                   and self._method(k).level <= m.level]
        if not self._lag_gated(key):
            why = f"gain below epsilon={self._epsilon(key):g}"
        elif self._entry_fills(entry):
            why = f"lag above low_rank_lag={self.low_rank_lag:g}"
        else:
            why = "residual not filled for its lag to show"
        for k in out:
            s["queue"].remove(k)
            self._log(step, "pruned", k, reason=f"{why} (measured with {key})")

    def _propose_splits(self, step: int) -> list[str]:
        """With ``split_layers``, at the end of a sparse CF's trial or run: for that CF and
        its next (the second pass's energies), when the gain over every layer is below ε,
        the split (``gravac.controllers.split``): the layers to keep compressed for the
        fewest bytes while their gain, as the engine measures it, clears ε, the others
        dense. Returns the splits to queue as methods of their own (``<cf>/split``): not
        one whose table entry measured that same split; the queue prunes them by their
        predicted time like any other. From the agreed per-layer energies: the same on
        every rank."""
        s = self._s
        key, energy = s["current"], s.get("layer_energy") or {}
        m = self._method(key)
        proposed = []
        if not self.split_layers or m.kind != "sparse" or key.endswith(SPLIT) or not energy:
            return proposed
        for level, column in ((m.level, 0), (self._next_cf(m), 1)):
            whole = None if level is None else Method("sparse", level, m.exchange).key
            if whole not in self._by_key:
                continue
            method = self._method(whole)
            whole_bytes = self._wire_bytes(method, set())
            # A layer's bytes saved: the step's bytes with it dense, less with it compressed.
            gains = [LayerGain(name, e[column] / e[2] if e[2] > 0 else 1.0, e[2],
                               self._wire_bytes(method, {name}) - whole_bytes)
                     for name, e in energy.items()]
            gain = measured_gain(gains, energy)
            if gain is None or gain >= self.epsilon:
                continue
            keep = compressed_layers(gains, self.epsilon)
            dense = sorted(set(energy) - set(keep))
            split = whole + SPLIT
            if not keep or not dense or (s["splits"].get(split) == dense
                                         and split in s["table"]):
                continue
            s.setdefault("splits", {})[split] = dense
            s["table"].pop(split, None)
            proposed.append(split)
            self._log(step, "split", split, dense_layers=dense,
                      gain=measured_gain(gains, keep),
                      reason=f"{whole}'s gain {gain:.3g} is below epsilon={self.epsilon:g} "
                             f"(measured with {key})")
        return proposed

    # -- the table ------------------------------------------------------------------------
    def _eligible(self, key: str) -> bool:
        e = self._s["table"].get(key)
        return e is not None and e["t"] is not None and e["t"] > 0 and \
            (key == "dense" or self._quality(key, e) >= self._epsilon(key))

    def _score(self, key: str) -> float:
        """Compression throughput per sample: what a step is worth (``_worth``) / step
        time (samples per step fixed); 0 for a method not eligible."""
        if not self._eligible(key):
            return 0.0
        e = self._s["table"][key]
        return self._worth(self._quality(key, e)) / e["t"]

    @staticmethod
    def _worth(quality: float) -> float:
        """What one step of a method is worth against a dense step, from its quality
        (``_quality``): its gain (GraVAC's compression throughput), or under
        ``low_rank_lag`` 1 - its judged lag, capped at a dense step's 1 (a lag below 0 is
        noise around 0: a step is worth no more than a dense one)."""
        return min(quality, 1.0)

    def _best_score(self) -> float:
        return max((self._score(k) for k in self._s["table"]), default=0.0)

    def _predicted(self, key: str) -> float:
        """A lower bound of ``key``'s step time: the least local time measured plus its
        link bytes at the best bandwidth measured (0 before anything was measured). Local
        time leaves out the waits and the packing of the wire buffers (fp16's casts), which
        another method may not have.

        It is a lower bound where the link's bandwidth dominates the waits. Where it does
        not (loopback, or ranks sharing few cores, whose collectives' CPU work shows as
        local time), scaling fp16's wait up to dense's bytes priced dense above its real
        step: on loopback it pruned dense, the fastest method there, and the choice ran
        at 0.3x dense. So dense, the floor every choice is measured against, is never
        pruned by it: its first trial is a probe, run in full where it could win."""
        seen = [(k, e) for k, e in self._s["table"].items()
                if e["t"] is not None and e["t_comm"] is not None]
        rates = [e["t_comm"] / self.wire_bytes(k) for k, e in seen
                 if e["t_comm"] > 0 and self.wire_bytes(k) > 0]
        if not seen or not rates:
            return 0.0
        local = min(max(e["t"] - e["t_comm"] - (e.get("t_pack") or 0.0), 0.0) for _, e in seen)
        return local + self.wire_bytes(key) * min(rates)

    def _bound(self, key: str) -> float:
        """A lower bound of ``key``'s step time: the byte prediction (``_predicted``), or
        its own measured step time divided by ``PROBE_NOISE`` where that is higher. With
        overlap a step's waits hide part of the link's time, so the rates measured from
        them, and the prediction, can be far too low: on the LSTM at 100 Mbit/s a re-check
        ran fp16 (1.77 s a step) for a full trial after Top-k 10x had scored 1.01 a second,
        which fp16's own step could not reach.

        Dense's is not the byte prediction, which is no lower bound for it where the CPU
        or latency dominates the waits (``_predicted``), but fp16's measured step divided
        by ``DENSE_FROM_FP16``: on a slow link dense's probe was the dearest step of a run
        (3.5 s on the LSTM at 100 Mbit/s, where PowerSGD rank 4 ran at 0.17 s), and no
        step of it could win. Read from the agreed table: the same on every rank."""
        entry = self._s["table"].get(key)
        own = entry["t"] / PROBE_NOISE if entry is not None and entry.get("t") else 0.0
        if key == "dense":
            fp16 = self._s["table"].get("fp16")
            from_fp16 = fp16["t"] / DENSE_FROM_FP16 if fp16 and fp16.get("t") else 0.0
            return max(from_fp16, own)
        return max(self._predicted(key), own)

    def wire_bytes(self, key: str) -> float:
        """Bytes through the slowest link of a ring for one step of ``key`` (Gloo's ring
        allreduce and allgather; latency left out: a lower bound)."""
        return self._wire_bytes(self._method(key), set(self._dense_layers(key)))

    def _wire_bytes(self, m: Method, dense_layers: set) -> float:
        """``wire_bytes`` of method ``m`` with the compressed layers ``dense_layers`` sent
        dense beside the layers the engine never compresses."""
        n = self._world

        def allreduce(nbytes):
            return sizes.collective_terms("allreduce", nbytes, n)[1]
        shapes = {k: v for k, v in self._shapes.items() if k not in dense_layers}
        numels = [_numel(s) for s in shapes.values()]
        other_numel = self._other_numel + sum(_numel(self._shapes[k]) for k in dense_layers)
        other = VALUE_BYTES * other_numel
        if m.kind == "dense":
            return allreduce(VALUE_BYTES * sum(numels) + other)
        if m.kind == "fp16":
            return allreduce(2 * sum(numels) + 2 * other_numel)
        if m.kind == "powersgd":
            factors, dense = 0, other
            for shape in shapes.values():
                rows, cols = sizes.matrix_shape(shape)
                r = min(m.rank, rows, cols)
                if sizes.compression_factor(rows, cols, r) > 1:
                    factors += VALUE_BYTES * r * (rows + cols)
                else:
                    dense += VALUE_BYTES * rows * cols
            return allreduce(factors) + allreduce(dense)
        counts = [sizes.num_kept(x, m.level) for x in numels]
        exchange = m.exchange_for(n, self._exchange)
        chunk = sizes.sparse_chunk_bytes(numels, counts, coded=exchange == "allgather_coded")
        if exchange in ("shared_index", "hierarchical"):
            return allreduce(VALUE_BYTES * sum(counts)) + allreduce(other)
        return sizes.collective_terms("allgather", chunk, n)[1] + allreduce(other)

    # -- logging and state ----------------------------------------------------------------
    def _log(self, step: int, event: str, method: str, **fields) -> None:
        keep_decision(self._s, {"step": step, "event": event, "method": method, **fields})

    @property
    def current(self) -> str:
        """The method the next step runs."""
        return self._s["current"]

    @property
    def phase(self) -> str:
        return self._s["phase"]

    @property
    def table(self) -> dict:
        return copy.deepcopy(self._s["table"])

    def summary(self) -> dict:
        """The smoothed gains of the current method: its own and its next CF's (what
        starts a climb), in every step record."""
        return {"delta_min": self._s["delta"], "delta_c": self._s.get("delta_c")}

    @property
    def decisions(self) -> list[dict]:
        return self._s["decisions"]

    @property
    def decisions_made(self) -> int:
        return decision_count(self._s)

    def state_dict(self) -> dict:
        return {"hyper": self.describe(), "state": copy.deepcopy(self._s)}

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state, dict) or "state" not in state:
            raise ValueError("not an Auto state dict: expected keys 'hyper' and 'state'")
        if state.get("hyper") != self.describe():
            raise ValueError(f"Auto state was saved with other options: saved "
                             f"{state.get('hyper')}, current {self.describe()}")
        self._s = copy.deepcopy(state["state"])

    def describe(self) -> dict:
        return {"controller": "Auto", "methods": list(self.method_texts),
                "epsilon": self.epsilon, "trial_steps": self.trial_steps,
                "settle_steps": self.settle_steps, "recheck_every": self.recheck_every,
                "recheck_within": self.recheck_within, "tolerance": self.tolerance,
                "alpha": self.alpha_option,
                # (Only when on, or not the default: checkpoints written before the
                # option still load.)
                **({"split_layers": True} if self.split_layers else {}),
                **({"epsilon_low_rank": self.epsilon_low_rank}
                   if self.epsilon_low_rank is not None else {}),
                **({"low_rank_lag": self.low_rank_lag}
                   if self.low_rank_lag is not None else {}),
                **({"switch_margin": self.switch_margin}
                   if self.switch_margin != SWITCH_MARGIN else {}),
                **({"decide": self.decide_rule} if self.decide_rule != DECIDE else {})}

    def __repr__(self) -> str:
        return f"Auto(methods={self.method_texts})"


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
