"""gravac.DistributedOptimizer in one process (Horovod size 1): exactness, stats, errors."""
import io

import horovod.torch as hvd
import pytest
import torch

import gravac
from gravac.controllers import Static

hvd.init()


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def _backward(model, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 64, generator=g)
    model(x).pow(2).mean().backward()


def test_single_rank_update_is_own_topk_with_error_feedback():
    model = _model()
    opt = gravac.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      model.named_parameters(), controller=Static(cf=10))
    assert isinstance(opt, torch.optim.SGD)
    residual = torch.zeros(64 * 64)
    for step in range(4):
        opt.zero_grad()
        _backward(model, step)
        g_ef = model[0].weight.grad.view(-1) + residual
        before = model[0].weight.detach().clone()
        bias_grad = model[0].bias.grad.clone()
        opt.step()
        idx = torch.topk(g_ef.abs(), 410).indices
        sent = torch.zeros_like(g_ef)
        sent[idx] = g_ef[idx]
        residual = g_ef - sent
        assert torch.equal(model[0].weight.grad.view(-1), sent)
        assert torch.allclose(model[0].weight, before - 0.1 * sent.view(64, 64))
        assert torch.equal(opt.memory["0.weight"].view(-1), residual)
        assert torch.equal(model[0].bias.grad, bias_grad)            # small: sent dense
        assert "0.bias" not in opt.memory
        stats = opt.last_stats
        assert stats.cf == 10 and stats.sent == "min" and stats.step == step
        # 410 values + 410 indices for the 4096-element layer; the rest dense.
        assert stats.floats_sent == 2 * 410 + 64 + 640 + 10
        assert stats.dense_floats == 4096 + 64 + 640 + 10
        # The phases are consecutive slices of the step: they add up to at most its wall
        # time (t_iter is measured from the previous step's end, so step 0 has none).
        assert stats.t_compress > 0 and stats.t_comm > 0 and stats.t_update > 0
        if step > 0:
            parts = stats.t_compute + stats.t_compress + stats.t_comm + stats.t_update
            assert 0 < parts <= stats.t_iter


def test_cf_one_and_none_compressor_send_everything_dense():
    for kwargs in ({"controller": Static(cf=1)}, {"compressor": "none"}):
        model = _model()
        opt = gravac.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                          model.named_parameters(), **kwargs)
        _backward(model, 0)
        grads = [p.grad.clone() for p in model.parameters()]
        opt.step()
        assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads))
        assert opt.last_stats.cf == 1 and opt.last_stats.floats_sent == opt.last_stats.dense_floats


def test_state_dict_carries_memory_controller_and_step():
    model = _model()
    opt = gravac.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                      model.named_parameters(), controller=Static(cf=100))
    for step in range(3):
        opt.zero_grad()
        _backward(model, step)
        opt.step()
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)     # as a checkpoint would (state_dict() aliases)
    buffer.seek(0)
    state = torch.load(buffer, map_location="cpu")
    model2 = _model()
    model2.load_state_dict(model.state_dict())
    opt2 = gravac.DistributedOptimizer(torch.optim.SGD(model2.parameters(), lr=0.1, momentum=0.9),
                                       model2.named_parameters(), controller=Static(cf=100))
    opt2.load_state_dict(state)
    assert torch.equal(opt2.memory["0.weight"], opt.memory["0.weight"])
    for m, o in ((model, opt), (model2, opt2)):
        o.zero_grad()
        _backward(m, 99)
        o.step()
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, q)
    assert opt2.last_stats.step == 3



def test_gravacs_state_alone_is_refused_naming_where_it_belongs():
    """A GravacHookState's state_dict() (or the optimizer state's "gravac" entry) given to
    the optimizer: torch's KeyError 'param_groups' before; the hook says the reverse."""
    model = _model()
    opt = gravac.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      model.named_parameters(), controller=Static(cf=10))
    _backward(model, 0)
    opt.step()
    with pytest.raises(ValueError, match=r"^this is gravac's state alone .*GravacHookState"):
        opt.load_state_dict(opt.state_dict()["gravac"])

def test_missing_gradient_is_sent_as_zero_and_frozen_is_skipped():
    model = _model()
    model[2].weight.requires_grad_(False)
    opt = gravac.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      model.named_parameters(), controller=Static(cf=10))
    assert "2.weight" not in opt.layer_names
    model[0].weight.sum().backward()   # only layer 0's weight gets a gradient
    opt.step()
    assert torch.equal(model[2].bias.grad, torch.zeros(10))


def test_skip_synchronize_after_manual_synchronize():
    model = _model()
    opt = gravac.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      model.named_parameters(), controller=Static(cf=10))
    _backward(model, 0)
    opt.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
    clipped = model[0].weight.grad.clone()
    with opt.skip_synchronize():
        opt.step()
    assert torch.equal(model[0].weight.grad, clipped)   # not communicated a second time


# -- bad input: each a ValueError saying what to fix -----------------------------------
def _opt(model=None, **kwargs):
    model = model or _model()
    named = kwargs.pop("named", model.named_parameters())
    return gravac.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named, **kwargs)


def test_errors_unknown_compressor_and_bad_cf():
    with pytest.raises(ValueError, match="unknown compressor 'topkk'; known compressors: topk"):
        _opt(compressor="topkk")
    with pytest.raises(ValueError, match=r"cf must be a number >= 1"):
        _opt(controller=Static(cf=0.5))
    with pytest.raises(ValueError, match=r"cf must be a number >= 1"):
        _opt(controller=0)
    with pytest.raises(ValueError, match="controller must be"):
        _opt(controller="fast")
    with pytest.raises(ValueError, match="min_compress_numel"):
        _opt(min_compress_numel=0)
    with pytest.raises(ValueError, match="unknown option"):
        _opt(compressor="topk", compressor_options={"k": 3})


def test_errors_parameter_names():
    model = _model()
    named = list(model.named_parameters())
    with pytest.raises(ValueError, match="unique; duplicated: w"):
        _opt(model, named=[("w", p) for _, p in named])
    with pytest.raises(ValueError, match="have no name in named_parameters"):
        _opt(model, named=named[:2])
    with pytest.raises(ValueError, match="non-empty string name, got None"):
        _opt(model, named=[(None, named[0][1])] + named[1:])
    with pytest.raises(ValueError, match="non-empty string name, got ''"):
        _opt(model, named=[("", named[0][1])] + named[1:])
    with pytest.raises(ValueError, match=r"\(name, parameter\) tuples"):
        _opt(model, named=[p for _, p in named])
    # None names them by position, as Horovod does.
    assert _opt(model, named=None).layer_names == [f"allreduce.noname.0.{j}"
                                                   for j in range(len(named))]


def test_a_subclass_of_the_wrapped_optimizer_steps_without_recursing():
    # The old factory called super(self.__class__, self): a user's subclass recursed forever.
    model = _model()
    opt = gravac.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      model.named_parameters(), controller=Static(cf=10))

    class Counting(type(opt)):
        steps = 0

        def step(self, closure=None):
            Counting.steps += 1
            return super().step(closure)

    opt.__class__ = Counting
    _backward(model, 0)
    opt.step()
    assert Counting.steps == 1 and opt.last_stats.step == 0
    assert isinstance(opt, torch.optim.SGD)


def _one_local_step():
    """(model, optimizer, its state) after one step of Static(cf=10) on the local transport."""
    from gravac.comm import LocalComm
    from gravac.engine import wrap_optimizer

    model = _model()
    opt = wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                         LocalComm(), controller=Static(cf=10))
    _backward(model, 0)
    opt.step()
    return model, opt, opt.state_dict()


def test_resume_moves_residuals_to_the_parameters_dtype_on_the_local_transport():
    from gravac.comm import LocalComm
    from gravac.engine import wrap_optimizer

    _, opt, state = _one_local_step()
    wide = _model().double()
    opt64 = wrap_optimizer(torch.optim.SGD(wide.parameters(), lr=0.1), wide.named_parameters(),
                           LocalComm(), controller=Static(cf=10))
    opt64.load_state_dict(state)
    assert opt64.memory["0.weight"].dtype == torch.float64
    assert torch.equal(opt64.memory["0.weight"], opt.memory["0.weight"].double())
    wide.zero_grad()
    wide(torch.randn(4, 64, dtype=torch.float64)).sum().backward()
    opt64.step()                              # error feedback runs in float64
    assert opt64.memory["0.weight"].dtype == torch.float64


def test_a_controller_or_compressor_serves_one_optimizer_and_wrapping_twice_is_refused():
    from gravac import compressors
    from gravac.comm import LocalComm
    from gravac.controllers import GraVAC
    from gravac.engine import wrap_optimizer

    def wrap(model, **kwargs):
        return wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                              model.named_parameters(), LocalComm(), **kwargs)
    shared = GraVAC(window=3)
    first = wrap(_model(), controller=shared)
    # Before: accepted, and the two optimizers' steps ended GraVAC's windows in turn.
    with pytest.raises(ValueError, match=r"this controller \(.*\) already serves another "
                                         r"gravac optimizer or DDP hook: give each its own"):
        wrap(_model(), controller=shared)
    powersgd = compressors.get("powersgd")
    low_rank = wrap(_model(), compressor=powersgd, controller=Static(rank=2))
    with pytest.raises(ValueError, match="this compressor .* already serves another"):
        wrap(_model(), compressor=powersgd, controller=Static(rank=2))
    with pytest.raises(ValueError, match="optimizer is already a gravac DistributedOptimizer"):
        wrap_optimizer(first, _model().named_parameters(), LocalComm())
    # Its optimizer dropped (still in a reference cycle until collected): free to serve.
    del first, low_rank
    wrap(_model(), controller=shared)


def test_resuming_with_other_parameter_names_is_refused_before_anything_is_loaded():
    from gravac.comm import LocalComm
    from gravac.engine import wrap_optimizer

    _, _, state = _one_local_step()
    other = _model()
    unnamed = wrap_optimizer(torch.optim.SGD(other.parameters(), lr=0.1), None, LocalComm(),
                             controller=Static(cf=10))
    before = {n: unnamed.memory[n].clone() for n in unnamed.memory}
    # Before: loaded as dead entries (and written into every later checkpoint).
    with pytest.raises(ValueError, match=r"the state holds residuals of 1 parameter name\(s\) "
                                         r"this optimizer does not have \('0.weight'"):
        unnamed.load_state_dict(state)
    assert {n: unnamed.memory[n] for n in unnamed.memory}.keys() == before.keys()


def test_horovods_optimizer_is_refused_as_the_one_to_wrap():
    model = _model()
    horovods = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                        model.named_parameters())
    with pytest.raises(ValueError, match="optimizer is a hvd.DistributedOptimizer: pass the "
                                         "torch optimizer it wraps"):
        gravac.DistributedOptimizer(horovods, model.named_parameters())


def test_a_step_after_the_world_changed_under_it_stops_in_one_line():
    """Horovod Elastic re-forms the ranks under a running process: an optimizer not moved to
    them (``reset_world``) stops before its first collective instead of sending collectives
    sized for the old world."""
    from gravac.comm import LocalComm
    from gravac.engine import wrap_optimizer

    class Grown(LocalComm):
        live = 1

        def live_size(self):
            return self.live

    comm = Grown()
    model = _model()
    opt = wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                         comm, controller=Static(cf=10))
    _backward(model, 0)
    opt.step()
    comm.live = 2
    opt.zero_grad()
    _backward(model, 1)
    with pytest.raises(RuntimeError, match=r"the Horovod world changed from 1 to 2 ranks .*"
                                           r"reset_world\(gravac.comm.horovod.HorovodComm\(\)\)"):
        opt.step()
