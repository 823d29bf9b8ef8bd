"""GraVAC controller driven by scripted gains and timings (no Horovod)."""
import pickle

import pytest

from gravac.controllers import GraVAC, LocalSync, StepRecord, build_ladder
from gravac.controllers.base import DECISIONS_KEPT
from gravac.controllers.gravac import default_alpha, saturation_point

SYNC = LocalSync()


def test_ladders():
    assert build_ladder(10, 1000, "exponential") == [10, 20, 40, 160, 1000]
    assert build_ladder(10, 2000, "geometric") == [10, 20, 40, 80, 160, 320, 640, 1280, 2000]
    assert build_ladder(1.5, 1000, "geometric") == [1.5, 3, 6, 12, 24, 48, 96, 192, 384, 768, 1000]
    assert build_ladder(10, 10, "geometric") == [10]
    assert build_ladder(10, 40, "geometric") == [10, 20, 40]
    assert GraVAC(theta_min=10, theta_max=1000).ladder == [10, 20, 40, 160, 1000]


def run(ctrl, steps, gains, throughput, start=0, samples=64):
    """Drive ``ctrl`` like the optimizer does. ``gains(step, plan) -> (g_min, g_c)``;
    ``throughput(cf) -> T_sys`` sets t_iter. Returns the per-step log."""
    log = []
    for step in range(start, start + steps):
        plan = ctrl.plan(step)
        g_min, g_c = gains(step, plan)
        if plan.theta_min <= 1:
            sent = "dense"   # nothing sparse: the optimizer sends dense without asking
        else:
            sent = ctrl.decide(g_min, g_c if plan.theta_c is not None else None)
        cf = {"candidate": plan.theta_c, "min": plan.theta_min, "dense": 1.0}[sent]
        log.append((step, sent, cf, plan.theta_min, plan.theta_c))
        ctrl.end_step(StepRecord(step=step, sent=sent, cf=cf, gain=1.0,
                                 t_iter=samples / throughput(cf), samples=samples), SYNC)
    return log


def test_three_way_choice_and_ewma():
    ctrl = GraVAC(epsilon=0.7, window=1, alpha=1.0)
    assert ctrl.decide(0.9, 0.8) == "candidate"
    assert ctrl.decide(0.9, 0.5) == "min"
    assert ctrl.decide(0.5, 0.3) == "dense"
    assert ctrl.decide(0.7, 0.7) == "candidate"          # >= epsilon
    assert ctrl.decide(0.75, None) == "min"              # no candidate this step
    smooth = GraVAC(alpha=0.5)
    smooth.decide(0.8, 0.4)                               # first sample taken as is
    smooth.decide(0.4, 0.8)
    assert smooth.delta_min == pytest.approx(0.6) and smooth.delta_c == pytest.approx(0.6)
    assert default_alpha(2) == 0.02 and default_alpha(1) == 0.01 and default_alpha(400) == 1.0


def test_warmup_zero_evaluates_the_candidate_from_step_zero():
    """The paper (and the default, warmup_windows=0): the candidate is compressed, measured
    and may be sent from the first step, so the first evaluation already moves θc."""
    ctrl = GraVAC(theta_min=10, theta_max=1000, window=5, alpha=1.0)
    log = run(ctrl, 6, lambda s, p: (0.95, 0.9), lambda cf: 100.0)
    assert [(sent, cf, theta_c) for _, sent, cf, _, theta_c in log[:5]] == \
        [("candidate", 20, 20)] * 5
    first = ctrl.decisions[0]
    assert first["advanced"] and first["theta_c"] == 40 and log[5][4] == 40


def test_warmup_windows_run_at_theta_min_only():
    ctrl = GraVAC(theta_min=10, theta_max=1000, window=5, alpha=1.0, warmup_windows=1)
    log = run(ctrl, 6, lambda s, p: (0.95, 0.9), lambda cf: 100.0)
    assert all(theta_c is None and sent == "min" for _, sent, _, _, theta_c in log[:5])
    assert log[5][4] == 20 and log[5][1] == "candidate"
    first = ctrl.decisions[0]
    assert first["theta_min"] == 10 and first["theta_c"] == 20 and not first["advanced"]
    with pytest.raises(ValueError, match=r"warmup_windows must be an int >= 0"):
        GraVAC(warmup_windows=-1)


def test_theta_min_scales_up_when_gains_are_close_and_candidate_climbs():
    ctrl = GraVAC(theta_min=10, theta_max=1000, omega=0.01, window=4, alpha=1.0)
    # gains within 1% of each other -> θmin takes θc at each evaluation
    run(ctrl, 8, lambda s, p: (0.95, 0.949), lambda cf: 100.0 + cf)
    assert (ctrl.theta_min, ctrl.theta_c) == (40, 160)
    # gains 10% apart -> θmin stays, θc still climbs
    ctrl2 = GraVAC(theta_min=10, theta_max=1000, omega=0.01, window=4, alpha=1.0)
    run(ctrl2, 8, lambda s, p: (0.95, 0.85), lambda cf: 100.0 + cf)
    assert (ctrl2.theta_min, ctrl2.theta_c) == (10, 160)
    run(ctrl2, 8, lambda s, p: (0.95, 0.85), lambda cf: 100.0 + cf, start=8)
    assert ctrl2.theta_c == 1000, "stays at θmax when there is no higher rung"


def test_scale_up_epsilon_rule_follows_the_candidate_that_was_sent():
    """Gains 0.95 / 0.85 (10% apart, both above ε = 0.7): the paper's rule keeps θmin at
    10; scale_up="epsilon" moves θmin to each candidate that cleared ε, and when the next
    candidates do not (0.5), θmin stays at the last one that did, which is then sent."""
    def gains(step, plan):
        return (0.95, 0.5 if plan.theta_c >= 160 else 0.85)
    paper = GraVAC(theta_min=10, theta_max=1000, omega=0.01, window=4, alpha=1.0)
    run(paper, 16, gains, lambda cf: 100.0 + cf)
    assert (paper.theta_min, paper.theta_c) == (10, 1000)
    eps = GraVAC(theta_min=10, theta_max=1000, omega=0.01, window=4, alpha=1.0,
                 scale_up="epsilon")
    log = run(eps, 16, gains, lambda cf: 100.0 + cf)
    assert [d["theta_min"] for d in eps.decisions] == [20, 40, 40, 40]
    assert [d["theta_c"] for d in eps.decisions] == [40, 160, 1000, 1000]
    assert [(sent, cf) for _, sent, cf, _, _ in log[8:]] == [("min", 40)] * 8
    with pytest.raises(ValueError, match="scale_up"):
        GraVAC(scale_up="always")


def test_scale_up_epsilon_forgets_throughputs_below_the_new_theta_min():
    """20x and 40x reach compression throughputs within ω. Measured before θmin moved past
    them, 20x's number is stale: with scale_up="epsilon" it is dropped when θmin reaches
    40x, so GraVAC neither settles back on 20x nor forgets dense."""
    speed = {1: 90.0, 10: 100.0, 20: 150.0, 40: 150.5, 160: 160.0, 1000: 170.0}
    gains = lambda s, p: (0.95, 0.5 if p.theta_c == 160 else 0.85)
    ctrl = GraVAC(theta_min=10, theta_max=1000, omega=0.01, window=4, alpha=1.0,
                  dense_probe_steps=1, scale_up="epsilon")
    run(ctrl, 12, gains, lambda cf: speed[int(cf)])
    assert not ctrl.settled and (ctrl.theta_min, ctrl.theta_c) == (40, 1000)
    assert sorted(ctrl.decisions[-1]["table"]) == [1.0, 40.0]
    assert [d["settled"] for d in ctrl.decisions] == [False] * 3


def test_paper_case_settles_at_1280():
    """1280x and 2000x reach compression throughputs 1029.9 and 1035.4; ω = 1% -> 1280x,
    and CheckGraVAC, run again every window on the same table, keeps answering 1280x."""
    throughput = {10: 500.0, 20: 600.0, 40: 700.0, 80: 800.0, 160: 900.0, 320: 950.0,
                  640: 1000.0, 1280: 1029.9, 2000: 1035.4}
    ctrl = GraVAC(theta_min=10, theta_max=2000, omega=0.01, window=5, policy="geometric",
                  alpha=1.0)
    log = run(ctrl, 5 * 12, lambda s, p: (1.0, 1.0), lambda cf: throughput[int(cf)])
    assert ctrl.settled
    assert ctrl.theta_c == 1280 and ctrl.theta_min <= 1280
    first = next(i for i, d in enumerate(ctrl.decisions) if d["settled"])
    assert first == 7, "settles at the evaluation right after 2000x was measured"
    assert ctrl.decisions[first]["table"][1280.0] == pytest.approx(1029.9)
    assert ctrl.decisions[first]["table"][2000.0] == pytest.approx(1035.4)
    assert all(d["settled"] and d["theta_c"] == 1280 for d in ctrl.decisions[first:])
    # every candidate rung was used, in order, from the first window, then 1280x
    used = []
    for _, sent, cf, _, _ in log:
        if not used or used[-1] != cf:
            used.append(cf)
    assert used == [20, 40, 80, 160, 320, 640, 1280, 2000, 1280]
    assert saturation_point({1280.0: 1029.9, 2000.0: 1035.4}, 0.005) is None


def test_saturation_follows_the_table_nothing_is_final():
    """Saturated at 40x; then 40x slows down (a phase change): the next evaluation no
    longer finds saturation and the candidate climbs again."""
    speed = {20: 600.0, 40: 603.0, 160: 800.0, 1000: 900.0}
    ctrl = GraVAC(theta_min=10, theta_max=1000, omega=0.01, window=4, alpha=1.0)
    gains = lambda s, p: (1.0, 1.0)
    run(ctrl, 8, gains, lambda cf: speed[int(cf)])
    assert ctrl.settled and ctrl.theta_c == 20
    speed[20] = 300.0
    run(ctrl, 4, gains, lambda cf: speed[int(cf)], start=8)
    assert not ctrl.settled and ctrl.theta_c == 40
    log = run(ctrl, 8, gains, lambda cf: speed[int(cf)], start=12)
    assert {cf for _, _, cf, _, _ in log} >= {40, 160}


def test_delta_min_restarts_when_saturation_lowers_theta_min():
    """Under scale_up="gain" the table keeps CFs below θmin: θmin scales up to 40 (gains
    within ω), and 10x and 40x then train equally fast, so saturation settles on the lower
    CF, 10x. δmin had tracked 40x's gain: it restarts, as δc does when θc moves."""
    ctrl = GraVAC(theta_min=10, theta_max=1000, window=1, alpha=1.0, scale_up="gain")

    def gains(step, plan):
        return (0.9, 0.5) if step == 0 else (0.9, 0.9)
    run(ctrl, 2, gains, lambda cf: 1000.0)
    scaled, settled = ctrl.decisions
    assert not scaled["scaled_up"] and scaled["theta_c"] == 40
    assert settled["scaled_up"] and settled["settled"]
    assert (ctrl.theta_min, ctrl.theta_c) == (10, 10)
    assert ctrl.delta_min is None and ctrl.delta_c is None
    log = run(ctrl, 1, lambda s, p: (0.8, 0.8), lambda cf: 1000.0, start=2)
    assert ctrl.delta_min == 0.8 and log[0][3] == 10       # the first new sample as is


def test_paper_rule_never_locks_in_dense_after_a_critical_phase():
    """The reproduction: a critical phase sends dense (table {1: 1000}), then
    θmin's throughput is 988, below dense's. The paper's rule does not settle on dense:
    dense is not a candidate and every later step compresses while θc climbs the ladder."""
    gains = lambda s, p: (0.5, 0.4) if s < 10 else (0.95, 0.93)
    ctrl = GraVAC(theta_min=10, theta_max=1000, omega=0.01, window=10, alpha=1.0, epsilon=0.9)
    log = run(ctrl, 60, gains, lambda cf: 1000.0 if cf == 1 else 1000.0 + cf)
    assert [sent for _, sent, _, _, _ in log[:10]] == ["dense"] * 10
    assert all(sent != "dense" for _, sent, _, _, _ in log[10:])
    assert {cf for _, _, cf, _, _ in log[10:]} == {40, 160, 1000}
    assert not any(d["on_dense"] for d in ctrl.decisions)
    assert saturation_point({1.0: 1000.0, 10.0: 988.0}, 0.01) is None
    assert saturation_point({1.0: 1000.0, 10.0: 998.0, 20.0: 999.0}, 0.01) == 10.0


def test_settle_dense_needs_a_margin_and_reprobes():
    """settle_dense (E3): dense beats the best CF by more than ω -> dense windows; every
    dense_reprobe windows one window runs the ladder again; once compression pays (a
    phase change makes it faster), GraVAC leaves dense."""
    phase = {"compressed": 1040.0}
    # window 0 compresses (988 at 10x; dense not measured yet), window 1 is a critical
    # phase that goes dense (1000): no step of it cleared ε, and dense beats 988 by > ω
    gains = lambda s, p: (0.5, 0.4) if 10 <= s < 20 else (0.95, 0.5)
    ctrl = GraVAC(theta_min=10, theta_max=1000, omega=0.01, window=10, alpha=1.0, epsilon=0.9,
                  settle_dense=True, dense_reprobe=2)
    speed = lambda cf: 1000.0 if cf == 1 else phase["compressed"]
    log = run(ctrl, 20, gains, speed)          # 988 at 10x vs 1000 dense: 1.2% > ω
    assert ctrl.on_dense and ctrl.decisions[-1]["on_dense"]
    log += run(ctrl, 20, gains, speed, start=20)
    assert [sent for _, sent, _, _, _ in log[20:40]] == ["dense"] * 20
    assert ctrl.decisions[-1]["reprobe"] and not ctrl.on_dense
    log += run(ctrl, 10, gains, speed, start=40)  # the re-probe: still 988 -> dense again
    assert [sent for _, sent, _, _, _ in log[40:50]] == ["min"] * 10 and ctrl.on_dense
    phase["compressed"] = 1200.0
    log += run(ctrl, 30, gains, speed, start=50)  # 2 dense windows, re-probe at 1140
    assert [sent for _, sent, _, _, _ in log[70:80]] == ["min"] * 10
    assert not ctrl.on_dense
    log += run(ctrl, 10, gains, speed, start=80)
    assert all(sent == "min" for _, sent, _, _, _ in log[80:]) and not ctrl.on_dense
    # within ω of each other: compression stays
    close = GraVAC(theta_min=10, theta_max=1000, omega=0.01, window=10, alpha=1.0, epsilon=0.9,
                   settle_dense=True)
    run(close, 20, lambda s, p: (0.5, 0.4) if s < 5 else (0.95, 0.5),
        lambda cf: 1000.0 if cf == 1 else 1050.0)                      # 997.5 vs 1000
    assert not close.on_dense
    with pytest.raises(ValueError, match="dense_reprobe"):
        GraVAC(settle_dense=True, dense_reprobe=0)


def test_settle_dense_stops_compressing_after_a_window_where_nothing_cleared_epsilon():
    """E3 (docs/notes/2026-11-benchmarks.md §3d, ResNet-18): gains at θmin stay below ε, so every step goes
    dense after paying for both compression levels. The paper's rule keeps compressing
    (and discarding); settle_dense trains dense without compressing, and its re-probe
    window restarts the gain averages so that today's gradients decide."""
    low = lambda s, p: (0.6, 0.4)
    paper = GraVAC(theta_min=10, theta_max=1000, window=10, epsilon=0.7)
    log = run(paper, 40, low, lambda cf: 100.0)
    assert all(sent == "dense" and theta_min == 10 for _, sent, _, theta_min, _ in log)
    ctrl = GraVAC(theta_min=10, theta_max=1000, window=10, epsilon=0.7, settle_dense=True,
                  dense_reprobe=2)
    log = run(ctrl, 30, low, lambda cf: 100.0)
    assert [theta_min for _, _, _, theta_min, _ in log] == [10] * 10 + [1.0] * 20
    assert ctrl.decisions[-1]["reprobe"] and ctrl.delta_min is None
    # the gradients compress again: the re-probe's first sample, not the old average
    log += run(ctrl, 10, lambda s, p: (0.9, 0.8), lambda cf: 100.0 * cf, start=30)
    assert [sent for _, sent, _, _, _ in log[30:40]] == ["candidate"] * 10
    assert not ctrl.on_dense


def test_dense_probe_measures_dense_but_only_settle_dense_acts_on_it():
    """A fast link: dense at 1000 samples/s beats CF 10 at 900 x gain 0.8 = 720."""
    fast = lambda cf: 1000.0 if cf == 1 else 900.0
    probe = GraVAC(theta_min=10, theta_max=1000, window=10, alpha=1.0, dense_probe_steps=3,
                   epsilon=0.7)
    log = run(probe, 14, lambda s, p: (0.8, 0.6), fast)
    assert [e[1] for e in log[:10]] == ["min"] * 7 + ["dense"] * 3
    assert probe.table[1.0] == 1000.0
    assert all(e[1] == "min" for e in log[10:]), "the paper's rule: dense is not a candidate"
    ctrl = GraVAC(theta_min=10, theta_max=1000, window=10, alpha=1.0, dense_probe_steps=3,
                  settle_dense=True)
    log = run(ctrl, 14, lambda s, p: (0.8, 0.6), fast)
    assert ctrl.on_dense and all(e[1] == "dense" and e[3] == 1.0 for e in log[10:])
    # a slow link: compression pays, the probe does not stop GraVAC from climbing
    slow = GraVAC(theta_min=10, theta_max=1000, window=10, alpha=1.0, dense_probe_steps=3,
                  settle_dense=True)
    run(slow, 14, lambda s, p: (0.8, 0.6), lambda cf: 100.0 * cf)
    assert not slow.on_dense and slow.theta_c == 40
    with pytest.raises(ValueError, match=r"dense_probe_steps"):
        GraVAC(window=10, dense_probe_steps=10)


def test_gain_drop_falls_back_per_step_without_waiting_for_a_window():
    ctrl = GraVAC(theta_min=10, theta_max=1000, window=4, alpha=1.0, epsilon=0.7)
    gains = lambda s, p: (0.2, 0.1) if s == 9 else ((0.9, 0.6) if s == 10 else (0.95, 0.9))
    log = run(ctrl, 12, gains, lambda cf: 100.0)
    assert [entry[1] for entry in log[8:12]] == ["candidate", "dense", "min", "candidate"]


def test_resume_from_state_dict_makes_the_same_decisions():
    def gains(step, plan):
        return 0.97 - 0.0001 * step, 0.96 - 0.0002 * step * (plan.theta_c or 1) / 100
    throughput = lambda cf: 1000.0 * (1 - 1 / (1 + cf))
    make = lambda: GraVAC(theta_min=10, theta_max=1000, window=7, alpha=0.3)
    full = make()
    full_log = run(full, 70, gains, throughput)
    first = make()
    log_a = run(first, 31, gains, throughput)
    resumed = make()
    resumed.load_state_dict(first.state_dict())
    log_b = run(resumed, 39, gains, throughput, start=31)
    assert log_a + log_b == full_log
    assert resumed.decisions == full.decisions
    assert resumed.state_dict() == full.state_dict()
    with pytest.raises(ValueError, match="other hyperparameters"):
        GraVAC(window=8).load_state_dict(first.state_dict())
    # A state saved before an option existed loads into what the code then did only: the
    # paper's decide rule (not E7), the lower CF at saturation (not line 37's ct[-2]).
    for option, other in (("decide", "previous"), ("saturation", "second_best")):
        old = first.state_dict()
        del old["hyper"][option]
        make().load_state_dict(old)
        with pytest.raises(ValueError, match=f"other hyperparameters.*{option}"):
            GraVAC(theta_min=10, theta_max=1000, window=7, alpha=0.3,
                   **{option: other}).load_state_dict(old)


@pytest.mark.parametrize("kwargs,match", [
    ({"epsilon": 0}, r"epsilon must be in \(0, 1\]"),
    ({"epsilon": 1.2}, r"epsilon must be in \(0, 1\]"),
    ({"omega": -0.1}, "omega must be a number >= 0"),
    ({"window": 0}, "window must be an int >= 1"),
    ({"window": 2.5}, "window must be an int >= 1"),
    ({"theta_min": 10, "theta_max": 5}, r"theta_max must be a number >= theta_min \(10\)"),
    ({"theta_min": 0.5}, "theta_min must be a number >= 1"),
    ({"theta_max": float("inf")}, r"theta_max=inf\): theta_max must be a number"),
    ({"policy": "linear"}, "policy must be one of exponential, geometric"),
    ({"alpha": 0}, r"alpha must be in \(0, 1\]"),
    ({"gain_measure": "l1"}, "gain_measure must be one of energy, norm"),
    ({"settle_dense": "yes"}, "settle_dense must be true or false"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GraVAC(**kwargs)


def test_saturation_relative_to_the_second_best_and_both_choices_of_theta_ideal():
    """Algorithm 1, line 36: within ω of the second best (1% of 1000, not of 1010). Line 37
    takes the second best's CF (``saturation="second_best"``, here the larger CF); the
    default keeps the paper's text, the lower CF of the two."""
    assert saturation_point({10.0: 1010.0, 20.0: 1000.0}, 0.01) == 10.0
    assert saturation_point({10.0: 1010.0, 20.0: 1000.0}, 0.01, "second_best") == 20.0
    assert saturation_point({10.0: 1010.0, 20.0: 1000.0}, 0.00999) is None  # 1% > ω
    assert saturation_point({10.0: 1000.0, 20.0: 1010.0}, 0.00999) is None
    speed = {20: 603.0, 40: 600.0, 160: 400.0, 1000: 300.0}
    chosen = {}
    for rule in ("lower_cf", "second_best"):
        ctrl = GraVAC(theta_min=10, theta_max=1000, omega=0.01, window=4, alpha=1.0,
                      saturation=rule)
        run(ctrl, 8, lambda s, p: (1.0, 1.0), lambda cf: speed[int(cf)])
        assert ctrl.settled
        chosen[rule] = ctrl.theta_c
    assert chosen == {"lower_cf": 20, "second_best": 40}
    assert GraVAC().saturation == "lower_cf"
    with pytest.raises(ValueError, match="saturation"):
        GraVAC(saturation="largest")


def test_the_table_holds_each_cfs_mean_over_the_window():
    """The throughput table's entry of a CF is the mean of T_compress over the window's
    steps that sent it (not the last step's, as in the authors' code)."""
    ctrl = GraVAC(theta_min=10, theta_max=1000, window=4, alpha=1.0)
    speeds = iter([100.0, 200.0, 300.0, 600.0])
    run(ctrl, 4, lambda s, p: (1.0, 1.0), lambda cf: next(speeds))
    assert ctrl.decisions[0]["table"] == {20.0: pytest.approx(300.0)}


def test_a_long_run_keeps_the_latest_decisions_and_counts_all():
    """``decisions`` is a log (the trainer writes each record as it appears): it keeps the
    latest DECISIONS_KEPT, so the state and checkpoints stay one size over a long run
    (whole, they grew by a record per window), and ``decisions_made`` counts every one,
    through a checkpoint too."""
    def make():
        return GraVAC(theta_min=10, theta_max=1000, window=1, alpha=1.0)
    ctrl, sizes = make(), []
    for _ in range(3):
        run(ctrl, DECISIONS_KEPT, lambda s, p: (0.9, 0.8), lambda cf: 100.0,
            start=ctrl.decisions_made)
        sizes.append(len(pickle.dumps(ctrl.state_dict())))
    assert ctrl.decisions_made == 3 * DECISIONS_KEPT and len(ctrl.decisions) == DECISIONS_KEPT
    assert [d["step"] for d in ctrl.decisions] == list(range(2 * DECISIONS_KEPT,
                                                             3 * DECISIONS_KEPT))
    assert sizes[2] < 1.05 * sizes[1]
    again = make()
    again.load_state_dict(ctrl.state_dict())
    assert again.decisions_made == 3 * DECISIONS_KEPT and again.decisions == ctrl.decisions
