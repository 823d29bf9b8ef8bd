"""What the step engine measures for the controller: the gain measure (energy
vs norm), a dense step's t_iter without the compression it threw away, and the actual CF
sent. One process (LocalComm); values computed independently in the test."""
import math
import time
from pathlib import Path

import pytest
import torch
import yaml

from gravac.comm.local import LocalComm
from gravac.compressors import TopK, num_kept
from gravac.controllers import Accordion, GraVAC, Static
from gravac.engine.optimizer import wrap_optimizer

REPO = Path(__file__).resolve().parents[2]


def _params(*sizes):
    return [(f"w{i}", torch.nn.Parameter(torch.zeros(n))) for i, n in enumerate(sizes)]


def _optimizer(named, controller, compressor="topk", **kwargs):
    return wrap_optimizer(torch.optim.SGD([p for _, p in named], lr=0.0), named, LocalComm(),
                          compressor=compressor, controller=controller, **kwargs)


def _set_grads(named, grads):
    for (_, p), g in zip(named, grads):
        p.grad = g.clone()


def _top_sq(values: torch.Tensor, k: int) -> float:
    """Σ of the k largest squares (ties have equal values, so the sum is unambiguous)."""
    return float(torch.sort(values.double().pow(2), descending=True).values[:k].sum())


@pytest.mark.parametrize("measure", ["energy", "norm"])
def test_gain_measures_on_known_tensors(measure):
    """Two layers with distinct known values; step 1 carries step 0's residual. energy:
    Σ‖g_c‖²/Σ‖g_ef‖²; norm: Σ‖g_c‖/Σ‖g‖ (per-layer norms, raw gradient below)."""
    named = _params(2048, 3000)
    grads = [torch.arange(1, 2049, dtype=torch.float32),
             torch.linspace(-3.0, 5.0, 3000) ** 3 + 0.001]
    opt = _optimizer(named, GraVAC(theta_min=2, theta_max=8, window=100, alpha=1.0,
                                   epsilon=0.01, gain_measure=measure))
    residual = [torch.zeros_like(g) for g in grads]
    for step in range(2):
        _set_grads(named, grads)
        opt.step()
        stats = opt.last_stats
        assert (stats.theta_min, stats.theta_c) == (2.0, 4.0)
        g_ef = [g + r for g, r in zip(grads, residual)]
        k_min = [num_kept(g.numel(), 2) for g in grads]
        k_c = [num_kept(g.numel(), 4) for g in grads]
        if measure == "energy":
            den = sum(float(e.double().pow(2).sum()) for e in g_ef)
            want_min = sum(_top_sq(e, k) for e, k in zip(g_ef, k_min)) / den
            want_c = sum(_top_sq(e, k) for e, k in zip(g_ef, k_c)) / den
        else:
            den = sum(float(g.double().norm()) for g in grads)
            want_min = sum(math.sqrt(_top_sq(e, k)) for e, k in zip(g_ef, k_min)) / den
            want_c = sum(math.sqrt(_top_sq(e, k)) for e, k in zip(g_ef, k_c)) / den
        assert stats.gain_min == pytest.approx(want_min, rel=1e-6)
        assert stats.gain_c == pytest.approx(want_c, rel=1e-6)
        assert stats.sent == "candidate"
        # what was not sent stays as the residual
        residual = [opt.memory[name].reshape(-1).clone() for name, _ in named]
    if measure == "norm":
        # with a residual in g_ef, the norm measure may exceed what energy would give
        assert stats.gain_min > 0.8


def test_random_k_at_1_5x_clears_epsilon_only_by_the_norm_measure():
    """Uniform selection keeps ~1/θ of the energy (0.67 < ε = 0.7 at 1.5x) but ~1/√θ of
    the norm (0.82): the paper's Random-k special case needs the norm measure."""
    g = torch.randn(200_000, generator=torch.Generator().manual_seed(0))
    gains = {}
    for measure in ("energy", "norm"):
        named = _params(g.numel())
        opt = _optimizer(named, GraVAC(theta_min=1.5, theta_max=1000, window=100, alpha=1.0,
                                       gain_measure=measure, policy="geometric"),
                         compressor="randomk")
        _set_grads(named, [g])
        opt.step()
        gains[measure] = opt.last_stats.gain_min
    assert gains["energy"] == pytest.approx(1 / 1.5, abs=0.01)
    assert gains["norm"] == pytest.approx(math.sqrt(1 / 1.5), abs=0.01)


@pytest.mark.parametrize("measure,sparse_share", [("energy", 0.0), ("norm", 1.0)])
def test_random_k_config_compresses_as_the_paper_describes(measure, sparse_share):
    """configs/compression/gravac_randomk.yaml (window shortened) on a small regression:
    with its gain measure (norm) every step is sent compressed; the energy measure would
    send every step dense after computing both levels."""
    options = yaml.safe_load((REPO / "configs/compression/gravac_randomk.yaml").read_text())
    gravac = dict(options["compression"]["gravac"], window=10)
    assert gravac.pop("gain_measure") == "norm"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.05), model.named_parameters(),
                         LocalComm(), compressor=options["compression"]["compressor"],
                         compressor_options=options["compression"]["compressor_options"],
                         controller=GraVAC(**gravac, gain_measure=measure, alpha=0.5))
    data = torch.Generator().manual_seed(1)
    sent = []
    for _ in range(40):
        x = torch.randn(32, 64, generator=data)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), x[:, :4]).backward()
        opt.step()
        sent.append(opt.last_stats.sent)
    assert sum(s != "dense" for s in sent) / len(sent) == sparse_share


class _SlowTopK(TopK):
    """Top-k that takes at least ``delay`` seconds per selection."""

    def __init__(self, delay):
        super().__init__()
        self.delay = delay

    def select(self, x, k, ctx=None):
        time.sleep(self.delay)
        return super().select(x, k, ctx)


class _RecordingGraVAC(GraVAC):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.records = []

    def end_step(self, record, sync):
        self.records.append(record)
        super().end_step(record, sync)


@pytest.mark.parametrize("epsilon,sent", [(1.0, "dense"), (0.01, "candidate")])
def test_a_dense_step_is_timed_without_the_compression_it_did_not_use(epsilon, sent):
    """Algorithm 1, line 23: a dense step's t_iter = t_o + t_s. Both levels were computed
    (2 slow selections per layer, 2 layers) and thrown away: the controller's t_iter leaves
    them out; a compressed step's t_iter is the whole step."""
    delay = 0.02
    named = _params(4096, 4096)
    ctrl = _RecordingGraVAC(theta_min=10, theta_max=1000, window=100, alpha=1.0,
                            epsilon=epsilon)
    opt = _optimizer(named, ctrl, compressor=_SlowTopK(delay))
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        _set_grads(named, [torch.randn(4096, generator=g) for _ in named])
        opt.step()
        stats, record = opt.last_stats, ctrl.records[-1]
        assert stats.sent == sent
        if sent == "dense":
            assert stats.t_discarded >= 4 * delay
            if stats.t_iter is not None:
                assert record.t_iter == pytest.approx(stats.t_iter - stats.t_discarded)
                assert record.t_iter < stats.t_iter - 4 * delay + 1e-9
        else:
            assert stats.t_discarded == 0.0
            assert record.t_iter == stats.t_iter


@pytest.mark.parametrize("compressor", ["topk", "dgc", "redsync"])
def test_actual_cf_is_what_was_sent(compressor):
    """The rung stays the nominal CF; cf_actual is compressible elements / values sent.
    DGC keeps between 0.7k and k values, RedSync between k/2 and 2k."""
    named = _params(100_000, 50_000, 100)
    opt = _optimizer(named, Static(cf=10), compressor=compressor)
    g = torch.Generator().manual_seed(5)
    for _ in range(3):
        _set_grads(named, [torch.randn(p.numel(), generator=g) for _, p in named])
        opt.step()
        stats = opt.last_stats
        assert stats.cf == 10.0
        assert stats.cf_actual == pytest.approx(150_000 / stats.values_sent)
        k = num_kept(100_000, 10) + num_kept(50_000, 10)
        if compressor == "topk":
            assert stats.values_sent == k
        elif compressor == "dgc":
            assert 0.7 * k - 2 <= stats.values_sent <= k
        else:
            assert k / 2 - 2 <= stats.values_sent <= 2 * k + 2
    # a dense step: the actual CF is 1
    dense = _optimizer(named, Static(cf=1), compressor=compressor)
    _set_grads(named, [torch.ones(p.numel()) for _, p in named])
    dense.step()
    assert dense.last_stats.cf_actual == 1.0


class _SlowComm(LocalComm):
    """Each collective's wait takes ``delay`` seconds, as if the peer were late."""

    def __init__(self, delay):
        super().__init__()
        self.delay = delay

    def _late(self, handle):
        delay = self.delay

        class Late:
            def wait(self):
                time.sleep(delay)
                return handle.wait()
        return Late()

    def allreduce_async(self, tensor, op, name):
        return self._late(super().allreduce_async(tensor, op, name))

    def allgather_bytes_async(self, buffer, name, same_size=False):
        return self._late(super().allgather_bytes_async(buffer, name, same_size))


def _controller(kind):
    if kind == "static":
        return Static(cf=10)
    if kind == "accordion":
        return Accordion(low_cf=10, high_cf=100, interval_steps=5)
    return GraVAC(theta_min=10, theta_max=1000, window=100, alpha=1.0, epsilon=0.01)


@pytest.mark.parametrize("controller", ["static", "gravac", "accordion"])
def test_phases_split_local_work_from_waits(controller):
    """t_compress is local work only, t_comm the waits in the collectives; each
    phase gets its own time. A slow selection shows in t_select alone, late collectives
    in the gains and exchange waits alone (and in the NaN-flag wait where the flags have
    a round of their own: Accordion)."""
    from gravac.engine.phases import LOCAL_PHASES, WAIT_PHASES

    select_delay, comm_delay = 0.02, 0.2
    named = _params(4096, 4096)
    ctrl = _controller(controller)
    opt = wrap_optimizer(torch.optim.SGD([p for _, p in named], lr=0.0), named,
                         _SlowComm(comm_delay), compressor=_SlowTopK(select_delay),
                         controller=ctrl)
    g = torch.Generator().manual_seed(5)
    _set_grads(named, [torch.randn(4096, generator=g) for _ in named])
    opt.step()
    s = opt.last_stats
    levels = 2 if controller == "gravac" else 1
    assert s.t_select >= 2 * levels * select_delay
    assert s.t_wait_exchange >= comm_delay
    if controller == "accordion":
        assert s.t_wait_check >= comm_delay
    else:
        assert s.t_wait_check == 0.0
    if controller == "gravac":
        assert s.t_wait_gains >= comm_delay
    else:
        assert s.t_wait_gains == 0.0 and s.t_norms == 0.0
    for phase in LOCAL_PHASES + WAIT_PHASES:
        assert getattr(s, phase) >= 0.0
    assert s.t_compress == pytest.approx(sum(getattr(s, p) for p in LOCAL_PHASES))
    assert s.t_comm == pytest.approx(sum(getattr(s, p) for p in WAIT_PHASES))
    # A wait charged to a local phase (or a selection to a wait) would put a whole
    # delay there.
    for phase in LOCAL_PHASES:
        if phase != "t_select":
            assert getattr(s, phase) < comm_delay, phase
    # (Static's exchange waits for the allgather and, beside it, the flags: here the fake
    # comm makes each wait late in turn; on a real transport they overlap.)
    for phase in WAIT_PHASES:
        late = 2 if phase == "t_wait_exchange" and controller == "static" else 1
        assert getattr(s, phase) < (late + 1) * comm_delay, phase


class _RecordingComm(LocalComm):
    """Logs when each collective starts and when its result is waited for."""

    def __init__(self):
        super().__init__()
        self.events = []

    def _logged(self, handle, name):
        events = self.events

        class Logged:
            def wait(self):
                events.append(("wait", name))
                return handle.wait()
        self.events.append(("start", name))
        return Logged()

    def allreduce_async(self, tensor, op, name):
        return self._logged(super().allreduce_async(tensor, op, name), name)

    def allgather_bytes_async(self, buffer, name, same_size=False):
        return self._logged(super().allgather_bytes_async(buffer, name, same_size), name)

    def grouped_allreduce_async_(self, tensors, op, name):
        return self._logged(super().grouped_allreduce_async_(tensors, op, name), name)


@pytest.mark.parametrize("controller", ["static", "gravac", "accordion"])
def test_nan_flags_travel_with_the_steps_data(controller):
    """The NaN/Inf flags need no round of their own: with Static they ride in
    the exchange's dense group (no gravac.finite at all; tests/unit/test_nan_flags.py);
    with GraVAC they are in the gains allreduce; Accordion, which observes gradients,
    agrees on them first."""
    named = _params(4096, 4096, 10)
    comm = _RecordingComm()
    opt = wrap_optimizer(torch.optim.SGD([p for _, p in named], lr=0.0), named, comm,
                         controller=_controller(controller))
    _set_grads(named, [torch.randn(p.numel()) for _, p in named])
    comm.events.clear()
    opt.step()
    events = comm.events
    if controller == "static":
        assert events == [("start", "gravac.sparse"), ("start", "gravac.dense"),
                          ("wait", "gravac.sparse"), ("wait", "gravac.dense")]
    elif controller == "gravac":
        assert events[:2] == [("start", "gravac.gains"), ("wait", "gravac.gains")]
        assert ("start", "gravac.finite") not in events
        assert events[2:4] == [("start", "gravac.sparse"), ("start", "gravac.dense")]
    else:
        assert events[:2] == [("start", "gravac.finite"), ("wait", "gravac.finite")]
        assert events[2:4] == [("start", "gravac.sparse"), ("start", "gravac.dense")]


def test_decided_plan_agrees_its_gains_after_the_exchange_started():
    """GraVAC decide="previous" (E7) without overlap: the plan's level is sent, so the
    exchange starts first and the gains allreduce (with the NaN/Inf flags) follows it in
    the same round; the gains still reach the controller's averages, and a rank's NaN
    still skips the step with the residuals restored."""
    named = _params(4096, 4096, 10)
    comm = _RecordingComm()
    ctrl = GraVAC(theta_min=10, theta_max=1000, window=100, alpha=1.0, epsilon=0.01,
                  decide="previous")
    opt = wrap_optimizer(torch.optim.SGD([p for _, p in named], lr=0.0), named, comm,
                         controller=ctrl)
    for step in range(3):
        _set_grads(named, [torch.randn(p.numel()) for _, p in named])
        comm.events.clear()
        opt.step()
        expected_sent = "dense" if step == 0 else "candidate"   # nothing measured before step 0
        assert opt.last_stats.sent == expected_sent
        assert ctrl.delta_min == pytest.approx(opt.last_stats.gain_min)
        starts = [name for kind, name in comm.events if kind == "start"]
        assert starts[-1] == "gravac.gains" and "gravac.finite" not in starts
        assert starts.index("gravac.gains") > starts.index("gravac.dense")
        assert comm.events.index(("wait", "gravac.gains")) < comm.events.index(
            ("wait", "gravac.dense"))
    residuals = {n: opt.memory[n].clone() for n in opt.memory.names()}
    grads = [torch.randn(p.numel()) for _, p in named]
    grads[0][7] = float("nan")
    _set_grads(named, grads)
    opt.step()
    assert opt.last_stats.skipped and opt.last_stats.nonfinite_ranks == [0]
    for n, r in residuals.items():
        assert torch.equal(opt.memory[n], r)


def test_nonfinite_check_is_exact_where_a_sum_overflows():
    """The NaN/Inf check sums in float32 and looks entry by entry only when a sum is not
    finite: finite values whose sum overflows are not a skip; a NaN or Inf is."""
    from gravac.engine.selection import has_nonfinite

    big = torch.full((1000,), 3e38)
    assert not torch.isfinite(big.sum())
    assert not has_nonfinite([big, torch.ones(3)])
    assert not has_nonfinite([torch.full((100,), 60000.0, dtype=torch.float16)])
    for bad in (float("nan"), float("inf"), -float("inf")):
        for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
            t = torch.ones(50, dtype=dtype)
            t[17] = bad
            assert has_nonfinite([torch.zeros(4), t])
    assert not has_nonfinite([])


def test_restarting_the_step_clock_leaves_what_ran_between_steps_out():
    """An evaluation between two steps (10 s on a scripted clock) is in the next step's
    t_compute and t_iter, and in the controller's, unless ``restart_step_clock`` is called
    after it: then the step counts from the restart (2 s of compute)."""
    clock = {"now": 0.0}
    named = _params(4096)
    ctrl = _RecordingGraVAC(theta_min=10, theta_max=1000, window=100, alpha=1.0, epsilon=0.01)
    opt = _optimizer(named, ctrl)
    opt._engine.now = lambda: clock["now"]           # a clock the test moves
    g = torch.Generator().manual_seed(5)
    t_iters = {}
    for label, restart in (("first", False), ("evaluated", False), ("restarted", True)):
        clock["now"] += 10.0                         # the evaluation after the last step
        if restart:
            opt.restart_step_clock()
        clock["now"] += 2.0                          # forward and backward
        _set_grads(named, [torch.randn(4096, generator=g)])
        opt.step()
        t_iters[label] = (opt.last_stats.t_compute, opt.last_stats.t_iter,
                          ctrl.records[-1].t_iter)
    assert t_iters["first"] == (None, None, None)    # nothing to time the first step from
    assert t_iters["evaluated"] == (12.0, 12.0, 12.0)
    assert t_iters["restarted"] == (2.0, 2.0, 2.0)
