"""What a model or a training script may do beside gravac's optimizer, on both transports:
each works, and the ranks always hold the same model (test_parameters.py has unused
branches, half-precision parameters and tiny layers).

Freezing and unfreezing layers mid-training, tied weights, sparse embedding gradients
handed back sparse, two optimizers (a GAN), Horovod's ``op``,
``gradient_predivide_factor`` and ``backward_passes_per_step``, checked against a dense
reference computed here (an allreduce of the gradients) where the math is the same.
"""
import pytest
import torch
import torch.nn.functional as F

from gravac.controllers import GraVAC, Static

from helpers import BACKEND, COMM, barrier, distributed_optimizer, gather_rows, make_net, rank_batch


def _same_on_every_rank(model, name) -> bool:
    flat = torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])
    rows = gather_rows(flat, name)
    return all(torch.equal(rows[0], r) for r in rows[1:])


def _dense_average(grads, name):
    """The reference: each gradient summed over ranks and divided, by the transport
    (not by gravac's step)."""
    flat = torch.cat([g.reshape(-1) for g in grads]).double()
    return COMM.allreduce(flat, op="sum", name=name) / COMM.size


def _step(model, opt, step):
    opt.zero_grad()
    x, y = rank_batch(step, COMM.rank)
    F.cross_entropy(model(x), y).backward()
    opt.step()


@pytest.mark.parametrize("controller", [Static(cf=10), GraVAC(theta_min=4, theta_max=64,
                                                                 window=2)],
                         ids=["static", "gravac"])
def test_a_layer_frozen_mid_training_stays_put_and_trains_again_when_unfrozen(controller):
    model = make_net(0)
    opt = distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9,
                                                weight_decay=1e-3),
                                model.named_parameters(), controller=controller)
    for step in range(3):
        _step(model, opt, step)
    model.fc1.requires_grad_(False)
    frozen = model.fc1.weight.detach().clone()
    residual = opt.memory["fc1.weight"].clone()
    others = model.fc2.weight.detach().clone()
    for step in range(3, 7):
        _step(model, opt, step)
    # Not moved by its residual, momentum or weight decay: no gradient reached it.
    assert torch.equal(model.fc1.weight, frozen) and model.fc1.weight.grad is None
    assert torch.equal(opt.memory["fc1.weight"], residual), "the residual waits, unsent"
    assert not torch.equal(model.fc2.weight, others), "the rest trains on"
    model.fc1.requires_grad_(True)
    for step in range(7, 9):
        _step(model, opt, step)
    assert not torch.equal(model.fc1.weight, frozen)
    assert _same_on_every_rank(model, f"frozen.{controller!r}")


def test_a_parameter_frozen_when_the_optimizer_was_built_cannot_be_unfrozen_silently():
    model = make_net(0)
    model.fc1.requires_grad_(False)      # a frozen backbone: never sent
    opt = distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                model.named_parameters(), controller=Static(cf=10))
    assert "fc1.weight" not in opt.layer_names
    _step(model, opt, 0)
    model.fc1.requires_grad_(True)
    with pytest.raises(RuntimeError, match="frozen .* when gravac's optimizer was built"):
        _step(model, opt, 1)
    barrier("frozen_at_build")


def test_tied_weights_are_one_parameter_and_average_like_the_dense_reference():
    class TiedLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.embed = torch.nn.Embedding(200, 32)
            self.mix = torch.nn.Linear(32, 32)
            self.out = torch.nn.Linear(32, 200)
            self.out.weight = self.embed.weight          # tied: one parameter, two uses

        def forward(self, tokens):
            return self.out(torch.tanh(self.mix(self.embed(tokens))))

    model = TiedLM()
    opt = distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                model.named_parameters(), compressor="none")
    assert opt.layer_names.count("embed.weight") == 1 and "out.weight" not in opt.layer_names
    g = torch.Generator().manual_seed(COMM.rank)
    tokens = torch.randint(0, 200, (8, 6), generator=g)
    opt.zero_grad()
    F.cross_entropy(model(tokens[:, :-1]).reshape(-1, 200), tokens[:, 1:].reshape(-1)).backward()
    expected = _dense_average([p.grad for p in model.parameters()], "tied.ref")
    opt.synchronize()
    got = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double()
    assert torch.allclose(got, expected, rtol=1e-6, atol=1e-9)
    with opt.skip_synchronize():
        opt.step()
    assert _same_on_every_rank(model, "tied.params")


class _Bag(torch.nn.Module):
    def __init__(self, sparse):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(500, 16, sparse=sparse)
        self.head = torch.nn.Linear(16, 10)

    def forward(self, tokens):
        return self.head(self.embed(tokens).mean(1))


def _bag_step(model, opt, step):
    g = torch.Generator().manual_seed(100 * step + COMM.rank)
    tokens = torch.randint(0, 500, (8, 5), generator=g)
    opt.zero_grad()
    F.cross_entropy(model(tokens), torch.randint(0, 10, (8,), generator=g)).backward()
    opt.step()


def test_sparse_embedding_gradients_average_as_dense_ones_and_reach_the_optimizer_sparse():
    runs = {}
    for sparse in (True, False):
        model = _Bag(sparse)
        opt = distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                    model.named_parameters(), compressor="none")
        for step in range(3):
            _bag_step(model, opt, step)
            assert model.embed.weight.grad.is_sparse == sparse
        runs[sparse] = model
    for p_sparse, p_dense in zip(runs[True].parameters(), runs[False].parameters()):
        assert torch.allclose(p_sparse, p_dense, rtol=1e-6, atol=1e-7)
    # An optimizer that takes sparse gradients only, with Top-k on the embedding.
    model = _Bag(True)
    opt = distributed_optimizer(torch.optim.SparseAdam(list(model.embed.parameters()), lr=0.01),
                                model.embed.named_parameters(), controller=Static(cf=10))
    before = model.embed.weight.detach().clone()
    for step in range(3):
        _bag_step(model, opt, step)
    assert not torch.equal(model.embed.weight, before)
    assert _same_on_every_rank(model.embed, "sparse.adam")


def test_two_optimizers_of_a_gan_step_in_turn():
    torch.manual_seed(0)
    gen = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
    disc = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt_g = distributed_optimizer(torch.optim.Adam(gen.parameters(), lr=1e-3),
                                  gen.named_parameters(), controller=GraVAC(
                                      theta_min=4, theta_max=64, window=2), name_prefix="gen")
    opt_d = distributed_optimizer(torch.optim.Adam(disc.parameters(), lr=1e-3),
                                  disc.named_parameters(), controller=Static(cf=10),
                                  name_prefix="disc")
    bce = torch.nn.BCEWithLogitsLoss()
    for step in range(6):
        g = torch.Generator().manual_seed(100 * step + COMM.rank)
        real, noise = torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)
        opt_d.zero_grad()
        fake = gen(noise)
        loss_d = bce(disc(real), torch.ones(16, 1)) + bce(disc(fake.detach()), torch.zeros(16, 1))
        loss_d.backward()
        opt_d.step()
        opt_g.zero_grad()
        bce(disc(fake), torch.ones(16, 1)).backward()     # reaches disc's grads too
        opt_g.step()
    assert opt_g.step_count == opt_d.step_count == 6
    assert _same_on_every_rank(gen, "gan.gen") and _same_on_every_rank(disc, "gan.disc")


def test_op_sum_and_the_predivide_factor_match_the_dense_reference():
    model = make_net(0)
    opt = distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                model.named_parameters(), compressor="none", op="sum")
    opt.zero_grad()
    x, y = rank_batch(0, COMM.rank)
    F.cross_entropy(model(x), y).backward()
    expected = _dense_average([p.grad for p in model.parameters()], "sum.ref") * COMM.size
    opt.synchronize()
    got = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double()
    assert torch.allclose(got, expected, rtol=1e-6, atol=1e-8)
    with opt.skip_synchronize():
        opt.step()
    # fp16 on the wire: 40000 and 80000 sum past fp16's 65504; divided by 4 first they
    # do not (Horovod's reason for the factor), and the average comes back exact.
    layer = torch.nn.Linear(4, 4, bias=False)
    opt = distributed_optimizer(torch.optim.SGD(layer.parameters(), lr=0.0),
                                layer.named_parameters(), compressor="none", dense_wire="fp16",
                                gradient_predivide_factor=4.0)
    layer.weight.grad = torch.full((4, 4), 40000.0 * (COMM.rank + 1))
    opt.step()
    average = 40000.0 * sum(r + 1 for r in range(COMM.size)) / COMM.size
    assert torch.equal(layer.weight.grad, torch.full((4, 4), average))


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
def test_backward_passes_per_step_accumulates_as_horovod(overlap):
    model = make_net(0)
    opt = distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                model.named_parameters(), compressor="none",
                                backward_passes_per_step=2, overlap=overlap)
    opt.zero_grad()
    for p in range(2):
        x, y = rank_batch(p, COMM.rank)
        F.cross_entropy(model(x), y).backward()
    local = [p.grad.clone() for p in model.parameters()]
    expected = _dense_average(local, f"bpps.ref.{overlap}")
    opt.synchronize()
    got = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double()
    assert torch.allclose(got, expected, rtol=1e-6, atol=1e-9)
    with opt.skip_synchronize():
        opt.step()
    opt.set_backward_passes_per_step(1)
    _step(model, opt, 5)
    assert opt.backward_passes_per_step == 1
    assert _same_on_every_rank(model, f"bpps.{overlap}")


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
def test_a_compiled_model_trains_as_its_eager_twin(overlap):
    # aot_eager: torch.compile's autograd path (AOTAutograd) without a C++ compiler's time.
    eager, compiled = make_net(0), torch.compile(make_net(0), backend="aot_eager")
    opts = [distributed_optimizer(torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9),
                                  m.named_parameters(), controller=Static(cf=10),
                                  overlap=overlap, name_prefix=f"twin{i}")
            for i, m in enumerate((eager, compiled))]
    assert opts[0].layer_names == opts[1].layer_names
    for step in range(3):
        for model, opt in zip((eager, compiled), opts):
            _step(model, opt, step)
    for a, b in zip(eager.parameters(), compiled.parameters()):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    assert _same_on_every_rank(compiled, f"compiled.{overlap}")
