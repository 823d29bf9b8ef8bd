"""Overlap with backward (gravac/engine/step.py, buckets.py) on one process: buckets, hooks, the
same parameters as the plain step, accumulation, NaN skips and refusals. The two-rank
checks (bit-identical parameters across ranks, decisions, NaN on one rank) are in
tests/parallel/test_overlap.py."""
import math

import pytest
import torch
import torch.nn.functional as F

from gravac.comm.local import LocalComm
from gravac.controllers import Accordion, GraVAC, Static
from gravac.engine import wrap_optimizer
from gravac.engine.buckets import build_buckets


class _Net(torch.nn.Module):
    """Compressed layers (>= 1024 elements) and small dense ones, in forward order."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 96)      # 3072: compressed
        self.fc2 = torch.nn.Linear(96, 96)      # 9216: compressed
        self.out = torch.nn.Linear(96, 10)      # 960: dense
        self.norm = torch.nn.LayerNorm(96)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        h = self.norm(torch.relu(self.fc2(h)))
        return self.out(h)


class _RecordingComm(LocalComm):
    """A single process that logs every collective's name when it starts."""

    def __init__(self):
        super().__init__()
        self.started: list[str] = []

    def allreduce_async(self, tensor, op, name):
        self.started.append(name)
        return super().allreduce_async(tensor, op, name)

    def allgather_bytes_async(self, buffer, name, same_size=False):
        self.started.append(name)
        return super().allgather_bytes_async(buffer, name, same_size)

    def grouped_allreduce_async_(self, tensors, op, name):
        self.started.append(name)
        return super().grouped_allreduce_async_(tensors, op, name)


def _batch(step, batch=16):
    g = torch.Generator().manual_seed(step)
    return torch.randn(batch, 32, generator=g), torch.randint(0, 10, (batch,), generator=g)


def _make(controller_fn, overlap, comm=None, seed=0, **kwargs):
    torch.manual_seed(seed)
    model = _Net()
    opt = wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                         model.named_parameters(), comm or LocalComm(),
                         controller=controller_fn(), overlap=overlap, **kwargs)
    return model, opt


def _train(model, opt, steps, poison=None, passes=1):
    sent = []
    for step in range(steps):
        opt.zero_grad()
        for micro in range(passes):
            x, y = _batch(100 * step + micro)
            if poison is not None and poison(step):
                x[0, 0] = float("nan")
            F.cross_entropy(model(x), y).backward()
        opt.step()
        sent.append(opt.last_stats.sent)
    return sent


def _same_state(a, b) -> bool:
    """Equal controller states, tensors (Accordion's accumulators) compared exactly."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):     # GraVAC's throughput table holds timings: not compared
        keys = a.keys() - {"table", "window_sums"}
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same_state(a[k], b[k]) for k in keys)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same_state(x, y) for x, y in zip(a, b))
    return a == b


def _assert_same(a, b):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), f"{name} differs"


CONTROLLERS = {
    "static": lambda: Static(cf=10),
    "accordion": lambda: Accordion(low_cf=4, high_cf=40, interval_steps=3, switch_freq=1,
                                    eta=1.0),     # switches to high_cf at step 6
    # A window longer than the runs: window decisions follow timings, which differ per run.
    "gravac-previous": lambda: GraVAC(theta_min=4, theta_max=64, window=100, epsilon=0.5,
                                      alpha=1.0, decide="previous"),
}


@pytest.mark.parametrize("kind", sorted(CONTROLLERS))
@pytest.mark.parametrize("cap_mb", [0.01, 25.0])    # a bucket per layer-ish; one bucket
def test_overlapped_step_gives_the_same_parameters_bit_for_bit(kind, cap_mb):
    plain_model, plain = _make(CONTROLLERS[kind], overlap=False)
    over_model, over = _make(CONTROLLERS[kind], overlap=True, bucket_cap_mb=cap_mb)
    sent_plain = _train(plain_model, plain, 14)
    sent_over = _train(over_model, over, 14)
    assert sent_plain == sent_over
    _assert_same(plain_model, over_model)
    for name in plain.memory.names():
        assert torch.equal(plain.memory[name], over.memory[name]), name
    assert _same_state(plain.controller.state_dict(), over.controller.state_dict())


def test_buckets_are_cut_in_reverse_order_by_gradient_bytes():
    model, opt = _make(CONTROLLERS["static"], overlap=True, bucket_cap_mb=0.01)
    buckets = build_buckets(opt._engine.layers, int(0.01 * 2**20))   # 10485 bytes
    names = [[l.name for l in b] for b in buckets]
    order = [n for b in names for n in b]
    assert order == [l.name for l in reversed(opt._engine.layers)]
    # 4-byte floats: a bucket closes at the layer that takes it to >= 10485 bytes.
    assert names == [["norm.bias", "norm.weight", "out.bias", "out.weight", "fc2.bias",
                      "fc2.weight"], ["fc1.bias", "fc1.weight"]]
    one = build_buckets(opt._engine.layers, 2**40)
    assert len(one) == 1 and len(one[0]) == len(opt._engine.layers)


def test_the_first_bucket_closes_at_one_mebibyte_as_ddps():
    from gravac.engine.layers import Layer
    sizes = [300_000, 200_000, 100_000, 2_600_000]          # floats, forward order
    layers = [Layer(i, f"l{i}", torch.zeros(n), n, True) for i, n in enumerate(sizes)]
    names = [[l.name for l in b] for b in build_buckets(layers, 25 * 2**20)]
    # 10.4 MB alone (>= 1 MiB), then the rest (2.4 MB < 25 MiB) together.
    assert names == [["l3"], ["l2", "l1", "l0"]]
    names = [[l.name for l in b] for b in build_buckets(layers[:3], 25 * 2**20)]
    assert names == [["l2", "l1"], ["l0"]]                  # 0.4 + 0.8 MB >= 1 MiB, then l0


def test_buckets_leave_during_backward_in_bucket_order():
    comm = _RecordingComm()
    model, opt = _make(CONTROLLERS["static"], overlap=True, comm=comm, bucket_cap_mb=0.01)
    x, y = _batch(0)
    F.cross_entropy(model(x), y).backward()
    # Before step(): both buckets' exchanges already started, the last layers' first.
    assert comm.started == ["gravac.sparse.b0", "gravac.dense.b0",
                            "gravac.sparse.b1", "gravac.dense.b1"]
    opt.step()
    # no more collectives: the NaN flags rode in the last bucket's dense group
    assert comm.started[4:] == []
    assert opt.last_stats.sent == "min" and opt.last_stats.sparse_layers == 2


def test_without_a_dense_layer_in_the_last_bucket_the_flags_go_after_every_bucket():
    comm = _RecordingComm()
    model, opt = _make(CONTROLLERS["static"], overlap=True, comm=comm, bucket_cap_mb=0.01,
                       min_compress_numel=1)
    x, y = _batch(0)
    F.cross_entropy(model(x), y).backward()
    assert all(name.startswith("gravac.sparse.") for name in comm.started)
    n = len(comm.started)
    opt.step()
    assert comm.started[n:] == ["gravac.finite"]


def test_buckets_wait_for_their_predecessors_whatever_order_backward_runs_in():
    """fc1 is used last in forward, so backward produces its gradient first; its bucket
    (the last one: buckets follow the parameters' reverse order) must still leave last."""
    class Swapped(_Net):
        def forward(self, x):
            h = self.norm(torch.relu(self.fc2(torch.relu(x @ torch.ones(32, 96) / 32))))
            return self.out(h) + self.fc1(x)[:, :10]

    comm = _RecordingComm()
    torch.manual_seed(0)
    model = Swapped()
    opt = wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                         comm, controller=Static(cf=10), overlap=True, bucket_cap_mb=0.01)
    x, y = _batch(0)
    F.cross_entropy(model(x), y).backward()
    assert comm.started == ["gravac.sparse.b0", "gravac.dense.b0",
                            "gravac.sparse.b1", "gravac.dense.b1"]
    opt.step()


def test_gravac_paper_rule_overlaps_dense_layers_and_sends_compressed_ones_after_the_gains():
    comm = _RecordingComm()
    ctrl = lambda: GraVAC(theta_min=4, theta_max=64, window=100, epsilon=0.5, alpha=1.0)
    model, opt = _make(ctrl, overlap=True, comm=comm, bucket_cap_mb=0.01)
    x, y = _batch(0)
    F.cross_entropy(model(x), y).backward()
    assert comm.started == ["gravac.dense.b0", "gravac.dense.b1"]   # the small layers
    opt.step()
    assert comm.started[2:] == ["gravac.gains", "gravac.sparse.held"]
    plain_model, plain = _make(ctrl, overlap=False)
    over_model, over = _make(ctrl, overlap=True, bucket_cap_mb=0.01)
    assert _train(plain_model, plain, 12) == _train(over_model, over, 12)
    _assert_same(plain_model, over_model)


@pytest.mark.parametrize("overlap", [True, False])
def test_decide_previous_sends_what_the_gains_up_to_the_previous_step_chose(overlap):
    ctrl = GraVAC(theta_min=4, theta_max=64, window=4, epsilon=0.5, alpha=1.0,
                  decide="previous")
    model, opt = _make(lambda: ctrl, overlap=overlap)
    sent = []
    for step in range(12):
        # The plan announces the level from the state before this step's gains.
        planned_c = ctrl.plan(step).theta_c is not None
        if planned_c and ctrl.delta_c is not None and ctrl.delta_c >= 0.5:
            expected = "candidate"
        elif ctrl.delta_min is not None and ctrl.delta_min >= 0.5:
            expected = "min"
        else:
            expected = "dense"           # also the first step: nothing measured yet
        opt.zero_grad()
        x, y = _batch(step)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        sent.append(opt.last_stats.sent)
        assert opt.last_stats.sent == expected, step
        # This step's gains still moved the averages (alpha=1: they are the gains).
        assert ctrl.delta_min == pytest.approx(opt.last_stats.gain_min)
    assert sent[0] == "dense" and set(sent[1:]) <= {"candidate", "min"}


def test_accumulated_backward_passes_send_once_and_equal_the_plain_step():
    comm = _RecordingComm()
    model, opt = _make(CONTROLLERS["static"], overlap=True, comm=comm,
                       backward_passes_per_step=2)
    x, y = _batch(0)
    F.cross_entropy(model(x), y).backward()
    assert comm.started == []                      # the first pass only accumulates
    F.cross_entropy(model(x), y).backward()
    assert comm.started == ["gravac.sparse.b0", "gravac.dense.b0"]
    opt.step()
    with pytest.raises(RuntimeError, match="computed 3 times before step.*backward_passes_per_step=2"):
        for _ in range(3):
            F.cross_entropy(model(x), y).backward()
    plain_model, plain = _make(CONTROLLERS["static"], overlap=False)
    over_model, over = _make(CONTROLLERS["static"], overlap=True, backward_passes_per_step=2)
    _train(plain_model, plain, 6, passes=2)
    _train(over_model, over, 6, passes=2)
    _assert_same(plain_model, over_model)


def test_a_nan_step_is_skipped_and_leaves_residuals_and_parameters_alone():
    for kind in ("static", "gravac-previous", "accordion"):
        plain_model, plain = _make(CONTROLLERS[kind], overlap=False)
        over_model, over = _make(CONTROLLERS[kind], overlap=True, bucket_cap_mb=0.01)
        poison = lambda step: step in (3, 4)
        assert _train(plain_model, plain, 9, poison) == _train(over_model, over, 9, poison)
        assert [s["step"] for s in over.skipped_steps] == [3, 4]
        _assert_same(plain_model, over_model)
        for name in plain.memory.names():
            assert torch.equal(plain.memory[name], over.memory[name]), (kind, name)


def test_layers_without_a_gradient_are_sent_as_zeros_at_step():
    comm = _RecordingComm()
    model, opt = _make(CONTROLLERS["static"], overlap=True, comm=comm, bucket_cap_mb=0.01)
    x, y = _batch(0)
    F.cross_entropy(model.out(torch.relu(x @ torch.ones(32, 96))), y).backward()
    # fc1, fc2 and norm have no gradient: bucket 0 (norm, out, fc2) cannot leave yet.
    assert comm.started == []
    opt.step()
    assert comm.started == ["gravac.sparse.b0", "gravac.dense.b0", "gravac.sparse.b1",
                            "gravac.dense.b1"]
    assert torch.equal(model.fc1.weight.grad, torch.zeros_like(model.fc1.weight))


def test_skip_synchronize_after_synchronize_clips_and_steps():
    plain_model, plain = _make(CONTROLLERS["static"], overlap=False)
    over_model, over = _make(CONTROLLERS["static"], overlap=True)
    for model, opt in ((plain_model, plain), (over_model, over)):
        for step in range(4):
            opt.zero_grad()
            x, y = _batch(step)
            F.cross_entropy(model(x), y).backward()
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            with opt.skip_synchronize():
                opt.step()
    _assert_same(plain_model, over_model)
    over_model.zero_grad()
    x, y = _batch(9)
    F.cross_entropy(over_model(x), y).backward()
    with pytest.raises(RuntimeError, match="call synchronize\\(\\) before step\\(\\)"):
        with over.skip_synchronize():
            over.step()


def test_bad_options_are_refused_with_the_field_named():
    with pytest.raises(ValueError, match="bucket_cap_mb=0: must be a number > 0"):
        _make(CONTROLLERS["static"], overlap=True, bucket_cap_mb=0)
    with pytest.raises(ValueError, match="backward_passes_per_step=0: must be an int >= 1"):
        _make(CONTROLLERS["static"], overlap=True, backward_passes_per_step=0)
    with pytest.raises(ValueError, match="bucket_cap_mb=4.*takes effect with overlap=true only"):
        _make(CONTROLLERS["static"], overlap=False, bucket_cap_mb=4)
    with pytest.raises(ValueError, match="overlap='yes': must be true or false"):
        _make(CONTROLLERS["static"], overlap="yes")
    torch.manual_seed(0)
    model = _Net()
    with pytest.raises(ValueError, match="PowerSGD's rounds"):
        wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                       LocalComm(), compressor="powersgd", controller=Static(rank=2),
                       overlap=True)
    with pytest.raises(ValueError, match="decide must be one of"):
        GraVAC(decide="next")


def test_the_set_up_agreement_covers_the_buckets():
    _, opt = _make(CONTROLLERS["static"], overlap=True, bucket_cap_mb=4)
    assert opt.describe_setup()["overlap"] == {"bucket_cap_mb": 4.0,
                                               "backward_passes_per_step": 1}
    _, plain = _make(CONTROLLERS["static"], overlap=False)
    assert plain.describe_setup()["overlap"] is None
    assert GraVAC(decide="previous").describe()["decide"] == "previous"


def test_overlapped_time_outside_hooks_is_compute():
    model, opt = _make(CONTROLLERS["static"], overlap=True, bucket_cap_mb=0.01)
    _train(model, opt, 3)
    s = opt.last_stats
    assert s.t_compute is not None and s.t_compute >= 0
    assert s.t_select > 0 and s.t_pack > 0 and math.isfinite(s.t_compress)


def test_a_decided_dense_step_discards_the_selection_not_the_wait_behind_the_buckets():
    """The gains allreduce of an overlapped step waits behind the buckets in flight (on a
    slow link, the whole dense exchange); a dense step needs that wait anyway, so only the
    selection and the norms are discarded from the controller's t_iter. Counting the wait
    (as the plain step may: its gains go before the exchange) made dense look 5x faster
    in the LSTM benchmark and settled E3 on dense."""
    import time

    class LateGains(LocalComm):
        def allreduce_async(self, tensor, op, name):
            handle = super().allreduce_async(tensor, op, name)

            class Late:
                def wait(self):
                    time.sleep(0.05)
                    return handle.wait()
            return Late()

    ctrl = lambda: GraVAC(theta_min=4, theta_max=64, window=100, epsilon=0.5, decide="previous")
    model, opt = _make(ctrl, overlap=True, comm=LateGains())
    _train(model, opt, 1)                     # step 0: nothing measured yet, sent dense
    s = opt.last_stats
    assert s.sent == "dense" and s.t_wait_gains >= 0.05
    assert s.t_discarded == pytest.approx(s.t_select + s.t_norms)


@pytest.mark.parametrize("compressor", ["dgc", "redsync", "randomk"])
def test_sampling_compressors_give_the_same_picks_in_backward_order(compressor):
    """Threshold samples are seeded per call (step, layer, level, rank), not by a running
    generator: compressing the layers in backward's order picks what forward's order
    picks (DGC's and RedSync's counts follow their samples; Top-k's picks among tied
    magnitudes did, which made an overlapped LSTM run drift at step 28)."""
    plain_model, plain = _make(CONTROLLERS["static"], overlap=False, compressor=compressor)
    over_model, over = _make(CONTROLLERS["static"], overlap=True, bucket_cap_mb=0.01,
                             compressor=compressor)
    _train(plain_model, plain, 8)
    _train(over_model, over, 8)
    _assert_same(plain_model, over_model)


def test_an_elastic_reset_mid_step_forgets_the_half_done_step():
    """A worker failing inside backward (a collective raises in a hook) leaves a step
    begun; reset_world (Horovod Elastic's restore) must start the next one clean."""
    model, opt = _make(CONTROLLERS["static"], overlap=True, bucket_cap_mb=0.01)
    x, y = _batch(0)
    F.cross_entropy(model(x), y).backward()
    assert opt._engine.active
    opt.reset_world(LocalComm())
    assert not opt._engine.active
    _train(model, opt, 2)                       # counts restart: no "computed twice"
    assert opt.last_stats.sent == "min"


def test_wrapping_a_model_twice_needs_the_first_hooks_removed():
    model, opt = _make(CONTROLLERS["static"], overlap=True)
    with pytest.raises(ValueError, match="already has the backward hooks.*remove_hooks"):
        wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                       LocalComm(), controller=Static(cf=10), overlap=True)
    opt.remove_hooks()
    comm = _RecordingComm()
    again = wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                           model.named_parameters(), comm, controller=Static(cf=10),
                           overlap=True)
    x, y = _batch(0)
    F.cross_entropy(model(x), y).backward()
    assert comm.started and opt._engine.hooks is None     # only the new one's hooks ran
    again.step()
    again.remove_hooks()
    _train(model, opt, 1)                                   # the old one, now plain
    assert opt.last_stats.sent == "min"
