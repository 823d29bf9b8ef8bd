"""``Auto`` (controller: auto) with scripted step times and gains: what it runs, prunes
and chooses, exactly; its byte prediction against the engine's size arithmetic; resume."""
import pickle
import statistics

import pytest

from gravac.controllers import SENT_DENSE, SENT_MIN, Auto, LocalSync, Method, StepRecord, base
from gravac.util import sizes

SHAPES = {"embed": (1000, 64), "fc": (256, 512)}
OTHER = 300


class _Sync2(LocalSync):
    """Two ranks as the byte prediction counts them (one rank puts nothing on a link)."""
    size = 2


def _auto(world: int = 1, **kw) -> Auto:
    a = Auto(**{"epsilon": 0.5, "trial_steps": 2, "settle_steps": 1, "recheck_every": 10, **kw})
    a.bind(list(SHAPES), _Sync2() if world == 2 else LocalSync())
    a.observe_layers(SHAPES, OTHER, "allgather")
    return a


def _drive(auto: Auto, steps: int, time_of, gain_of, next_gain_of=lambda m: None,
           comm: float = 0.5, sync=None, lag_of=None):
    """Run ``steps`` scripted steps: the method planned gets ``time_of(key)`` seconds
    (``comm`` of them waits) and the gains ``gain_of(key)`` (its own) and
    ``next_gain_of(key)`` (the next CF's), and ``lag_of(key)`` where the plan measures
    the lag; ``sync``: this rank's (default one rank)."""
    ran = []
    for step in range(steps):
        plan = auto.plan(step)
        key = plan.method.key
        ran.append(key)
        sent = SENT_MIN
        if plan.measure_lag:
            auto.observe_lag(lag_of(key))
        if plan.needs_gains:
            sent = auto.decide(gain_of(key), next_gain_of(key))
        t = time_of(key)
        auto.end_step(StepRecord(step=step, sent=sent, cf=1.0, gain=1.0, t_iter=t,
                                 samples=32, extra={"t_comm": None if t is None else comm * t}),
                      sync or LocalSync())
    return ran


def _lower(lags):
    """Mean less standard error, computed here with the statistics module."""
    return statistics.fmean(lags) - statistics.stdev(lags) / len(lags) ** 0.5


def test_methods_are_written_one_way():
    assert Method.parse("powersgd:4") == Method("powersgd", 4.0)
    assert Method.parse("sparse:40@shared_index").key == "sparse:40@shared_index"
    assert Method("fp16").dense and not Method("sparse", 10.0).dense
    for bad in ("ring", "sparse", "powersgd:1.5", "dense:3", "sparse:1", "fp16@allgather",
                "sparse:x", "sparse:inf", "sparse:nan", "powersgd:inf"):
        with pytest.raises(ValueError, match="method"):
            Method.parse(bad)


def test_a_sparse_method_picks_its_exchange_by_the_world():
    m = Method("sparse", 10.0)
    assert m.exchange_for(4, "allgather") == "allgather"          # CF 10 > 4 ranks
    assert m.exchange_for(16, "allgather") == "shared_index"      # allgather would exceed dense
    assert m.exchange_for(16, "allgather_coded") == "allgather_coded"   # the user's choice
    assert Method("sparse", 10.0, "hierarchical").exchange_for(16, "allgather") == "hierarchical"


@pytest.mark.parametrize("kw, match", [
    ({"methods": ["fp16", "sparse:10"]}, "must include 'dense'"),
    ({"methods": ["dense", "dense"]}, "twice"),
    ({"methods": ["dense", "ring"]}, "kind must be one of"),
    ({"methods": "dense"}, r"Auto\(methods='dense'\): must be a list of methods"),
    ({"epsilon": 0}, r"epsilon=0\)"), ({"trial_steps": 0}, "trial_steps"),
    ({"settle_steps": -1}, "settle_steps"), ({"recheck_every": 1.5}, "recheck_every"),
    ({"tolerance": -0.1}, "tolerance"), ({"alpha": 2}, "alpha"),
    ({"epsilon_low_rank": 0}, "epsilon_low_rank"), ({"epsilon_low_rank": "0.1"}, "epsilon_low_rank"),
    ({"epsilon_low_rank": True}, "epsilon_low_rank"), ({"switch_margin": -0.1}, "switch_margin"),
    ({"low_rank_lag": 0}, "low_rank_lag"), ({"low_rank_lag": 1.5}, "low_rank_lag"),
    ({"low_rank_lag": True}, "low_rank_lag"),
    ({"low_rank_lag": 0.1, "epsilon_low_rank": 0.3}, "not both"),
    ({"epsilon": "0.5"}, r"Auto\(epsilon='0.5'\): must be in \(0, 1\]"),
    ({"epsilon": None}, r"Auto\(epsilon=None\)"), ({"epsilon": True}, r"Auto\(epsilon=True\)"),
    ({"tolerance": "0.1"}, r"Auto\(tolerance='0.1'\): must be a number"),
    ({"switch_margin": None}, r"Auto\(switch_margin=None\)"),
    ({"recheck_within": True}, r"Auto\(recheck_within=True\)"),
    ({"alpha": "0.1"}, r"Auto\(alpha='0.1'\)"), ({"alpha": True}, r"Auto\(alpha=True\)")])
def test_bad_options_name_the_option(kw, match):
    with pytest.raises(ValueError, match=match):
        Auto(**kw)


def test_fp16_first_then_each_family_from_its_safe_end_and_gains_prune_what_keeps_less():
    auto = _auto(world=2)
    times = {"dense": 2.0, "fp16": 1.2, "powersgd:4": 0.5, "powersgd:1": 0.4,
             "sparse:10": 0.6, "sparse:20": 0.55, "sparse:40": 0.5, "sparse:160": 0.45,
             "sparse:1000": 0.4}
    gains = {"powersgd:4": 0.4, "sparse:10": 0.9, "sparse:20": 0.8}
    nexts = {"sparse:10": 0.8, "sparse:20": 0.45}      # sparse:40's gain, seen from sparse:20
    ran = _drive(auto, 14, times.get, lambda k: gains.get(k, 0.0), nexts.get)
    # fp16 calibrates the link, probed: one step after settling.
    assert ran[:2] == ["sparse:1000", "fp16"] and auto.calibration == "fp16"
    assert auto.table["fp16"]["steps"] == 1 and auto.table["fp16"]["probe"]
    assert "powersgd:1" not in ran       # rank 4 below ε: rank 1 keeps less
    # (The run's first step, fp16's settling step, runs sparse:1000: the fewest bytes.)
    assert "sparse:40" not in ran and "sparse:160" not in ran and "sparse:1000" not in ran[1:]
    assert ran.index("sparse:10") < ran.index("sparse:20")          # the ladder is climbed
    pruned = {d["method"]: d["reason"] for d in auto.decisions if d["event"] == "pruned"}
    assert set(pruned) == {"powersgd:1", "sparse:40", "sparse:160", "sparse:1000"}
    # Scores gain / t: fp16 0.83, sparse:10 1.5, sparse:20 0.8/0.55 = 1.45. Dense, the
    # floor, is never pruned; fp16's measured 1.2 s says it cannot win ((1 + 0.1) / 1.2 <
    # 1.5), so dense is probed too: one step, without settling. Neither probe could win
    # at 1.5x its speed ((1 + 0.1) x 1.5 / 1.2 = 1.375 < 1.5): no full trial follows.
    assert ran[2:4] == ["powersgd:4"] * 2           # abandoned after its measured step
    assert ran[10:] == ["dense"] + ["sparse:10"] * 3 and ran.count("dense") == 1
    assert auto.table["dense"]["steps"] == 1 and auto.table["dense"]["t"] == 2.0
    chosen = [d for d in auto.decisions if d["event"] == "chosen"]
    assert chosen[0]["method"] == "sparse:10" == auto.current and auto.phase == "run"
    assert chosen[0]["scores"]["powersgd:4"] == 0.0             # ineligible: gain < ε
    assert chosen[0]["score"] == pytest.approx(0.9 / 0.6)


def test_the_calibrations_settling_step_runs_the_method_of_fewest_bytes():
    """The run's first step settles fp16's calibration and is not measured: on 2 ranks it
    runs the candidate whose step puts the fewest bytes on the link, rank 4 here (its
    factors, 4 x 4 x (1000 + 64 + 256 + 512) bytes, against sparse:10's values and
    indices and fp16's 2 bytes a value), without measuring its lag (it would count under
    fp16's name). fp16's entry is its one probed step. On one rank no method puts bytes
    on a link: fp16 settles itself."""
    auto = _auto(world=2, methods=["dense", "fp16", "powersgd:4", "sparse:10"],
                 low_rank_lag=0.1)
    factors = 4 * 4 * (1000 + 64 + 256 + 512)
    assert auto.wire_bytes("powersgd:4") == factors + 4 * OTHER      # 2 ranks: x 2 x 1/2
    assert auto.wire_bytes("powersgd:4") < min(auto.wire_bytes(k) for k in
                                               ("dense", "fp16", "sparse:10"))
    first = auto.plan(0)
    assert first.method.key == "powersgd:4" and first.layer_rank is not None
    assert not first.measure_lag and not first.layer_gains
    ran = _drive(auto, 8, {"dense": 2.0, "fp16": 1.2, "powersgd:4": 0.1,
                           "sparse:10": 0.6}.get, lambda k: 0.6,
                 lag_of=lambda k: 5.0 if auto.current == "fp16" else 0.01)
    assert ran[:2] == ["powersgd:4", "fp16"]
    assert auto.table["fp16"]["steps"] == 1 and auto.table["fp16"]["t"] == 1.2
    pools = auto.state_dict()["state"]["lag_pool"]
    assert set(pools) == {"powersgd:4"} and set(pools["powersgd:4"]) == {0.01}
    one_rank = _auto(methods=["dense", "fp16", "powersgd:4"])
    assert one_rank.plan(0).method.key == "fp16"


def test_the_first_trial_settles_a_step_even_with_settle_steps_0():
    """The run's first step has no step time (timed from the previous step's end): with
    ``settle_steps=0`` the calibration still settles it and measures the next one, so fp16
    enters the table with a time and, fastest here, is chosen."""
    auto = _auto(methods=["dense", "fp16", "sparse:10"], settle_steps=0)
    times = {"dense": 1.0, "fp16": 0.4, "sparse:10": 0.8}
    ran = []
    for step in range(12):
        plan = auto.plan(step)
        key = plan.method.key
        ran.append(key)
        sent = auto.decide(0.9, None) if plan.needs_gains else SENT_MIN
        auto.end_step(StepRecord(step=step, sent=sent, cf=1.0, gain=1.0,
                                 t_iter=None if step == 0 else times[key], samples=32,
                                 extra={"t_comm": 0.1}), LocalSync())
    assert ran[:2] == ["fp16", "fp16"]
    assert auto.table["fp16"]["t"] == 0.4
    assert auto.current == "fp16" and auto.phase == "run"


@pytest.mark.parametrize("t_fp16, confirmed", [(0.9, True), (1.2, False)])
def test_a_probe_that_could_win_runs_a_full_trial_before_the_choice(t_fp16, confirmed):
    """fp16's calibration probe measures one step. sparse:10 then scores 0.9 / 0.5 = 1.8.
    At 0.9 s fp16 could win were its one step 1.5x slow (1.1 x 1.5 / 0.9 = 1.83): it runs a
    full trial (settling, then trial_steps), whose entry replaces the probe's, before the
    choice. At 1.2 s (1.375) it cannot, and sparse:10 is chosen at once."""
    auto = _auto(world=2, methods=["dense", "fp16", "sparse:10"])
    times = {"dense": 3.0, "fp16": t_fp16, "sparse:10": 0.5}
    ran = _drive(auto, 2 + 3 + 1 + 3 + 1, times.get, lambda k: 0.9)
    assert ran[:6] == ["sparse:10", "fp16"] + ["sparse:10"] * 3 + ["dense"]
    assert ran[6:9] == (["fp16"] * 3 if confirmed else ["sparse:10"] * 3)
    assert auto.table["fp16"]["steps"] == (2 if confirmed else 1)
    assert auto.table["fp16"].get("probe", False) == (not confirmed)
    assert auto.table["dense"]["probe"] and auto.table["dense"]["steps"] == 1
    chosen = [d for d in auto.decisions if d["event"] == "chosen"]
    assert [d["method"] for d in chosen] == ["sparse:10"]
    assert chosen[0]["step"] == (8 if confirmed else 5)


def test_the_chosen_method_falls_back_to_dense_per_step_when_its_smoothed_gain_drops():
    auto = _auto(methods=["dense", "sparse:10"], alpha=1.0)
    _drive(auto, 6, {"dense": 1.0, "sparse:10": 0.5}.get, lambda k: 0.9)
    assert auto.current == "sparse:10"
    auto.plan(6)
    assert auto.decide(0.4, None) == SENT_DENSE
    assert auto.decide(0.8, None) == SENT_MIN


@pytest.mark.parametrize("decide", ["current", "previous"])
def test_a_plan_says_its_level_when_it_is_known_before_the_step(decide):
    """A trial sends its method (SENT_MIN, known before the step); a run's level comes
    from this step's gain under decide="current" (None), from the smoothed gain up to
    the previous step under "previous"."""
    auto = _auto(methods=["dense", "sparse:10"], alpha=1.0, decide=decide)
    assert auto.plan(0).method.key == "dense" and auto.plan(0).decided is None
    trial_plans = []
    for step in range(6):
        plan = auto.plan(step)
        if auto._s["phase"] == "trial" and not plan.method.dense:
            trial_plans.append(plan.decided)
        _drive(auto, 1, {"dense": 1.0, "sparse:10": 0.5}.get, lambda k: 0.9)
    assert trial_plans and set(trial_plans) == {SENT_MIN}
    assert auto.current == "sparse:10" and auto._s["phase"] == "run"
    auto.plan(6)
    auto.decide(0.4, None)              # this step's gain: below ε (alpha 1)
    auto.end_step(StepRecord(step=6, sent=SENT_DENSE, cf=1.0, gain=1.0, t_iter=0.5,
                             samples=32, extra={"t_comm": 0.2}), LocalSync())
    expected = {"current": None, "previous": SENT_DENSE}[decide]
    assert auto.plan(7).decided == expected
    assert auto.describe().get("decide") == ("previous" if decide == "previous" else None)
    with pytest.raises(ValueError, match="decide"):
        Auto(decide="next")


def test_a_trial_sends_its_method_in_every_step_whatever_its_smoothed_gain():
    """A trial whose first gain is below ε, but within recheck_within of it (the smoothed
    gain, at GraVAC's small alpha, stays below ε for the whole trial), still sends its
    method: the entry gets the method's own time, and its mean gain (above ε) makes it
    eligible."""
    auto = _auto(methods=["dense", "powersgd:4"], alpha=0.02, trial_steps=3)
    gains = iter([0.45, 0.7, 0.7, 0.7])        # powersgd:4's trial: mean over measured 0.7
    sent = []
    for step in range(6):       # dense's calibration probe (2 steps), powersgd:4's trial
        plan = auto.plan(step)
        key = plan.method.key
        if plan.needs_gains:
            sent.append(auto.decide(next(gains), None))
        auto.end_step(StepRecord(step=step, sent=SENT_MIN, cf=1.0, gain=1.0,
                                 t_iter={"dense": 1.0, "powersgd:4": 0.1}[key], samples=32,
                                 extra={"t_comm": 0.05}), LocalSync())
    assert sent == [SENT_MIN] * 4
    entry = auto.table["powersgd:4"]
    assert entry["t"] == pytest.approx(0.1) and entry["gain"] == pytest.approx(0.7)
    assert auto.current == "powersgd:4" and auto.phase == "run"


def test_a_run_starts_its_smoothed_gain_from_the_gain_that_chose_it():
    """sparse:10's trial starts at a gain of 0.45 (its settling step), then measures 0.8:
    chosen at a mean gain of 0.8, its run's first gain of 0.45 does not send dense. At
    alpha 0.02 the smoothed gain is 0.98 * 0.8 + 0.02 * 0.45, not the trial's EWMA, which
    its first step held below ε. The candidate gain starts from the trial's too."""
    auto = _auto(methods=["dense", "sparse:10", "sparse:20"], alpha=0.02)
    gains = iter([0.45, 0.8, 0.8])
    _drive(auto, 5, {"dense": 2.0, "sparse:10": 0.5, "sparse:20": 0.4}.get,
           lambda k: next(gains), {"sparse:10": 0.3}.get)
    assert auto.current == "sparse:10" and auto.phase == "run"
    assert auto.table["sparse:10"]["gain"] == pytest.approx(0.8)
    auto.plan(5)
    assert auto.decide(0.45, 0.2) == SENT_MIN
    assert auto.summary()["delta_min"] == pytest.approx(0.98 * 0.8 + 0.02 * 0.45)
    assert auto.summary()["delta_c"] == pytest.approx(0.98 * 0.3 + 0.02 * 0.2)


def test_a_chosen_method_whose_smoothed_gain_falls_below_epsilon_is_rechecked_at_once():
    auto = _auto(methods=["dense", "sparse:10"], alpha=0.5, recheck_every=1000)
    gains = iter([0.9] * 3 + [0.3] * 20)          # the trial, then the run's gains fall
    ran = _drive(auto, 11, {"dense": 1.0, "sparse:10": 0.5}.get, lambda k: next(gains))
    assert ran[5:11] == ["sparse:10"] * 3 + ["dense"] * 3   # ran 3 steps, re-checked
    assert ran[:5] == ["dense"] * 2 + ["sparse:10"] * 3    # dense's calibration: a probe
    run = [d for d in auto.decisions if d["event"] == "measured" and d["method"] == "sparse:10"][-1]
    assert run["method"] == "sparse:10" and run["gain"] < auto.epsilon
    assert run["step"] < 3 + 3 + 1000                     # not after recheck_every steps
    assert auto.current == "dense" and auto.phase == "run"


def test_a_candidate_predicted_too_slow_is_never_run():
    """Dense measured at 1 s with 0.9 s of waits, 8 ranks: CF 2 by allgather puts 4x
    dense's bytes on the link (7 chunks of n/2 values and indices against 2·7/8 of n
    values), so it cannot win, and the prediction prunes it; CF 40 may, and runs."""
    class Sync8(LocalSync):
        size = 8
    auto = Auto(methods=["dense", "sparse:2@allgather", "sparse:40"], trial_steps=2,
                settle_steps=1)
    auto.bind(list(SHAPES), Sync8())
    auto.observe_layers(SHAPES, OTHER, "allgather")
    ran = []
    for step in range(12):
        plan = auto.plan(step)
        ran.append(plan.method.key)
        if plan.needs_gains:
            auto.decide(0.9, None)
        auto.end_step(StepRecord(step=step, sent=SENT_MIN, cf=1.0, gain=1.0, t_iter=1.0,
                                 samples=32, extra={"t_comm": 0.9}), Sync8())
    assert "sparse:2@allgather" not in ran and "sparse:40" in ran
    assert auto.wire_bytes("sparse:2@allgather") > 3 * auto.wire_bytes("dense")
    pruned = [d for d in auto.decisions if d["event"] == "pruned"]
    assert [d["method"] for d in pruned] == ["sparse:2@allgather"]
    assert "predicted step time" in pruned[0]["reason"]


def test_wire_bytes_follow_the_size_arithmetic():
    auto = _auto()
    auto._world = 4
    numel = sum(r * c for r, c in SHAPES.values())
    ring = 2 * 3 / 4
    assert auto.wire_bytes("dense") == pytest.approx(ring * 4 * (numel + OTHER))
    assert auto.wire_bytes("fp16") == pytest.approx(ring * 2 * (numel + OTHER))
    counts = [sizes.num_kept(r * c, 40) for r, c in SHAPES.values()]
    chunk = sizes.sparse_chunk_bytes([r * c for r, c in SHAPES.values()], counts)
    assert auto.wire_bytes("sparse:40") == pytest.approx(3 * chunk + ring * 4 * OTHER)
    factors = sum(4 * 4 * (r + c) for r, c in SHAPES.values())
    assert auto.wire_bytes("powersgd:4") == pytest.approx(ring * factors + ring * 4 * OTHER)


def test_recheck_measures_the_run_and_tries_the_close_methods_again():
    """A fast link (waits 5% of a step): after fp16's probe calibrated the link (the
    sparse CF, predicted faster, first), dense's probe may win, and so may fp16's: both
    run a full trial before the choice, fp16, the best, first. The re-check runs dense,
    within 15% of fp16's score, in full at once (its entry is a full trial's)."""
    auto = _auto(world=2, methods=["dense", "fp16", "sparse:10"], recheck_every=4)
    times = {"dense": 1.0, "fp16": 0.9, "sparse:10": 2.0}
    ran = _drive(auto, 12 + 4 + 3, times.get, lambda k: 0.9, comm=0.05)
    assert ran[:12] == ["sparse:10", "fp16"] + ["sparse:10"] * 3 + ["dense"] + ["fp16"] * 3 + \
        ["dense"] * 3
    assert ran[12:16] == ["fp16"] * 4                     # the choice runs
    # The re-check: dense is within 15% of fp16's score, sparse:10 (score 0.45) is not.
    assert ran[16:19] == ["dense"] * 3
    measured = [d["method"] for d in auto.decisions if d["event"] == "measured"]
    assert measured == ["fp16", "sparse:10", "dense", "fp16", "dense", "fp16", "dense"]


@pytest.mark.parametrize("t_pack", [0.0, 0.15])
def test_the_bound_leaves_out_the_packing_and_never_prunes_the_floor(t_pack):
    """fp16 measured at 1 s, 0.05 s of waits and 0.15 s casting to and from fp16: dense's
    bound is fp16's local time without the casts plus twice its waits (0.9 s with the
    casts left out, 1.05 s without them). The second would prune it (tolerance 0), but
    dense, the floor, is measured whatever its bound says: a probe, then in full, as
    its probed step could win."""
    auto = _auto(world=2, methods=["dense", "fp16"], tolerance=0.0)
    ran = []
    for step in range(9):
        if step == 2:        # fp16's probe measured: dense's bound
            assert auto._predicted("dense") == pytest.approx(1.0 - 0.05 - t_pack + 0.1)
        ran.append(auto.plan(step).method.key)
        auto.end_step(StepRecord(step=step, sent=SENT_MIN, cf=1.0, gain=1.0, t_iter=1.0,
                                 samples=32, extra={"t_comm": 0.05, "t_pack": t_pack}),
                      LocalSync())
    # fp16's probe, dense's, then both in full (fp16's first: the same score, listed first)
    assert ran == ["fp16"] * 2 + ["dense"] + ["fp16"] * 3 + ["dense"] * 3
    assert not [d for d in auto.decisions if d["event"] == "pruned"]


def test_dense_runs_where_fp16s_step_is_no_slower_than_the_best_and_its_prediction_is():
    """Loopback-like: every step CPU-bound, waits 90% of it. fp16's waits scaled to dense's
    bytes predict dense at 0.05 + 2 x 0.495 = 1.04 s, which could not beat sparse:10's
    score (0.9 / 0.5 = 1.8); but fp16's measured 0.55 s, the floor's bound, could
    ((1 + 0.1) / 0.55 = 2.0): dense's probe runs, could win, runs in full, and wins (after
    fp16's probe, close to dense's score, ran its full trial)."""
    auto = _auto(world=2, methods=["dense", "fp16", "sparse:10"])
    times = {"dense": 0.45, "fp16": 0.55, "sparse:10": 0.5}
    ran = _drive(auto, 5, times.get, lambda k: 0.9, comm=0.9)
    assert auto._predicted("dense") == pytest.approx(0.05 + 2 * 0.495)
    ran += _drive(auto, 1 + 3 + 3 + 1, times.get, lambda k: 0.9, comm=0.9)
    assert ran == ["sparse:10", "fp16"] + ["sparse:10"] * 3 + ["dense"] + ["dense"] * 3 + \
        ["fp16"] * 3 + ["dense"]
    assert auto.current == "dense" and auto.phase == "run"


def test_a_dense_trial_that_fp16_rules_out_is_a_probe_and_dense_still_wins_if_fast():
    """fp16 measured 0.8 s (its sums slower per value than fp32's, as Horovod's on a fast
    link): dense's same local work at twice fp16's bytes could not beat sparse:10 (0.9 /
    0.3 s = 3 > 1.1 / 0.8), but dense is probed all the same (every first dense trial is):
    one step, without settling. That step takes 0.25 s (score 4): dense may win, so it
    runs a full trial before the choice, and wins."""
    auto = _auto(world=2, methods=["dense", "fp16", "sparse:10"])
    ran = _drive(auto, 2 + 3 + 1 + 3 + 1, {"dense": 0.25, "fp16": 0.8, "sparse:10": 0.3}.get,
                 lambda k: 0.9)
    assert ran == ["sparse:10", "fp16"] + ["sparse:10"] * 3 + ["dense"] + ["dense"] * 3 + ["dense"]
    probe = [d for d in auto.decisions if d["method"] == "dense" and d.get("probe")]
    assert [(d["step"], d["steps"]) for d in probe] == [(5, 1)]
    assert auto.table["dense"]["steps"] == 2 and "probe" not in auto.table["dense"]
    assert auto.current == "dense" and auto.phase == "run"
    assert not [d for d in auto.decisions if d["event"] == "pruned"]


@pytest.mark.parametrize("t_fp16, pruned", [(1.9, True), (1.8, False)])
def test_dense_is_pruned_where_a_third_of_fp16s_step_cannot_win(t_fp16, pruned):
    """A slow link: sparse:10 scores 0.9 / 0.5 s = 1.8. Dense's bound is fp16's measured
    step / DENSE_FROM_FP16 (3): at 1.9 s, 0.633 s, whose best score (1 + 0.1) / 0.633 =
    1.74 cannot beat 1.8, so dense is pruned and never runs; at 1.8 s (1.83) its probe
    runs (3 s: it cannot win, and no full trial follows)."""
    auto = _auto(world=2, methods=["dense", "fp16", "sparse:10"])
    ran = _drive(auto, 2 + 3 + 3, {"dense": 3.0, "fp16": t_fp16, "sparse:10": 0.5}.get,
                 lambda k: 0.9)
    assert ran[:5] == ["sparse:10", "fp16"] + ["sparse:10"] * 3
    assert ran[5:] == (["sparse:10"] * 3 if pruned else ["dense"] + ["sparse:10"] * 2)
    out = [d for d in auto.decisions if d["event"] == "pruned"]
    if pruned:
        assert [(d["step"], d["method"]) for d in out] == [(4, "dense")]
        assert out[0]["reason"] == ("fp16's measured step / DENSE_FROM_FP16=3 >= 0.6333s "
                                    "cannot beat the best measured score")
        assert "dense" not in auto.table
    else:
        assert not out and auto.table["dense"]["probe"]
    chosen = [(d["step"], d["method"]) for d in auto.decisions if d["event"] == "chosen"]
    assert chosen == [(4 if pruned else 5, "sparse:10")]


def test_state_dict_resumes_to_the_same_decisions():
    times = {"dense": 1.0, "fp16": 0.8, "powersgd:4": 0.7, "powersgd:1": 0.6,
             "sparse:10": 0.9}
    a = _auto()
    _drive(a, 8, lambda k: times.get(k, 0.5), lambda k: 0.8, lambda k: 0.75)
    b = _auto()
    b.load_state_dict(a.state_dict())
    ran_a = _drive(a, 40, lambda k: times.get(k, 0.5), lambda k: 0.8, lambda k: 0.75)
    ran_b = _drive(b, 40, lambda k: times.get(k, 0.5), lambda k: 0.8, lambda k: 0.75)
    assert ran_a == ran_b and a.decisions == b.decisions
    with pytest.raises(ValueError, match="other options"):
        _auto(epsilon=0.6).load_state_dict(a.state_dict())


def test_a_long_run_keeps_the_latest_decisions_and_counts_all(monkeypatch):
    """A re-check every 4 steps logs events for ever: ``decisions`` keeps the latest
    DECISIONS_KEPT (the trainer writes each as it appears), ``decisions_made`` counts all,
    and the state's size stops growing; a resumed copy decides alike."""
    monkeypatch.setattr(base, "DECISIONS_KEPT", 10)
    times = {"dense": 1.0, "fp16": 0.9, "sparse:10": 2.0}
    a = _auto(world=2, methods=["dense", "fp16", "sparse:10"], recheck_every=4)
    _drive(a, 200, times.get, lambda k: 0.9, comm=0.05)
    made, size = a.decisions_made, len(pickle.dumps(a.state_dict()))
    b = _auto(world=2, methods=["dense", "fp16", "sparse:10"], recheck_every=4)
    b.load_state_dict(a.state_dict())
    for ctrl in (a, b):
        _drive(ctrl, 2000, times.get, lambda k: 0.9, comm=0.05)
    assert a.decisions == b.decisions and len(a.decisions) == 10
    assert a.decisions_made == b.decisions_made > 5 * made > 50
    assert len(pickle.dumps(a.state_dict())) < 1.1 * size


@pytest.mark.parametrize("methods", [None, ["dense", "fp16"]])
def test_a_trial_step_without_a_step_time_is_measured_again(methods):
    """A resumed process's first step has no step time (nor has a skipped step). Resumed
    right after the calibration's settling step, fp16's probe takes one step more and
    enters its time: the same choices as the run not interrupted, one step later (fp16's
    probe left without a time was never eligible again, and Top-k ran the run)."""
    times = {"dense": 2.0, "fp16": 1.0, "powersgd:4": 0.5, "powersgd:1": 0.4,
             "sparse:10": 0.7, "sparse:20": 0.55}
    gains = {"powersgd:4": 0.4, "sparse:10": 0.6, "sparse:20": 0.45}   # fp16's 1.0 wins
    a = _auto(world=2, methods=methods)
    _drive(a, 1, times.get, lambda k: gains.get(k, 0.0))     # fp16's settling step
    b = _auto(world=2, methods=methods)
    b.load_state_dict(a.state_dict())
    first = []

    def resumed_time(key):
        if not first:
            first.append(key)
            return None
        return times.get(key, 0.5)
    ran_a = _drive(a, 24, lambda k: times.get(k, 0.5), lambda k: gains.get(k, 0.0))
    ran_b = _drive(b, 25, resumed_time, lambda k: gains.get(k, 0.0))
    assert first == ["fp16"] and b.table["fp16"]["t"] == 1.0
    assert ran_b[1:] == ran_a
    assert [(d["event"], d["method"]) for d in b.decisions] == \
        [(d["event"], d["method"]) for d in a.decisions]
    assert [d["method"] for d in b.decisions if d["event"] == "chosen"][0] == "fp16"


def _recheck_between_fp16_and_dense(t_dense_later: float, **kw) -> tuple[Auto, list]:
    """fp16 (0.9 s) beats dense (1.0 s) in the first round; in its run its steps take
    1.0 s, and at the re-check dense's trial measures ``t_dense_later``."""
    auto = _auto(world=2, methods=["dense", "fp16"], recheck_every=4, **kw)
    calls = {"dense": 0, "fp16": 0}

    def time_of(key):
        calls[key] += 1
        if key == "fp16":
            return 0.9 if calls[key] <= 5 else 1.0     # probe 2 + confirmation 3, then the run
        return 1.0 if calls[key] <= 4 else t_dense_later   # probe 1 + confirmation 3
    ran = _drive(auto, 2 + 1 + 3 + 3 + 4 + 3 + 2, time_of, lambda k: 1.0, comm=0.05)
    return auto, ran


@pytest.mark.parametrize("margin, t_dense_later, kept", [
    (None, 0.97, True),     # dense's score 1.031 against the run's 1.0: within 5%
    (0.0, 0.97, False),     # no margin: the best score wins
    (None, 0.9, False)])    # dense's 1.11 is more than 5% better
def test_a_recheck_switches_only_to_a_score_beyond_switch_margin(margin, t_dense_later, kept):
    kw = {} if margin is None else {"switch_margin": margin}
    auto, ran = _recheck_between_fp16_and_dense(t_dense_later, **kw)
    assert ran[:13] == ["fp16"] * 2 + ["dense"] + ["fp16"] * 3 + ["dense"] * 3 + ["fp16"] * 4
    assert ran[13:16] == ["dense"] * 3                    # the re-check's trial
    chosen = [d for d in auto.decisions if d["event"] == "chosen"]
    assert [d["method"] for d in chosen] == ["fp16", "fp16" if kept else "dense"]
    assert ran[16:] == ["fp16" if kept else "dense"] * 2
    assert "reason" not in chosen[0]                      # the first choice has no incumbent
    if kept:
        assert chosen[1]["reason"] == "within switch_margin=0.05 of dense's score 1.031"
        assert chosen[1]["score"] == pytest.approx(1.0)
    else:
        assert "reason" not in chosen[1]


def test_switch_margin_resumes_mid_recheck_and_old_checkpoints_still_load():
    """A checkpoint inside the re-check's trial holds the method it may keep; a
    checkpoint from before the option (no switch_margin in its options) loads with the
    default, and another margin is refused."""
    a, _ = _recheck_between_fp16_and_dense(0.97)
    b = _auto(world=2, methods=["dense", "fp16"], recheck_every=4)
    c = _auto(world=2, methods=["dense", "fp16"], recheck_every=4)
    times = {"dense": 1.0, "fp16": 0.9}
    _drive(b, 14, times.get, lambda k: 1.0, comm=0.05)     # inside dense's re-check trial
    assert b.phase == "trial" and b._s["incumbent"] == "fp16"
    c.load_state_dict(b.state_dict())
    assert _drive(b, 30, times.get, lambda k: 1.0, comm=0.05) == \
        _drive(c, 30, times.get, lambda k: 1.0, comm=0.05) and b.decisions == c.decisions
    state = b.state_dict()
    assert "switch_margin" not in state["hyper"]           # the default: as before the option
    with pytest.raises(ValueError, match="other options"):
        _auto(world=2, methods=["dense", "fp16"], recheck_every=4,
              switch_margin=0.1).load_state_dict(state)
    assert a.describe() == b.describe()


def test_the_ladder_is_climbed_when_the_next_cfs_gain_clears_epsilon_during_the_run():
    """sparse:20 was ruled out early (sparse:10's candidate gain 0.3); later the run's
    candidate gain is 0.8: sparse:20 runs a trial at once and, faster, is chosen."""
    auto = _auto(methods=["dense", "sparse:10", "sparse:20"], alpha=1.0, recheck_every=1000)
    nexts = iter([0.3] * 3 + [0.8] * 100)
    ran = _drive(auto, 14, {"dense": 1.0, "sparse:10": 0.5, "sparse:20": 0.4}.get,
                 lambda k: 0.9, lambda k: next(nexts) if k == "sparse:10" else None)
    assert ran[:5] == ["dense"] * 2 + ["sparse:10"] * 3
    assert [d["method"] for d in auto.decisions if d["event"] == "pruned"] == ["sparse:20"]
    assert ran[5:8] == ["sparse:10"] * 3 and ran[8:11] == ["sparse:20"] * 3
    assert auto.current == "sparse:20" and auto.phase == "run"


def test_a_chosen_method_whose_recent_gain_drifts_below_its_measured_gain_is_rechecked():
    """PowerSGD rank 4 wins its trial with gain 0.9 (score 2.25 against Top-k's 1.6); in the
    run its gain decays to 0.7, still above ε, while Top-k's rose to 0.95. The re-check
    comes once the recent gain is 15% below the chosen one (not after recheck_every), tries
    Top-k again (within 15% of the run's score) and moves to it."""
    auto = _auto(methods=["dense", "powersgd:4", "sparse:10"], alpha=0.02, recheck_every=1000)
    times = {"dense": 1.0, "powersgd:4": 0.4, "sparse:10": 0.5}
    phase_gains = {"powersgd:4": iter([0.9] * 3 + [0.7] * 100),
                   "sparse:10": iter([0.8] * 3 + [0.95] * 100)}
    ran = _drive(auto, 30, times.get, lambda k: next(phase_gains[k]))
    assert ran[:8] == ["dense"] * 2 + ["powersgd:4"] * 3 + ["sparse:10"] * 3
    chosen = [d["method"] for d in auto.decisions if d["event"] == "chosen"]
    assert chosen == ["powersgd:4", "sparse:10"]
    run = [d for d in auto.decisions if d["event"] == "measured" and d.get("reason")]
    assert len(run) == 1 and run[0]["method"] == "powersgd:4"
    assert run[0]["gain"] == pytest.approx(0.7)          # what it sends at now, not the EWMA
    assert "recheck_within" in run[0]["reason"]
    assert run[0]["step"] == 8 + 2 * 2 - 1                 # after 2 x trial_steps of the run
    assert auto.current == "sparse:10" and auto.phase == "run"


def test_a_stale_entry_that_could_win_at_a_higher_gain_is_measured_again():
    """Top-k 10x measured early (gain 0.65, 0.25 s: score 2.6) loses to PowerSGD (0.9 /
    0.2 s) and fp16 (1 / 0.3 s). When PowerSGD's gain drifts to 0.6, the re-check tries
    fp16 (within 15% of the best) and, once, Top-k 10x (at gain 1 its 0.25 s would beat
    fp16): its gain has risen to 0.95 meanwhile, and it is chosen."""
    auto = _auto(methods=["dense", "fp16", "powersgd:4", "sparse:10"], recheck_every=1000)
    times = {"dense": 1.0, "fp16": 0.3, "powersgd:4": 0.2, "sparse:10": 0.25}
    gains = {"powersgd:4": iter([0.9] * 3 + [0.6] * 100),
             "sparse:10": iter([0.65] * 3 + [0.95] * 100)}
    ran = _drive(auto, 30, times.get, lambda k: next(gains[k]))
    assert ran[:9] == ["fp16"] * 2 + ["dense"] + ["powersgd:4"] * 3 + ["sparse:10"] * 3
    assert ran[9:12] == ["fp16"] * 3              # fp16's probe may win: its full trial
    assert ran[16:22] == ["fp16"] * 3 + ["sparse:10"] * 3     # the re-check's two trials
    chosen = [d["method"] for d in auto.decisions if d["event"] == "chosen"]
    assert chosen == ["powersgd:4", "sparse:10"]
    assert auto.table["sparse:10"]["gain"] == pytest.approx(0.95)


@pytest.mark.parametrize("rank1_gain, retried", [(0.3, False), (0.45, True)])
def test_a_stale_entry_far_below_epsilon_is_not_measured_again(rank1_gain, retried):
    """PowerSGD rank 1 is fast (0.1 s: at a gain of 1 it would beat every score) but was
    measured below ε. At the re-check that PowerSGD rank 4's drift starts, rank 1 runs a
    trial again only if its gain was within recheck_within (15%) of ε = 0.5: a trial
    sends its method, so re-trying one far below ε sends steps at that gain. Far below,
    its first trial ends after its first measured step."""
    auto = _auto(methods=["dense", "fp16", "powersgd:1", "powersgd:4"], recheck_every=1000)
    times = {"dense": 1.0, "fp16": 0.3, "powersgd:1": 0.1, "powersgd:4": 0.2}
    gains = {"powersgd:4": iter([0.9] * 3 + [0.6] * 100),
             "powersgd:1": iter([rank1_gain] * 100)}
    ran = _drive(auto, 30, times.get, lambda k: next(gains[k]))
    first = [d for d in auto.decisions if d["event"] == "chosen"][0]
    assert first["method"] == "powersgd:4"
    rechecks = [d for d in auto.decisions if d["event"] == "measured" and d.get("reason")]
    assert rechecks and rechecks[0]["method"] == "powersgd:4"
    trials_after = ran[rechecks[0]["step"] + 1:]
    assert ("powersgd:1" in trials_after) == retried
    assert ran.count("powersgd:1") == (3 * 2 if retried else 2)


def test_a_trial_whose_gain_so_far_is_far_below_epsilon_ends_at_that_step():
    """ε = 0.5, recheck_within 0.15: a trial ends at the step where the mean of its
    measured steps' gains so far falls below 0.425; that step still goes out compressed.
    PowerSGD rank 4 (0.4) ends its trial at its first measured step (rank 1, which keeps
    less, is ruled out). Top-k 10x's settling step keeps 0.3 (the residual of the method
    before it), which does not count; its measured gains 0.5, 0.3 end its trial at the
    second (mean 0.4; sparse:20 ruled out). Their entries hold that mean and the median
    time of their measured steps; dense, the only eligible method, runs its full trial
    after its calibration probe, and is chosen."""
    auto = _auto(methods=["dense", "powersgd:4", "powersgd:1", "sparse:10", "sparse:20"],
                 trial_steps=3)
    times = {"dense": 1.0, "powersgd:4": 0.2, "powersgd:1": 0.1, "sparse:10": 0.3,
             "sparse:20": 0.25}
    gains = {"powersgd:4": iter([0.4] * 10), "sparse:10": iter([0.3, 0.5, 0.3, 0.9])}
    ran, sent = [], []
    for step in range(13):
        plan = auto.plan(step)
        key = plan.method.key
        ran.append(key)
        decision = auto.decide(next(gains[key]), 0.2) if plan.needs_gains else SENT_MIN
        sent.append(decision)
        auto.end_step(StepRecord(step=step, sent=decision, cf=1.0, gain=1.0, t_iter=times[key],
                                 samples=32, extra={"t_comm": 0.5 * times[key]}), LocalSync())
    assert ran == ["dense"] * 2 + ["powersgd:4"] * 2 + ["sparse:10"] * 3 + ["dense"] * 6
    assert sent[2:7] == [SENT_MIN] * 5
    abandoned = [(d["step"], d["method"], d["steps"]) for d in auto.decisions
                 if d["event"] == "abandoned"]
    assert abandoned == [(3, "powersgd:4", 2), (6, "sparse:10", 3)]
    chosen = [(d["step"], d["method"]) for d in auto.decisions if d["event"] == "chosen"]
    assert chosen == [(10, "dense")]
    pruned = {d["method"] for d in auto.decisions if d["event"] == "pruned"}
    assert pruned == {"powersgd:1", "sparse:20"}
    table = auto.table
    assert table["powersgd:4"]["gain"] == pytest.approx(0.4)
    assert table["powersgd:4"]["t"] == pytest.approx(0.2)
    assert table["sparse:10"]["gain"] == pytest.approx(0.4)
    assert table["sparse:10"]["gain_next"] == pytest.approx(0.2)
    assert table["sparse:10"]["t"] == pytest.approx(0.3) and table["sparse:10"]["steps"] == 2
    assert auto.current == "dense" and auto.phase == "run"


def test_a_settling_steps_low_gain_does_not_end_a_trial():
    """Top-k 10x's first step after another method keeps 0.2 (far below ε = 0.5), then
    0.9: it settles, is measured at 0.9 and chosen."""
    auto = _auto(methods=["dense", "sparse:10"])
    gains = iter([0.2, 0.9, 0.9, 0.9])
    ran = _drive(auto, 2 + 3 + 1, {"dense": 2.0, "sparse:10": 0.5}.get, lambda k: next(gains))
    assert ran == ["dense"] * 2 + ["sparse:10"] * 4
    assert not [d for d in auto.decisions if d["event"] == "abandoned"]
    assert auto.table["sparse:10"]["gain"] == pytest.approx(0.9)


def test_a_climb_whose_cf_measured_below_its_candidate_gain_needs_that_much_more():
    """Top-k 10x runs; its candidate gain (20x's, from the second pass) rises from 0.3 to
    0.6 and 20x runs a trial, which measures 0.45 (below ε = 0.5): the candidate gain
    overestimated it by 0.15. At 0.6 the climb does not come again; at 0.7 (0.55 less the
    gap) it does. PowerSGD rank 4, ruled out at the first exploration, is not re-tried by
    these re-checks: a family's safe end waits recheck_every steps."""
    auto = _auto(methods=["dense", "powersgd:4", "sparse:10", "sparse:20"], alpha=1.0,
                 recheck_every=1000)
    times = {"dense": 1.0, "powersgd:4": 0.2, "sparse:10": 0.5, "sparse:20": 0.4}
    own = {"powersgd:4": 0.3, "sparse:10": 0.9, "sparse:20": 0.45}
    ran, gaps = [], []
    for candidate, steps in ((0.3, 7), (0.6, 15), (0.7, 6)):
        ran += _drive(auto, steps, times.get, own.get,
                      lambda k, c=candidate: c if k == "sparse:10" else None)
        gaps.append(dict(auto._s.get("climb_gap", {})))
    assert ran[:7] == ["dense"] * 2 + ["powersgd:4"] * 2 + ["sparse:10"] * 3
    assert ran[7:22] == ["sparse:10"] * 3 + ["sparse:20"] * 3 + ["sparse:10"] * 9
    assert gaps[1] == {"sparse:20": pytest.approx(0.15)}
    # The candidate gain's first step at 0.7 starts the climb; the trial measures the gap
    # again (0.7 - 0.45).
    assert ran[22:] == ["sparse:10"] + ["sparse:20"] * 3 + ["sparse:10"] * 2
    assert gaps[2] == {"sparse:20": pytest.approx(0.25)}
    assert ran.count("powersgd:4") == 2


def _drive_rows(auto: Auto, steps: int, time_of, rows_of, comm: float = 0.05):
    """Scripted steps as the engine runs them with per-layer gains: ``rows_of(cf)`` gives
    each layer's agreed (kept energy at that CF, g_ef's energy); the gains are over the
    layers the plan compresses, the candidate's at ``plan.theta_c``; ``comm`` of each
    step's time is waits."""
    ran = []
    for step in range(steps):
        plan = auto.plan(step)
        key = auto.current
        ran.append(key)
        sent = SENT_MIN
        if plan.needs_gains:
            compressed = [n for n in SHAPES if plan.cf_of(n) > 1]
            at_min, at_c = rows_of(plan.theta_min), rows_of(plan.theta_c or plan.theta_min)
            if plan.layer_gains:
                auto.observe_layer_gains({n: (at_min[n][0], at_c[n][0], at_min[n][1])
                                          for n in compressed})
            total = sum(at_min[n][1] for n in compressed)
            sent = auto.decide(sum(at_min[n][0] for n in compressed) / total,
                               sum(at_c[n][0] for n in compressed) / total
                               if plan.theta_c else None)
        auto.end_step(StepRecord(step=step, sent=sent, cf=1.0, gain=1.0, t_iter=time_of(key),
                                 samples=32, extra={"t_comm": comm * time_of(key)}), LocalSync())
    return ran


def test_a_cf_whose_gain_is_below_epsilon_runs_split_with_its_low_gain_layers_dense():
    """ε = 0.5, equal energies. Top-k 10x: embed keeps 0.9, fc 0.3 (0.6: eligible, 0.5 s).
    Its second pass at 40x: embed 0.8, fc 0.1 (0.45: 40x is ruled out). Split at 40x:
    embed alone clears ε (its slack 0.3 cannot carry fc's 0.4), so ``sparse:40/split``
    sends fc dense. Its predicted bound (sparse:10's local time, plus fc's dense bytes and
    embed's sparse ones at sparse:10's rate: 0.54 s) may win; its trial measures 0.8 at
    0.6 s and it is chosen (1.33 > 1.2)."""
    auto = _auto(world=2, methods=["dense", "sparse:10", "sparse:40"], split_layers=True)
    kept = {10: {"embed": 0.9, "fc": 0.3}, 40: {"embed": 0.8, "fc": 0.1}}

    def rows_of(cf):
        return {n: (kept[int(cf)][n], 1.0) for n in SHAPES}
    times = {"dense": 2.0, "sparse:10": 0.5, "sparse:40": 0.3, "sparse:40/split": 0.6}
    ran = _drive_rows(auto, 2 + 3 + 3 + 1, times.get, rows_of)
    assert ran[:8] == ["dense"] * 2 + ["sparse:10"] * 3 + ["sparse:40/split"] * 3
    assert "sparse:40" not in ran
    split = [d for d in auto.decisions if d["event"] == "split"]
    assert [(d["step"], d["method"], d["dense_layers"]) for d in split] == \
        [(4, "sparse:40/split", ["fc"])]
    assert split[0]["gain"] == pytest.approx(0.8)
    pruned = [d["method"] for d in auto.decisions if d["event"] == "pruned"]
    assert pruned == ["sparse:40"]                          # by the candidate gain 0.45
    plan = auto.plan(9)
    assert plan.layer_cf == {"fc": 1.0} and plan.theta_min == 40 and plan.theta_c is None
    assert plan.method_name == "sparse:40/split" and plan.method.key == "sparse:40"
    assert auto.current == "sparse:40/split" and auto.phase == "run"
    assert auto.table["sparse:40/split"]["gain"] == pytest.approx(0.8)


def test_split_bytes_send_the_dense_layers_by_allreduce():
    auto = _auto(world=2, methods=["dense", "sparse:40"], split_layers=True)
    auto._s["splits"]["sparse:40/split"] = ["fc"]
    ring = 2 * 1 / 2
    fc, embed = 256 * 512, 1000 * 64
    chunk = sizes.sparse_chunk_bytes([embed], [sizes.num_kept(embed, 40)])
    assert auto.wire_bytes("sparse:40/split") == pytest.approx(
        chunk + ring * 4 * (OTHER + fc))
    assert auto.wire_bytes("sparse:40/split") > auto.wire_bytes("sparse:40")


def test_no_split_without_the_option_or_where_every_layer_is_below_epsilon():
    kept = {10: {"embed": 0.9, "fc": 0.3}, 40: {"embed": 0.4, "fc": 0.1}}

    def rows_of(cf):
        return {n: (kept[int(cf)][n], 1.0) for n in SHAPES}
    times = {"dense": 2.0, "sparse:10": 0.5, "sparse:40": 0.3}
    for split_layers in (False, True):
        auto = _auto(world=2, methods=["dense", "sparse:10", "sparse:40"],
                     split_layers=split_layers)
        assert auto.plan(0).layer_gains is False                # dense: no gains at all
        ran = _drive_rows(auto, 2 + 3 + 1, times.get, rows_of)
        assert ran == ["dense"] * 2 + ["sparse:10"] * 4
        assert not [d for d in auto.decisions if d["event"] == "split"]
        assert auto.plan(6).layer_gains is split_layers
    with pytest.raises(ValueError, match="split_layers"):
        Auto(split_layers="yes")


def test_split_state_resumes_exactly_and_old_checkpoints_still_load():
    kept = {10: {"embed": 0.9, "fc": 0.3}, 40: {"embed": 0.8, "fc": 0.1}}

    def rows_of(cf):
        return {n: (kept[int(cf)][n], 1.0) for n in SHAPES}
    times = {"dense": 2.0, "sparse:10": 0.5, "sparse:40/split": 0.3}.get
    a = _auto(world=2, methods=["dense", "sparse:10", "sparse:40"], split_layers=True)
    _drive_rows(a, 4, times, rows_of)                 # inside sparse:10's trial
    b = _auto(world=2, methods=["dense", "sparse:10", "sparse:40"], split_layers=True)
    b.load_state_dict(a.state_dict())
    assert _drive_rows(a, 10, times, rows_of) == _drive_rows(b, 10, times, rows_of)
    assert a.decisions == b.decisions
    assert "split_layers" not in _auto().describe()       # off: the hyper of older states


def test_a_measured_method_is_pruned_by_its_own_step_time_where_the_prediction_is_low():
    """Waits of 5% of a step (with overlap the waits hide the link) predict fp16 at 0.25 s,
    but it measured 1.8 s. When PowerSGD's gain drifts below ε, the re-check queues fp16
    (the best eligible score then) and, stale, Top-k 10x, which runs first and now scores
    0.9 / 0.5 s: fp16, which could not reach that even at 1.5x its measured speed, is
    pruned instead of running a full trial. Dense, bounded by fp16's step / 3 = 0.6 s
    (1.1 / 0.6 = 1.83 against PowerSGD's 0.9 / 0.2 = 4.5), is pruned after PowerSGD's
    trial: it never runs."""
    auto = _auto(world=2, methods=["dense", "fp16", "powersgd:4", "sparse:10"],
                 recheck_every=1000)
    times = {"dense": 3.0, "fp16": 1.8, "powersgd:4": 0.2, "sparse:10": 0.5}
    # (Rank 4's first 0.9: the run's first step, fp16's settling step, runs rank 4.)
    gains = {"powersgd:4": iter([0.9] * 6 + [0.4] * 100),
             "sparse:10": iter([0.45] * 5 + [0.9] * 100)}
    ran = _drive(auto, 24, times.get, lambda k: next(gains[k]), comm=0.05)
    assert auto._predicted("fp16") < 0.3
    assert ran.count("fp16") == 1                              # its calibration probe only
    pruned = [(d["step"], d["method"]) for d in auto.decisions if d["event"] == "pruned"]
    assert pruned == [(4, "dense"), (16, "fp16")] and "dense" not in ran
    assert auto.current == "sparse:10" and auto.phase == "run"


@pytest.mark.parametrize("epsilon_low_rank", [None, 0.3])
def test_epsilon_low_rank_is_powersgds_threshold_and_leaves_the_sparsifier_at_epsilon(
        epsilon_low_rank):
    """Gains: powersgd:4 0.4, sparse:10 0.45, both below ε = 0.5. With epsilon_low_rank
    0.3 PowerSGD rank 4 is eligible and chosen (score 0.4 / 0.1 = 4 against dense's 0.5),
    its run sends compressed while its smoothed gain stays at least 0.3 and dense below;
    Top-k stays at ε. Without it (GraVAC's one ε), dense is chosen."""
    auto = _auto(methods=["dense", "powersgd:4", "sparse:10"], alpha=1.0,
                 recheck_every=1000, epsilon_low_rank=epsilon_low_rank)
    gains = {"powersgd:4": 0.4, "sparse:10": 0.45}
    ran = _drive(auto, 10, {"dense": 2.0, "powersgd:4": 0.1, "sparse:10": 0.5}.get,
                 gains.get)
    assert "powersgd:4" in ran and "sparse:10" in ran
    chosen = [d for d in auto.decisions if d["event"] == "chosen"][0]
    assert chosen["scores"]["sparse:10"] == 0.0
    if epsilon_low_rank is None:
        assert chosen["method"] == "dense" and chosen["scores"]["powersgd:4"] == 0.0
        assert "epsilon_low_rank" not in auto.describe()      # the hyper of older states
        return
    assert chosen["method"] == "powersgd:4" == auto.current
    assert chosen["score"] == pytest.approx(0.4 / 0.1)
    assert auto.describe()["epsilon_low_rank"] == 0.3
    auto.plan(10)
    assert auto.decide(0.35, None) == SENT_MIN
    assert auto.decide(0.25, None) == SENT_DENSE


def test_epsilon_low_rank_prunes_the_lower_ranks_below_it():
    """powersgd:4 measured at 0.2, below epsilon_low_rank 0.3: rank 1 keeps less and is
    not run; the reason names the threshold that ruled it out."""
    auto = _auto(methods=["dense", "powersgd:4", "powersgd:1"], epsilon_low_rank=0.3)
    ran = _drive(auto, 8, {"dense": 2.0, "powersgd:4": 0.1, "powersgd:1": 0.05}.get,
                 {"powersgd:4": 0.2, "powersgd:1": 0.1}.get)
    assert "powersgd:1" not in ran
    pruned = [d for d in auto.decisions if d["event"] == "pruned"]
    assert [d["method"] for d in pruned] == ["powersgd:1"]
    assert "epsilon=0.3" in pruned[0]["reason"]


@pytest.mark.parametrize("low_rank_lag", [None, 0.1])
def test_low_rank_lag_decides_powersgds_eligibility_and_its_score(low_rank_lag):
    """Gains: powersgd:4 0.3, powersgd:1 0.25, sparse:10 0.45, all below ε = 0.5, over
    trials of 4 measured steps (enough for either rank's residual to fill). Lags:
    rank 4 0.03, rank 1 0.3. With low_rank_lag 0.1 rank 4 is eligible (its lag is at
    most 0.1) and chosen at its lag's score, (1 - 0.03) / 0.1 = 9.7, against dense's 0.5;
    rank 1's trial ends after its first measured step (its one pooled lag, 0.3, above
    1 - 0.85 x 0.9 = 0.235) and scores 0; Top-k stays at ε. Without the option only the
    PowerSGD plans' gains count, and dense is chosen.

    In the run the per-step fallback reads rank 4's pooled lag less its standard error:
    one step at 0.2 leaves it compressed; steps at 0.3 send dense from the first at which
    the pooled lag's lower bound, computed here independently, is above 0.1."""
    auto = _auto(methods=["dense", "powersgd:4", "powersgd:1", "sparse:10"], alpha=1.0,
                 recheck_every=1000, low_rank_lag=low_rank_lag, trial_steps=4)
    gains = {"powersgd:4": 0.3, "powersgd:1": 0.25, "sparse:10": 0.45}
    lags = {"powersgd:4": 0.03, "powersgd:1": 0.3}
    ran = _drive(auto, 16, {"dense": 2.0, "powersgd:4": 0.1, "powersgd:1": 0.05,
                            "sparse:10": 0.5}.get, gains.get, lag_of=lags.get)
    chosen = [d for d in auto.decisions if d["event"] == "chosen"][0]
    assert chosen["scores"]["sparse:10"] == 0.0
    if low_rank_lag is None:
        assert not auto.plan(16).measure_lag
        assert "powersgd:1" not in ran          # pruned by rank 4's gain below ε
        assert chosen["method"] == "dense" and chosen["scores"]["powersgd:4"] == 0.0
        assert "low_rank_lag" not in auto.describe()      # the hyper of older states
        return
    assert ran.count("powersgd:1") == 2         # settling, then one measured step
    abandoned = [d for d in auto.decisions if d["event"] == "abandoned"]
    assert [d["method"] for d in abandoned] == ["powersgd:1"]
    assert "pooled lag less its standard error above" in abandoned[0]["reason"]
    measured = {d["method"]: d for d in auto.decisions if d["event"] == "measured"}
    assert measured["powersgd:4"]["lag"] == pytest.approx(0.03)
    assert measured["powersgd:1"]["lag"] == pytest.approx(0.3)
    assert "lag" not in measured["sparse:10"]
    assert chosen["method"] == "powersgd:4" == auto.current
    assert chosen["score"] == pytest.approx((1 - 0.03) / 0.1)
    assert chosen["scores"]["powersgd:1"] == 0.0
    assert auto.describe()["low_rank_lag"] == 0.1
    plan = auto.plan(16)
    assert plan.measure_lag
    pool = [0.03] * 5       # rank 4's trial's 4 steps, its run's second (the first settles)
    lags = [0.05, 0.2] + [0.3] * 20
    for step, lag in enumerate(lags, start=16):
        auto.plan(step)
        auto.observe_lag(lag)
        pool.append(lag)
        sent = auto.decide(0.9, None)               # the lag decides, not the gain
        lower = _lower(pool)
        assert sent == (SENT_DENSE if lower > 0.1 else SENT_MIN), (step, pool)
        if sent == SENT_DENSE:
            break
        auto.end_step(StepRecord(step=step, sent=sent, cf=1.0, gain=0.3, t_iter=0.1),
                      LocalSync())
    assert sent == SENT_DENSE and pool[-3:] == [0.3] * 3      # the third step at 0.3


@pytest.mark.parametrize("low_rank_lag", [None, 0.1])
def test_low_rank_lag_values_a_powersgd_step_by_its_lag_not_its_decaying_gain(low_rank_lag):
    """The wide CNN at 1 Gbit/s: rank 4 (0.05 s a step) keeps 0.49 of g_ef's energy in its
    trial and 0.41 in its run, as error feedback fills the residual; its lag is -0.02
    throughout; fp16 takes 0.11 s. Under the gain (ε = 0.4) rank 4 is chosen at
    0.49 / 0.05 = 9.8 against fp16's 1 / 0.11 = 9.09; its gain drifts more than 15% below
    0.49, the re-check measures it at 0.41 / 0.05 = 8.2 and fp16 runs. Under the lag its
    step is worth a dense one (1 - (-0.02), capped at 1): 1 / 0.05 = 20, and its decaying
    gain re-checks nothing."""
    auto = _auto(methods=["dense", "fp16", "powersgd:4"], epsilon=0.4, recheck_every=1000,
                 low_rank_lag=low_rank_lag, trial_steps=4)
    rank4 = iter([0.49] * 5 + [0.41] * 100)
    gains = {"powersgd:4": lambda: next(rank4)}
    _drive(auto, 60, {"dense": 1.0, "fp16": 0.11, "powersgd:4": 0.05}.get,
           lambda k: gains[k](), lag_of=lambda k: -0.02)
    chosen = [d for d in auto.decisions if d["event"] == "chosen"]
    rechecks = [d for d in auto.decisions if d["event"] == "measured" and d.get("reason")]
    if low_rank_lag is None:
        assert [d["method"] for d in chosen] == ["powersgd:4", "fp16"]
        assert chosen[0]["score"] == pytest.approx(0.49 / 0.05)
        assert "recheck_within" in rechecks[0]["reason"]
        assert rechecks[0]["gain"] == pytest.approx(0.41)
        assert chosen[1]["scores"]["powersgd:4"] == pytest.approx(0.41 / 0.05)
        assert auto.current == "fp16"
        return
    assert [d["method"] for d in chosen] == ["powersgd:4"] and not rechecks
    assert chosen[0]["score"] == pytest.approx(1 / 0.05)
    assert chosen[0]["scores"]["fp16"] == pytest.approx(1 / 0.11)
    assert auto.current == "powersgd:4" and auto.phase == "run"


def test_low_rank_lag_admits_a_method_shown_below_it_and_drops_the_running_one_shown_above():
    """Rank 1 (0.03 s) measures lags 0.02 and 0.14 in its trial (after its settling step):
    mean 0.08, standard error 0.06, so 0.14 plus the error is above low_rank_lag 0.1 and
    it is not admitted, though 0.02 less it is below; rank 4 (0.05 s, 0.01) is chosen.
    In its run its lags alternate 0 and 0.22: at the re-check its pooled lag less its
    error is at most 0.1 and plus it above, computed here independently; it holds the
    run, so it stays eligible, and rank 1, tried again (its step would beat the best
    score) at 0.3, is not admitted: rank 4 is chosen again at (1 - its lower lag) / 0.05."""
    auto = _auto(methods=["dense", "fp16", "powersgd:4", "powersgd:1"], low_rank_lag=0.1,
                 recheck_every=10)
    rank1 = iter([0.5, 0.02, 0.14, 0.5, 0.3, 0.3])
    rank4 = iter([0.9, 0.01, 0.01, 0.9] + [0.0, 0.22] * 20)
    lags = {"powersgd:1": rank1, "powersgd:4": rank4}
    ran = _drive(auto, 29, {"dense": 1.0, "fp16": 0.11, "powersgd:4": 0.05,
                            "powersgd:1": 0.03}.get,
                 {"powersgd:4": 0.6, "powersgd:1": 0.55}.get, lag_of=lambda k: next(lags[k]))
    assert ran[:9] == ["fp16"] * 2 + ["dense"] + ["powersgd:4"] * 3 + ["powersgd:1"] * 3
    chosen = [d for d in auto.decisions if d["event"] == "chosen"]
    assert chosen[0]["method"] == "powersgd:4"
    assert chosen[0]["score"] == pytest.approx((1 - 0.01) / 0.05)
    assert chosen[0]["scores"]["powersgd:1"] == 0.0
    pool4 = [0.01, 0.01] + [0.0, 0.22] * 5
    pool4 = pool4[:2 + 9]                   # the run's 10 steps, the first settling
    se = statistics.stdev(pool4) / len(pool4) ** 0.5
    lower, upper = statistics.fmean(pool4) - se, statistics.fmean(pool4) + se
    assert lower <= 0.1 < upper
    recheck = [d for d in auto.decisions if d["event"] == "measured" and d.get("reason")]
    assert recheck[0]["method"] == "powersgd:4" and recheck[0]["reason"].startswith(
        "recheck_every")
    assert ran[19:22] == ["powersgd:1"] * 3 and not [
        d for d in auto.decisions if d["event"] == "abandoned"]
    assert [d["method"] for d in chosen] == ["powersgd:4", "powersgd:4"]
    assert chosen[1]["score"] == pytest.approx((1 - lower) / 0.05)
    assert chosen[1]["scores"]["powersgd:1"] == 0.0


@pytest.mark.parametrize("low_rank_lag", [None, 0.1])
def test_low_rank_lag_needs_a_trial_that_fills_its_residual(low_rank_lag):
    """ResNet-18's warm-up: rank 4 keeps 0.16 of g_ef's energy a step, rank 1 0.09, and
    over a trial of 4 steps their residuals have not filled: their lags are small
    (-0.015, 0.04) whatever the method. Rank 4's first measured step projects 0.16 x 4 =
    0.64 of a step's energy over its trial, below 1 - recheck_within = 0.85: the trial
    ends there, its entry is not eligible and rules rank 1 out, as under the gain; fp16
    is chosen. A rank whose trial fills (gain 0.3: 1.2) is judged by its lag."""
    auto = _auto(methods=["dense", "fp16", "powersgd:4", "powersgd:1"], trial_steps=4,
                 epsilon=0.7, low_rank_lag=low_rank_lag)
    # (11 steps: at step 10 rank 4's re-trial would be due, the next test's subject.)
    ran = _drive(auto, 11, {"dense": 0.85, "fp16": 0.49, "powersgd:4": 0.38,
                            "powersgd:1": 0.35}.get,
                 {"powersgd:4": 0.16, "powersgd:1": 0.09}.get,
                 lag_of={"powersgd:4": -0.015, "powersgd:1": 0.04}.get)
    assert ran.count("powersgd:4") == 2 and "powersgd:1" not in ran
    abandoned = [d for d in auto.decisions if d["event"] == "abandoned"]
    assert [d["method"] for d in abandoned] == ["powersgd:4"]
    pruned = [d for d in auto.decisions if d["event"] == "pruned"]
    assert [d["method"] for d in pruned] == ["powersgd:1"]
    chosen = [d for d in auto.decisions if d["event"] == "chosen"]
    assert chosen[0]["method"] == "fp16" and chosen[0]["scores"]["powersgd:4"] == 0.0
    if low_rank_lag is not None:
        assert "cannot fill" in abandoned[0]["reason"]
        # recheck_within 1: no trial is cut short for its gain, and nothing divides by 0.
        lenient = _auto(methods=["dense", "fp16", "powersgd:4"], trial_steps=4,
                        low_rank_lag=low_rank_lag, recheck_within=1.0)
        ran = _drive(lenient, 8, {"dense": 0.85, "fp16": 0.49, "powersgd:4": 0.38}.get,
                     {"powersgd:4": 0.16}.get, lag_of={"powersgd:4": -0.015}.get)
        assert ran.count("powersgd:4") == 5
        assert "residual not filled" in pruned[0]["reason"]
        auto = _auto(methods=["dense", "fp16", "powersgd:4"], trial_steps=4,
                     low_rank_lag=low_rank_lag)
        _drive(auto, 14, {"dense": 0.85, "fp16": 0.49, "powersgd:4": 0.38}.get,
               {"powersgd:4": 0.3}.get, lag_of={"powersgd:4": -0.015}.get)
        chosen = [d for d in auto.decisions if d["event"] == "chosen"]
        assert chosen[0]["method"] == "powersgd:4"
        assert chosen[0]["score"] == pytest.approx(1 / 0.38)


def test_low_rank_lag_prunes_the_lower_ranks_and_rechecks_when_the_run_lags():
    """Rank 4's trial lag 0.2 is above low_rank_lag 0.1: rank 1 is not run (a lower
    rank leaves more behind). Then with rank 4 eligible (lag 0.05) and chosen, its lag
    rising to 0.3 in the run starts a re-check at the first step at which its pooled lag
    less its standard error is above 0.1 (computed here independently), its reason naming
    the lag; its entry holds the pooled lag and its standard error."""
    auto = _auto(methods=["dense", "powersgd:4", "powersgd:1"], low_rank_lag=0.1)
    ran = _drive(auto, 8, {"dense": 2.0, "powersgd:4": 0.1, "powersgd:1": 0.05}.get,
                 {"powersgd:4": 0.6, "powersgd:1": 0.55}.get,
                 lag_of={"powersgd:4": 0.2, "powersgd:1": 0.5}.get)
    assert "powersgd:1" not in ran
    pruned = [d for d in auto.decisions if d["event"] == "pruned"]
    assert [d["method"] for d in pruned] == ["powersgd:1"]
    assert "lag above low_rank_lag=0.1" in pruned[0]["reason"]

    auto = _auto(methods=["dense", "powersgd:4"], low_rank_lag=0.1, alpha=1.0,
                 recheck_every=1000)
    lag = {"value": 0.05}
    _drive(auto, 10, {"dense": 2.0, "powersgd:4": 0.1}.get, {"powersgd:4": 0.6}.get,
           lag_of=lambda k: lag["value"])
    assert auto.current == "powersgd:4" and auto.phase == "run"
    pool = list(auto.state_dict()["state"]["lag_pool"]["powersgd:4"])
    assert pool == [0.05] * len(pool) and len(pool) >= 2 + 4   # its trial's and run's
    lag["value"] = 0.3
    for step in range(30):
        pool.append(0.3)
        _drive(auto, 1, {"dense": 2.0, "powersgd:4": 0.1}.get, {"powersgd:4": 0.6}.get,
               lag_of=lambda k: lag["value"])
        recheck = [d for d in auto.decisions if d["event"] == "measured" and d.get("reason")]
        lower = _lower(pool)
        assert bool(recheck) == (lower > 0.1), pool
        if recheck:
            break
    assert recheck[0]["reason"] == ("pooled lag less its standard error above "
                                    "low_rank_lag=0.1")
    assert recheck[0]["lag"] == pytest.approx(statistics.fmean(pool))
    assert recheck[0]["lag_se"] == pytest.approx(statistics.stdev(pool) / len(pool) ** 0.5)


def test_low_rank_lag_pools_a_methods_steps_so_a_noisy_burst_does_not_rule_it_out():
    """Rank 4 (gain 0.3, below ε; lag 0.02) is tried, then rank 1 (its settling step's
    lag 2.0 does not count; its measured 0.6 ends its trial), and rank 4 is chosen. In
    its run, after 31 steps at 0.02 (the first settles: rank 1's trial came before), 6
    steps at 0.25 each: their mean is far above low_rank_lag 0.1, but pooled with its 34
    measured steps before (its trial's 4, its run's 30), (34 x 0.02 + 6 x 0.25) / 40 =
    0.0545. It keeps running compressed, without a re-check. Its next trial after rank 1,
    whose first measured step is 0.4 (the residual rank 1 left), pools with its earlier
    steps and is not abandoned."""
    auto = _auto(methods=["dense", "powersgd:4", "powersgd:1"], low_rank_lag=0.1,
                 alpha=1.0, recheck_every=1000, trial_steps=4)
    lag = {"powersgd:4": iter([0.02] * 36 + [0.25] * 6), "powersgd:1": iter([2.0, 0.6])}
    ran = _drive(auto, 46, {"dense": 2.0, "powersgd:4": 0.1, "powersgd:1": 0.05}.get,
                 {"powersgd:4": 0.3, "powersgd:1": 0.3}.get, lag_of=lambda k: next(lag[k]))
    assert ran == ["dense"] * 2 + ["powersgd:4"] * 5 + ["powersgd:1"] * 2 + ["powersgd:4"] * 37
    assert auto.phase == "run"
    assert not [d for d in auto.decisions if d["event"] == "measured" and d.get("reason")]
    pools = auto.state_dict()["state"]["lag_pool"]
    assert pools["powersgd:4"] == pytest.approx([0.02] * 34 + [0.25] * 6)
    assert pools["powersgd:1"] == [0.6]
    assert [d["method"] for d in auto.decisions if d["event"] == "abandoned"] \
        == ["powersgd:1"]
    # Rank 4's re-trial after rank 1: a first measured step of 0.4 pools with 40 others.
    auto._switch("powersgd:1", "run")
    auto._switch("powersgd:4", "trial")
    lag["powersgd:4"] = iter([0.9, 0.4, 0.03, 0.03, 0.03])
    _drive(auto, 5, {"powersgd:4": 0.1}.get, {"powersgd:4": 0.3}.get,
           lag_of=lambda k: next(lag[k]))
    assert not [d for d in auto.decisions if d["event"] == "abandoned"
                and d["method"] == "powersgd:4"]
    assert auto.state_dict()["state"]["lag_pool"]["powersgd:4"][-4:] \
        == pytest.approx([0.4, 0.03, 0.03, 0.03])


def test_low_rank_lag_drops_a_method_whose_latest_steps_show_its_lag_risen():
    """Rank 1 on the LSTM: its lag rises as its residual fills. Rank 4 is chosen; its run's
    lags alternate 0 and 0.04 for 40 steps, then 0.1 and 0.3. The re-check comes at the
    first step where its last 16 pooled steps' mean less their standard error is above
    low_rank_lag 0.1 (computed here independently), while the whole pool's, with the early
    steps in it, is still below; the reason names the last 16 steps. Dense is chosen at
    the re-check: rank 4 holds the run but its recent lag is shown above. Another method's
    latest steps shown above keep it out however low its pool is."""
    auto = _auto(methods=["dense", "powersgd:4"], low_rank_lag=0.1, alpha=1.0,
                 recheck_every=1000)
    lags = iter([0.02] * 6 + [0.0, 0.04] * 20 + [0.1, 0.3] * 30)
    times, gains = {"dense": 2.0, "powersgd:4": 0.1}.get, {"powersgd:4": 0.6}.get
    _drive(auto, 8, times, gains, lag_of=lambda k: next(lags))
    assert auto.current == "powersgd:4" and auto.phase == "run"
    pool = list(auto.state_dict()["state"]["lag_pool"]["powersgd:4"])
    assert pool == [0.02] * len(pool)
    for _ in range(80):
        before, fed = len(auto.decisions), next(lags)
        _drive(auto, 1, times, gains, lag_of=lambda k: fed)
        pool.append(fed)
        recheck = [d for d in auto.decisions[before:] if d["event"] == "measured"]
        window = pool[-64:]
        judged = max(_lower(window), _lower(window[-16:]) if len(window) > 16 else -1)
        assert bool(recheck) == (judged > 0.1), window
        if recheck:
            break
    assert _lower(window) <= 0.1 < _lower(window[-16:])
    assert recheck[0]["reason"] == ("lag of its last 16 steps less their standard error "
                                    "above low_rank_lag=0.1")
    assert recheck[0]["lag_recent"] == pytest.approx(statistics.fmean(window[-16:]))
    assert recheck[0]["lag_recent_se"] == pytest.approx(
        statistics.stdev(window[-16:]) / 4)
    _drive(auto, 3, times, gains, lag_of=lambda k: next(lags))     # dense's trial
    chosen = [d for d in auto.decisions if d["event"] == "chosen"]
    assert chosen[-1]["method"] == "dense" and chosen[-1]["scores"]["powersgd:4"] == 0.0
    # Not holding the run: its pool's mean plus error (0.07) admits, its last 16 do not.
    entry = {"lag": 0.05, "lag_se": 0.02, "lag_recent": 0.18, "lag_recent_se": 0.06}
    assert Auto._bounded_lag(entry, held=False) == pytest.approx(0.12)
    assert Auto._bounded_lag({"lag": 0.05, "lag_se": 0.02}, held=False) == pytest.approx(0.07)


@pytest.mark.parametrize("low_rank_lag", [None, 0.1])
def test_low_rank_lag_tries_an_unfilled_method_again_after_as_many_steps(low_rank_lag):
    """ResNet-18 at 100 Mbit/s: in the learning-rate warm-up rank 4 keeps 0.18 of g_ef's
    energy a step, so its trial cannot fill its residual (0.18 x 4 < 0.85) and fp16 (3.7 s
    a step against rank 4's 0.41 s) is chosen. Under low_rank_lag that is not yet a
    verdict: rank 4 is tried again once the run has run as many steps again as it had
    when its trial ended, the wait doubling while it does not fill; from its fourth trial
    it keeps 0.4 (fills: 1.6), its lag -0.01 admits it and it is chosen. Under the gain
    (no lag) 0.18 rules it out until recheck_every."""
    auto = _auto(methods=["dense", "fp16", "powersgd:4"], trial_steps=4, epsilon=0.7,
                 low_rank_lag=low_rank_lag, recheck_every=1000)

    def gain(key):
        ended = sum(d["event"] == "abandoned" for d in auto.decisions)
        return 0.18 if ended < 3 else 0.4
    ran = _drive(auto, 120, {"dense": 7.3, "fp16": 3.7, "powersgd:4": 0.41}.get, gain,
                 lag_of=lambda k: -0.01)
    trials = [d for d in auto.decisions if d["method"] == "powersgd:4"
              and d["event"] in ("abandoned", "measured")]
    chosen = [(d["step"], d["method"]) for d in auto.decisions if d["event"] == "chosen"]
    if low_rank_lag is None:
        assert ran.count("powersgd:4") == 2 and {m for _, m in chosen} == {"fp16"}
        assert not [d for d in auto.decisions if d.get("reason", "").endswith("many steps")]
        return
    rechecks = [d for d in auto.decisions if d["event"] == "measured" and d.get("reason")]
    ends = [d["step"] for d in trials if d["event"] == "measured"]
    # Each re-check comes at the first run step s with s + 1 >= 2 x (the end + 1), and
    # names the step the unfilled trial ended at.
    assert len(rechecks) == len(ends) - 1 >= 2
    for end, recheck in zip(ends, rechecks):
        assert recheck["step"] >= 2 * (end + 1) - 1
        assert recheck["reason"] == (f"powersgd:4's residual did not fill in its trial to "
                                     f"step {end + 1}: tried again after as many steps")
    trials = [d for d in trials if d["event"] == "measured"]
    assert all(d["gain"] == pytest.approx(0.18) for d in trials[:-1])
    assert trials[-1]["gain"] == pytest.approx(0.4) and len(trials) == 4
    assert chosen[-1] == (trials[-1]["step"], "powersgd:4")
    assert set(ran[trials[-1]["step"] + 1:]) == {"powersgd:4"}
    assert "unfilled" not in auto.state_dict()["state"] or \
        auto.state_dict()["state"]["unfilled"] == {}
    # Where its step could not beat the best score, it is not tried again.
    slow = _auto(methods=["dense", "fp16", "powersgd:4"], trial_steps=4, epsilon=0.7,
                 low_rank_lag=low_rank_lag, recheck_every=1000)
    ran = _drive(slow, 120, {"dense": 7.3, "fp16": 3.7, "powersgd:4": 5.0}.get,
                 lambda k: 0.18, lag_of=lambda k: -0.01)
    assert ran.count("powersgd:4") <= 2 and set(ran[20:]) == {"fp16"}


def test_a_re_check_does_not_find_the_running_method_unfilled():
    """Rank 4's trial keeps 0.3 a step (x 4: filled) at a lag of 0.01 and it is chosen;
    in its run its gain decays to 0.15 as error feedback fills the residual. A re-check
    after 3 steps (recheck_every=3) measures the run: 3 x 0.15 is under a step's energy,
    but a run's entry is ``filled`` (it was chosen filled), so rank 4 stays eligible and
    is chosen again at its lag's score; rank 1, whose trial could not fill (0.19), is
    not tried again beside it (a family's lower rank waits while a higher is eligible)."""
    auto = _auto(methods=["dense", "powersgd:4", "powersgd:1"], trial_steps=4, epsilon=0.7,
                 low_rank_lag=0.1, recheck_every=3, alpha=1.0)

    def gain(key):
        if key == "powersgd:4":
            return 0.15 if auto.phase == "run" else 0.3
        return 0.19
    ran = _drive(auto, 16, {"dense": 0.2, "powersgd:4": 0.05, "powersgd:1": 0.033}.get,
                 gain, lag_of={"powersgd:4": 0.01, "powersgd:1": 0.01}.get)
    recheck = [d for d in auto.decisions if d["event"] == "measured" and d.get("reason")]
    assert recheck and recheck[0]["method"] == "powersgd:4"
    assert recheck[0]["filled"] is True and recheck[0]["gain"] == pytest.approx(0.15)
    assert recheck[0]["steps"] * recheck[0]["gain"] < 1
    chosen = [d for d in auto.decisions if d["event"] == "chosen"]
    assert {d["method"] for d in chosen} == {"powersgd:4"} and len(chosen) >= 2
    assert chosen[1]["score"] == pytest.approx((1 - 0.01) / 0.05)
    assert ran.count("powersgd:1") == 2                      # its one trial only
    assert list(auto.state_dict()["state"]["unfilled"]) == ["powersgd:1"]


@pytest.mark.parametrize("run_next_gain, climbs", [(0.95, True), (0.8, False)])
def test_the_ladder_is_climbed_to_an_eligible_cf_faster_than_the_run_at_its_candidate_gain(
        run_next_gain, climbs):
    """sparse:10 (0.9 / 0.5 s = 1.8) is chosen over sparse:20 (0.8 / 0.5 s = 1.6). In the
    run sparse:20's candidate gain is ``run_next_gain``: at 0.95 sparse:20's entry would
    score 0.95 / 0.5 = 1.9, above the run's 1.8 (its recent gain over its entry's step
    time, both agreed), so sparse:20 is tried at once though it is eligible, and chosen.
    At 0.8 (1.6) the run stays ahead: no re-check."""
    auto = _auto(methods=["dense", "sparse:10", "sparse:20"], alpha=1.0, recheck_every=1000)
    gains = {"sparse:10": 0.9, "sparse:20": iter([0.8] * 3 + [0.95] * 100)}

    def next_of(key):
        if key == "sparse:10":
            return run_next_gain if auto.phase == "run" else 0.8
        return 0.5
    ran = _drive(auto, 20, {"dense": 2.0, "sparse:10": 0.5, "sparse:20": 0.5}.get,
                 lambda k: gains[k] if k == "sparse:10" else next(gains[k]), next_of)
    assert ran[:8] == ["dense"] * 2 + ["sparse:10"] * 3 + ["sparse:20"] * 3
    chosen = [d["method"] for d in auto.decisions if d["event"] == "chosen"]
    if not climbs:
        assert chosen == ["sparse:10"] and ran[8:] == ["sparse:10"] * 12
        return
    assert ran[8:12] == ["sparse:10"] * 4 and ran[12:15] == ["sparse:20"] * 3
    recheck = [d for d in auto.decisions if d["event"] == "measured" and d.get("reason")]
    assert [d["method"] for d in recheck] == ["sparse:10"]
    assert recheck[0]["reason"] == "sparse:20's gain clears epsilon=0.5"
    assert chosen == ["sparse:10", "sparse:20"] and auto.current == "sparse:20"


@pytest.mark.parametrize("run_gain, rival_time, rechecked", [
    (0.7, 2.0, False),       # drifted, still eligible, far ahead of every other method
    (0.45, 2.0, True),       # drifted below ε
    (0.7, 0.5, True)])       # drifted, and Top-k (0.8 / 0.5) is within 15% of the run
def test_a_drift_rechecks_only_where_the_recheck_has_something_to_try(
        run_gain, rival_time, rechecked):
    """PowerSGD rank 4 is chosen at gain 0.9 (score 2.25) and its run's gain decays to
    ``run_gain``, more than 15% below. The re-check comes where that gain is below ε or
    another eligible method's score is within 15% of the run's (0.7 / 0.4 = 1.75):
    Top-k 10x at 0.8 / ``rival_time``."""
    auto = _auto(methods=["dense", "powersgd:4", "sparse:10"], alpha=0.02, recheck_every=1000)
    times = {"dense": 1.0, "powersgd:4": 0.4, "sparse:10": rival_time}
    phase_gains = {"powersgd:4": iter([0.9] * 3 + [run_gain] * 100),
                   "sparse:10": iter([0.8] * 100)}
    ran = _drive(auto, 20, times.get, lambda k: next(phase_gains[k]))
    assert ran[:8] == ["dense"] * 2 + ["powersgd:4"] * 3 + ["sparse:10"] * 3
    assert [d["method"] for d in auto.decisions if d["event"] == "chosen"][0] == "powersgd:4"
    recheck = [d for d in auto.decisions if d["event"] == "measured" and d.get("reason")]
    if not rechecked:
        assert recheck == [] and ran[8:] == ["powersgd:4"] * 12
        return
    assert recheck[0]["step"] == 8 + 2 * 2 - 1 and "recheck_within" in recheck[0]["reason"]


def test_the_trial_that_rules_its_family_out_tries_the_families_safe_end_at_once():
    """Top-k 10x is pruned by its predicted time in the first round (PowerSGD rank 4 scores
    0.9 / 0.2); 20x measures 0.8 and is eligible. PowerSGD's gain drifts to 0.3: the
    re-check tries 20x again, which now measures 0.45, below ε. That trial left no sparse
    CF eligible: 10x, never measured, is tried at once and chosen (not fp16, the best
    eligible score without it). Dense (fp16's 1 s / 3 could not score 4.5) never runs."""
    auto = _auto(world=2, methods=["dense", "fp16", "powersgd:4", "sparse:10", "sparse:20",
                                   "sparse:40"], recheck_every=1000, alpha=0.02)
    times = {"dense": 3.0, "fp16": 1.0, "powersgd:4": 0.2, "sparse:10": 0.3, "sparse:20": 0.2}
    # (Rank 4's first 0.9: the run's first step, fp16's settling step, runs rank 4.)
    gains = {"powersgd:4": iter([0.9] * 4 + [0.3] * 100),
             "sparse:20": iter([0.8] * 3 + [0.45] * 100), "sparse:10": iter([0.9] * 100)}
    nexts = {"sparse:20": 0.45, "sparse:10": 0.45}
    ran = _drive(auto, 20, times.get, lambda k: next(gains[k]), nexts.get, comm=0.9)
    pruned = [(d["step"], d["method"]) for d in auto.decisions if d["event"] == "pruned"]
    assert (4, "sparse:10") in pruned and (7, "sparse:40") in pruned
    assert (4, "dense") in pruned and "dense" not in ran
    assert ran[8:12] == ["powersgd:4"] * 4                 # chosen, then drifted
    assert ran[12:15] == ["sparse:20"] * 3 and auto.table["sparse:20"]["gain"] == 0.45
    assert ran[15:18] == ["sparse:10"] * 3
    chosen = [(d["step"], d["method"]) for d in auto.decisions if d["event"] == "chosen"]
    assert chosen == [(7, "powersgd:4"), (17, "sparse:10")]


class _Rank0Sync(_Sync2):
    """Rank 0 of two: records what it broadcasts."""

    def __init__(self):
        self.sent = []

    def broadcast_object(self, obj, name):
        self.sent.append((name, obj))
        return obj


class _Rank1Sync(_Sync2):
    """Rank 1 of two: receives what rank 0 broadcast, in order, under the same names."""
    rank = 1

    def __init__(self, sent):
        self.sent = list(sent)

    def broadcast_object(self, obj, name):
        assert self.sent, f"rank 1 broadcasts {name!r} where rank 0 did not"
        sent_name, value = self.sent.pop(0)
        assert sent_name == name
        return value


@pytest.mark.parametrize("slow", [1.0, 10.0])
def test_ranks_whose_own_step_times_differ_make_the_same_choices(slow):
    """Every re-check is a broadcast, so its trigger must read agreed values only. Rank 1's
    run steps take ``slow`` x rank 0's (a straggler, or timers that disagree); with the
    same agreed gains both ranks run the same methods and log the same decisions, and
    rank 1 broadcasts exactly when rank 0 does (no hang). PowerSGD's gain drifts to 0.7,
    far ahead of every other method at rank 0's step times."""
    def run(rank_slow, sync):
        auto = _auto(world=2, methods=["dense", "powersgd:4", "sparse:10"], alpha=0.02,
                     recheck_every=1000)
        auto.bind(list(SHAPES), sync)
        gains = {"powersgd:4": iter([0.9] * 3 + [0.7] * 100), "sparse:10": iter([0.8] * 100)}
        times = {"dense": 1.0, "powersgd:4": 0.4, "sparse:10": 2.0}
        return auto, _drive(auto, 30,
                            lambda k: times[k] * (rank_slow if auto.phase == "run" else 1),
                            lambda k: next(gains[k]), sync=sync)
    rank0 = _Rank0Sync()
    a0, ran0 = run(1.0, rank0)
    rank1 = _Rank1Sync(rank0.sent)
    a1, ran1 = run(slow, rank1)
    assert ran0 == ran1 and a0.decisions == a1.decisions and rank1.sent == []
    assert ran0[8:] == ["powersgd:4"] * 22          # no re-check: far ahead at 0.7


@pytest.mark.parametrize("untimed_rank", [0, 1])
def test_a_trial_untimed_on_one_rank_only_ends_alike_on_both(untimed_rank):
    """Whether an untimed trial runs on decides a broadcast, so it is rank 0's call, shared
    by the measure's broadcast: a joining or resumed rank whose first step has no step
    time while the other's has one (elastic) makes the same choices, and each rank
    broadcasts exactly when rank 0 does (no hang)."""
    times = {"dense": 2.0, "fp16": 1.0, "powersgd:4": 0.5, "powersgd:1": 0.4,
             "sparse:10": 0.7, "sparse:20": 0.55}
    gains = {"powersgd:4": 0.4, "sparse:10": 0.6, "sparse:20": 0.45}

    def run(rank, sync):
        a = _auto(world=2)
        _drive(a, 1, times.get, lambda k: gains.get(k, 0.0))     # fp16's settling step
        a.bind(list(SHAPES), sync)
        first = []

        def time_of(key):
            if rank == untimed_rank and not first:
                first.append(key)
                return None
            return times.get(key, 0.5)
        return a, _drive(a, 25, time_of, lambda k: gains.get(k, 0.0), sync=sync)
    rank0 = _Rank0Sync()
    a0, ran0 = run(0, rank0)
    rank1 = _Rank1Sync(rank0.sent)
    a1, ran1 = run(1, rank1)
    assert ran0 == ran1 and a0.decisions == a1.decisions and rank1.sent == []
    assert a0.table["fp16"]["t"] == 1.0
