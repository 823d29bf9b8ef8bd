"""gravac as a DDP communication hook (gravac/torch/hooks.py), on 2 ranks under torchrun:
the same parameters as ``gravac.torch.DistributedOptimizer`` bit for bit where the math is
the same (static Top-k, PowerSGD, GraVAC deciding from gains alone, unused parameters,
accumulation with ``no_sync``), decisions identical on every rank where they come from
timings (GraVAC's windows, Auto), a NaN on one rank seen by every rank, and an exact
resume from ``state_dict`` and from a pickled state."""
import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import gravac.torch
from gravac.controllers import Accordion, Auto, GraVAC, Static

from helpers import BACKEND, COMM, barrier, gather_rows, make_net, rank_batch

pytestmark = pytest.mark.skipif(BACKEND != "torch", reason="DDP runs on torch.distributed only")

#: A bucket cap of a few KiB: DDP cuts Net into several buckets, so that several leave
#: from backward (and after the first step DDP rebuilds them in gradient order).
SMALL_BUCKETS_MB = 0.01


def _flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _with_hook(model, ddp_kwargs=None, **state_kwargs):
    from gravac.torch.hooks import GravacHookState, gravac_hook

    ddp = DistributedDataParallel(model, bucket_cap_mb=SMALL_BUCKETS_MB, **(ddp_kwargs or {}))
    state = GravacHookState(model, **state_kwargs)
    ddp.register_comm_hook(state, gravac_hook)
    return ddp, state


def _train_hook(steps, controller, compressor="topk", ddp_kwargs=None, batch=rank_batch,
                **options):
    model = make_net(0)
    ddp, state = _with_hook(model, ddp_kwargs, compressor=compressor, controller=controller,
                            **options)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    records = []
    for step in range(steps):
        opt.zero_grad()
        x, y = batch(step, COMM.rank)
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
        records.append(state.last_stats)
    return model, state, records


def _train_optimizer(steps, controller, compressor="topk", batch=rank_batch, **options):
    model = make_net(0)
    opt = gravac.torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), model.named_parameters(),
        compressor=compressor, controller=controller, **options)
    records = []
    for step in range(steps):
        opt.zero_grad()
        x, y = batch(step, COMM.rank)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        records.append(opt.last_stats)
    return model, records


@pytest.mark.parametrize("as_view", [False, True], ids=["copied", "bucket_view"])
def test_static_topk_equals_the_optimizer_bit_for_bit(as_view):
    hooked, state, records = _train_hook(6, Static(cf=10),
                                         ddp_kwargs={"gradient_as_bucket_view": as_view})
    reference, _ = _train_optimizer(6, Static(cf=10))
    assert [r.sent for r in records] == ["min"] * 6
    assert state.step_count == 6
    assert torch.equal(_flat(hooked), _flat(reference))
    both = gather_rows(_flat(hooked), f"hook.static.{as_view}")
    assert torch.equal(both[0], both[1])


def test_powersgd_equals_the_optimizer_bit_for_bit():
    # PowerSGD's exchange does not overlap: DDP's buckets wait for the last one.
    hooked, _, records = _train_hook(5, Static(rank=2), compressor="powersgd")
    reference, _ = _train_optimizer(5, Static(rank=2), compressor="powersgd")
    assert torch.equal(_flat(hooked), _flat(reference))


@pytest.mark.parametrize("decide", ["current", "previous"])
def test_gravac_deciding_from_gains_equals_the_optimizer(decide):
    # A window longer than the run: every decision comes from the agreed gains alone
    # (no timing), so both paths decide alike and give the same parameters.
    ctrl = lambda: GraVAC(theta_min=4, theta_max=64, epsilon=0.5, window=1000, decide=decide)
    hooked, _, records = _train_hook(8, ctrl())
    reference, ref_records = _train_optimizer(8, ctrl())
    assert [r.sent for r in records] == [r.sent for r in ref_records]
    assert torch.equal(_flat(hooked), _flat(reference))


def test_accordion_equals_the_optimizer():
    # Accordion observes each rank's gradients (rank 0 decides): through DDP's buckets it
    # sees them bucket by bucket, the optimizer all at once; the same decisions follow.
    ctrl = lambda: Accordion(low_cf=4, high_cf=32, interval_steps=2, switch_freq=1)
    hooked, _, records = _train_hook(8, ctrl())
    reference, ref_records = _train_optimizer(8, ctrl())
    assert [r.layer_cf for r in records] == [r.layer_cf for r in ref_records]
    assert len({tuple(sorted((r.layer_cf or {}).items())) for r in records}) > 1, "it switched"
    assert torch.equal(_flat(hooked), _flat(reference))


def test_gravac_windows_decide_alike_on_every_rank():
    # Short windows: the CFs move on rank 0's timings, broadcast from the last hook.
    _, state, records = _train_hook(12, GraVAC(theta_min=2, theta_max=64, epsilon=0.3,
                                               window=2, decide="previous"))
    seen = [(r.sent, r.theta_min, r.theta_c) for r in records]
    every = COMM.allgather_object(seen, name="hook.gravac.windows")
    assert every[0] == every[1]
    assert len({r.theta_c for r in records}) > 1, "the ladder moved"
    both = gather_rows(_flat(state.model), "hook.gravac.params")
    assert torch.equal(both[0], both[1])


def test_auto_runs_the_same_methods_on_every_rank():
    ctrl = Auto(methods=["dense", "powersgd:2", "sparse:10"], trial_steps=2, settle_steps=1,
                recheck_every=6)
    _, state, records = _train_hook(16, ctrl)
    methods = [r.method for r in records]
    every = COMM.allgather_object(methods, name="hook.auto.methods")
    assert every[0] == every[1]
    assert {"dense", "sparse:10"} <= set(methods) and any(m.startswith("powersgd") for m in methods)
    both = gather_rows(_flat(state.model), "hook.auto.params")
    assert torch.equal(both[0], both[1])


class _Branchy(torch.nn.Module):
    """``side`` is used on rank 0 only; ``never`` is never used."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Linear(32, 64)
        self.side = torch.nn.Linear(64, 64)
        self.never = torch.nn.Linear(64, 64)
        self.out = torch.nn.Linear(64, 10)
        self.use_side = False

    def forward(self, x):
        h = torch.relu(self.body(x))
        if self.use_side:
            h = h + self.side(h)
        return self.out(h)


def test_find_unused_parameters_equals_the_optimizer():
    def run(hook):
        model = _Branchy()
        if hook:
            forward, state = _with_hook(model, {"find_unused_parameters": True},
                                        controller=Static(cf=8))
            opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        else:
            forward = model
            opt = gravac.torch.DistributedOptimizer(
                torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                model.named_parameters(), controller=Static(cf=8))
        for step in range(6):
            model.use_side = COMM.rank == 0
            opt.zero_grad()
            x, y = rank_batch(step, COMM.rank)
            F.cross_entropy(forward(x), y).backward()
            opt.step()
        return model

    hooked, reference = run(True), run(False)
    assert torch.equal(_flat(hooked), _flat(reference))
    assert hooked.never.weight.grad is None, "a parameter no rank used keeps no gradient"
    both = gather_rows(_flat(hooked), "hook.unused")
    assert torch.equal(both[0], both[1])


def test_no_sync_accumulation_equals_the_optimizer():
    micro = lambda step, rank: rank_batch(step, rank, batch=8)

    model = make_net(0)
    ddp, state = _with_hook(model, controller=Static(cf=10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ref_model = make_net(0)
    ref = gravac.torch.DistributedOptimizer(torch.optim.SGD(ref_model.parameters(), lr=0.05),
                                            ref_model.named_parameters(),
                                            controller=Static(cf=10))
    for step in range(4):
        opt.zero_grad()
        ref.zero_grad()
        with ddp.no_sync():
            x, y = micro(2 * step, COMM.rank)
            F.cross_entropy(ddp(x), y).backward()
        x, y = micro(2 * step + 1, COMM.rank)
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
        for half in (0, 1):
            x, y = micro(2 * step + half, COMM.rank)
            F.cross_entropy(ref_model(x), y).backward()
        ref.step()
    assert state.step_count == 4
    assert torch.equal(_flat(model), _flat(ref_model))


def _nan_on_rank1_at_step2(step, rank):
    x, y = rank_batch(step, rank)
    if step == 2 and rank == 1:
        x[0, 0] = float("nan")
    return x, y


def test_a_nan_on_one_rank_reaches_every_rank_and_the_residuals_roll_back():
    model = make_net(0)
    ddp, state = _with_hook(model, controller=Static(cf=10))
    seen = []
    for step in range(4):
        model.zero_grad()
        before = {n: state.memory[n].clone() for n in state.memory.names()} if step else {}
        x, y = _nan_on_rank1_at_step2(step, COMM.rank)
        F.cross_entropy(ddp(x), y).backward()
        finite = all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())
        if step == 2:
            rolled_back = all(torch.equal(state.memory[n], t) for n, t in before.items())
            seen.append((state.last_stats.sent, finite, rolled_back))
        else:
            seen.append((state.last_stats.sent, finite))
    every = COMM.allgather_object(seen, name="hook.nan")
    assert every[0] == every[1]
    assert seen[2] == ("skipped", False, True)
    assert seen[3] == ("min", True)


def test_grad_scaler_skips_the_nan_step_on_every_rank():
    model = make_net(0)
    ddp, state = _with_hook(model, controller=Static(cf=10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scales = []
    for step in range(4):
        opt.zero_grad()
        x, y = _nan_on_rank1_at_step2(step, COMM.rank)
        scaler.scale(F.cross_entropy(ddp(x), y)).backward()
        before = _flat(model).clone()
        scaler.step(opt)
        scaler.update()
        scales.append((scaler.get_scale(), torch.equal(before, _flat(model))))
    every = COMM.allgather_object(scales, name="hook.scaler")
    assert every[0] == every[1]
    assert [s for s, _ in scales] == [1024.0, 1024.0, 512.0, 512.0]
    assert [unchanged for _, unchanged in scales] == [False, False, True, False]
    both = gather_rows(_flat(model), "hook.scaler.params")
    assert torch.equal(both[0], both[1])


def test_nonfinite_raise_raises_on_every_rank():
    model = make_net(0)
    ddp, _ = _with_hook(model, controller=Static(cf=10), nonfinite="raise")
    x, y = _nan_on_rank1_at_step2(2, COMM.rank)
    with pytest.raises(FloatingPointError, match="rank\\(s\\) 1"):
        F.cross_entropy(ddp(x), y).backward()
    barrier("hook.raise")


def test_resume_from_state_dict_and_from_pickle_is_exact():
    ctrl = lambda: GraVAC(theta_min=4, theta_max=64, epsilon=0.5, window=1000)

    def run(state_from=None, start=0, steps=3):
        model = make_net(0)
        ddp, state = _with_hook(model, controller=ctrl())
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        if state_from is not None:
            # (torch's optimizer keeps the loaded tensors: each run gets its own copy.)
            state_from = copy.deepcopy(state_from)
            model.load_state_dict(state_from["model"])
            opt.load_state_dict(state_from["opt"])
            state_from["hook"](state)
        for step in range(start, start + steps):
            opt.zero_grad()
            x, y = rank_batch(step, COMM.rank)
            F.cross_entropy(ddp(x), y).backward()
            opt.step()
        return model, opt, state

    model, opt, state = run()
    saved = {"model": copy.deepcopy(model.state_dict()), "opt": copy.deepcopy(opt.state_dict())}
    hook_state = copy.deepcopy(state.state_dict())
    pickled = pickle.dumps(state)
    straight, _, _ = run(None, 0, 6)
    from_dict, _, resumed = run({**saved, "hook": lambda s: s.load_state_dict(hook_state)}, 3)
    restored = pickle.loads(pickled)
    from_pickle, _, _ = run({**saved, "hook": lambda s: s.load_state_dict(restored.state_dict())},
                            3)
    assert resumed.step_count == 6
    assert torch.equal(_flat(from_dict), _flat(straight))
    assert torch.equal(_flat(from_pickle), _flat(straight))


def test_parameters_ddp_ignores_are_left_alone():
    from gravac.torch.hooks import GravacHookState, gravac_hook

    model = make_net(0)
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, ["norm.weight"])
    ddp = DistributedDataParallel(model, bucket_cap_mb=SMALL_BUCKETS_MB)
    state = GravacHookState(ddp, controller=Static(cf=10))     # the DDP model: its ignores
    ddp.register_comm_hook(state, gravac_hook)
    x, y = rank_batch(0, COMM.rank)
    F.cross_entropy(ddp(x), y).backward()
    assert "norm.weight" not in [l.name for l in state.engine.layers]
    local = gather_rows(model.norm.weight.grad, "hook.ignored.local")
    averaged = gather_rows(model.fc2.weight.grad, "hook.ignored.averaged")
    assert not torch.equal(local[0], local[1]), "an ignored parameter keeps its own gradient"
    assert torch.equal(averaged[0], averaged[1])


def test_options_ddp_owns_are_refused_in_one_line():
    from gravac.torch.hooks import GravacHookState

    with pytest.raises(ValueError, match="overlap=True: not an option of the DDP hook"):
        GravacHookState(make_net(0), overlap=True)
    with pytest.raises(ValueError, match="exchange='ring'"):
        GravacHookState(make_net(0), exchange="ring")
    # Checked when built (before: accepted, then an AttributeError deep in the first backward).
    model = make_net(0)
    with pytest.raises(ValueError, match="optimizer must be the torch.optim.Optimizer that "
                                         "steps the model \\(or None\\), got Net"):
        GravacHookState(model, optimizer=model)
    with pytest.raises(ValueError, match="process_group must be a torch.distributed "
                                         "ProcessGroup \\(or None: the default group\\), got str"):
        GravacHookState(model, process_group="world")
    # An optimizer's whole state dict names where the hook's state is.
    with pytest.raises(ValueError, match="this is an optimizer's state dict"):
        GravacHookState(model).load_state_dict({"state": {}, "param_groups": [], "gravac": {}})


def test_a_state_built_on_another_model_is_refused_at_the_first_backward():
    model = make_net(0)
    from gravac.torch.hooks import GravacHookState, gravac_hook

    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(GravacHookState(make_net(1), controller=Static(cf=10)), gravac_hook)
    x, y = rank_batch(0, COMM.rank)
    with pytest.raises(ValueError, match="does not have: build GravacHookState on the module"):
        F.cross_entropy(ddp(x), y).backward()
    barrier("hook.other_model")


def test_a_model_with_an_attribute_named_module_is_taken_whole():
    """Only DDP's (or DataParallel's) wrapper is unwrapped: a model of the user's own whose
    backbone is ``self.module`` is the model the state serves, head included."""
    from gravac.torch.hooks import GravacHookState, gravac_hook

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.module = make_net(0)
            self.head = torch.nn.Linear(10, 10)

        def forward(self, x):
            return self.head(self.module(x))

    torch.manual_seed(0)
    model = Wrapped()
    ddp = DistributedDataParallel(model)
    state = GravacHookState(model, controller=Static(cf=10))
    assert state.model is model
    ddp.register_comm_hook(state, gravac_hook)
    assert GravacHookState(ddp).model is model
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(3):
        opt.zero_grad()
        x, y = rank_batch(step, COMM.rank)
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
    rows = gather_rows(_flat(model), "hook.module_attr")
    assert torch.equal(rows[0], rows[1])
