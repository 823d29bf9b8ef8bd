"""gravac.DistributedOptimizer as a Horovod user calls it (one process, Horovod size 1):
``hvd.DistributedOptimizer``'s signature, ``gravac.hvd.Compression``, torch.compile'd
models, and what is refused in one line."""
import horovod.torch as hvd
import pytest
import torch

import gravac
from gravac.controllers import GraVAC, Static
from gravac.hvd import Compression, GravacCompression

hvd.init()


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def _train(model, opt, steps=4):
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        opt.zero_grad()
        model(torch.randn(16, 64, generator=g)).pow(2).mean().backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_horovods_positional_signature_and_compression_objects_mean_gravacs_methods():
    reference = _model()
    expected = _train(reference, gravac.DistributedOptimizer(
        torch.optim.SGD(reference.parameters(), lr=0.1), reference.named_parameters(),
        controller=Static(cf=10), dense_wire="fp16"))
    model = _model()
    # hvd.DistributedOptimizer's arguments, positionally, in Horovod's order.
    opt = gravac.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      model.named_parameters(), hvd.Compression.fp16, 1,
                                      hvd.Average, 1.0, 0, None, False, hvd.global_process_set,
                                      controller=Static(cf=10))
    assert opt.options.dense_wire == "fp16" and opt.options.op == "average"
    assert torch.equal(_train(model, opt), expected)
    model = _model()
    opt = gravac.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      compression=Compression.topk(cf=10, dense_wire="fp16"))
    assert opt.layer_names[0] == "allreduce.noname.0.0"        # named by position
    assert torch.equal(_train(model, opt), expected)


def test_each_compression_builds_its_own_controller():
    c = Compression.gravac(theta_min=4, theta_max=64, window=2, overlap=True)
    a, b = _model(), _model()
    opt_a = gravac.DistributedOptimizer(torch.optim.SGD(a.parameters(), lr=0.1),
                                        a.named_parameters(), compression=c, name_prefix="a")
    opt_b = gravac.DistributedOptimizer(torch.optim.SGD(b.parameters(), lr=0.1),
                                        b.named_parameters(), compression=c, name_prefix="b")
    assert isinstance(opt_a.controller, GraVAC) and opt_a.controller is not opt_b.controller
    assert opt_a.options.overlap and isinstance(c, hvd.Compression.none.__mro__[1])
    assert Compression.powersgd(rank=2).make_controller().rank == 2


def test_compress_and_decompress_carry_gravacs_sparse_format():
    c = Compression.topk(cf=10)
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(8, 50, generator=g) for _ in range(2)]
    packed = [c.compress(t) for t in grads]
    gathered = torch.cat([buf for buf, _ in packed])            # what hvd.allgather returns
    average = c.decompress(gathered, packed[0][1])
    expected = torch.zeros(400)
    for t in grads:
        idx = torch.topk(t.reshape(-1).abs(), 40).indices
        expected[idx] += t.reshape(-1)[idx] / 2
    assert average.shape == (8, 50) and torch.allclose(average.reshape(-1), expected)
    with pytest.raises(ValueError, match="no one-tensor form"):
        Compression.powersgd().compress(grads[0])


def test_horovods_own_optimizer_refuses_gravacs_compression_in_one_line():
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   compression=Compression.topk(cf=10))
    model(torch.randn(4, 64)).sum().backward()
    # (At size 1 Horovod registers no hooks: step() compresses each gradient itself.)
    with pytest.raises(TypeError, match="would allreduce .* use gravac.DistributedOptimizer"):
        for p in model.parameters():
            opt._allreduce_grad_async(p)


@pytest.mark.parametrize("kwargs, message", [
    (dict(op=hvd.Adasum), r"op=hvd.Adasum: gravac.DistributedOptimizer takes hvd.Average or hvd.Sum"),
    (dict(compression="topk"), "pass compressor='topk'"),
    (dict(compression=object()), "use hvd.Compression.none or .fp16"),
    (dict(compression=Compression.topk(), controller=Static(cf=5)), "drop controller="),
    (dict(compression=hvd.Compression.fp16, dense_wire="native"), "disagree"),
    (dict(op=hvd.Sum, gradient_predivide_factor=2.0), "takes op='average' only"),
    (dict(gradient_predivide_factor=0), "must be a finite number > 0"),
    (dict(gradient_predivide_factor=float("inf")), "gradient_predivide_factor=inf: must be a "
                                                   "finite number > 0"),
    (dict(num_groups=-1), "num_groups=-1"),
    (dict(groups="all"), "groups='all'"),
    (dict(sparse_as_dense="yes"), "sparse_as_dense='yes'"),
    (dict(backward_passes_per_step=0), "backward_passes_per_step=0"),
])
def test_bad_horovod_arguments_are_refused_naming_the_argument(kwargs, message):
    model = _model()
    with pytest.raises(ValueError, match=message):
        gravac.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                    model.named_parameters(), **kwargs)
    with pytest.raises(ValueError, match="Compression.gravac\\(thetamin=...\\)"):
        Compression.gravac(thetamin=3)


def test_groups_and_sparse_as_dense_are_accepted():
    model = _model()
    params = list(model.parameters())
    opt = gravac.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), model.named_parameters(),
                                      groups=[params[:2], params[2:]], sparse_as_dense=True)
    _train(model, opt, steps=1)


def test_a_param_group_added_after_wrapping_is_refused():
    model, extra = _model(), torch.nn.Linear(4, 4)
    opt = gravac.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      model.named_parameters())
    with pytest.raises(ValueError, match="add_param_group: .*build the torch optimizer with "
                                         "every param group"):
        opt.add_param_group({"params": extra.parameters()})


def test_a_compiled_model_and_its_eager_model_share_checkpoints():
    eager = _model()
    compiled = torch.compile(_model(), backend="eager")
    opt_c = gravac.DistributedOptimizer(torch.optim.SGD(compiled.parameters(), lr=0.1),
                                        compiled.named_parameters(), controller=Static(cf=10))
    opt_e = gravac.DistributedOptimizer(torch.optim.SGD(eager.parameters(), lr=0.1),
                                        eager.named_parameters(), controller=Static(cf=10))
    assert opt_c.layer_names == opt_e.layer_names == [n for n, _ in eager.named_parameters()]
    _train(compiled, opt_c, steps=3)
    eager.load_state_dict(compiled._orig_mod.state_dict())
    opt_e.load_state_dict(opt_c.state_dict())          # residuals under the same names
    assert torch.equal(opt_e.memory["0.weight"], opt_c.memory["0.weight"])
    assert torch.equal(_train(eager, opt_e, steps=2), _train(compiled, opt_c, steps=2))


def test_set_backward_passes_per_step_as_horovod():
    model = _model()
    opt = gravac.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      model.named_parameters(), overlap=True)
    opt.set_backward_passes_per_step(2)
    assert opt.backward_passes_per_step == 2
    for _ in range(2):
        model(torch.randn(4, 64)).sum().backward()
    opt.step()
    with pytest.raises(ValueError, match="backward_passes_per_step=0"):
        opt.set_backward_passes_per_step(0)
    assert isinstance(Compression.topk(), GravacCompression)
