"""Patterns of Horovod's documentation and examples with gravac's optimizer, on both
transports: none may hang or leave the ranks training different models.

- ``hvd.broadcast_optimizer_state`` after rank 0 alone loaded a checkpoint (Horovod's
  ``pytorch_imagenet_resnet50.py``): Horovod initialises the empty state with a local
  ``step()`` on the other ranks only; and rank 0 alone going back to a checkpoint mid-run;
- AMP's ``GradScaler`` when one rank overflows: plain ``scaler.step(opt)``, and Horovod's
  advice ``synchronize(); scaler.unscale_(opt); with skip_synchronize(): scaler.step(opt)``;
  a run whose first steps all overflow (the scaler lowers its scale) trains on;
- ``synchronize(); clip_grad_norm_(); with skip_synchronize(): step()`` mixed with plain
  ``step()`` calls.
"""
import pytest
import torch
import torch.nn.functional as F

from gravac.controllers import GraVAC, Static

from helpers import BACKEND, COMM, barrier, distributed_optimizer, gather_rows, make_net, rank_batch


def _flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _spread_is_zero(model, name):
    both = gather_rows(_flat(model), name)
    return torch.equal(both[0], both[1])


def _overflow(model, step, rank, bad):
    """Rank ``bad(step)``'s gradient overflows in one entry of a compressed layer (the
    dense layers, averaged in place, would carry an overflow to every rank by themselves)."""
    if bad(step) == rank:
        model.fc1.weight.grad[0, 0] = float("inf")


@pytest.mark.parametrize("controller", [Static(cf=10), GraVAC(theta_min=4, theta_max=64,
                                                                 window=3)],
                         ids=["static", "gravac"])
@pytest.mark.parametrize("pattern", ["plain", "synchronize_first"])
def test_grad_scaler_with_an_overflow_on_one_rank_keeps_the_ranks_together(pattern, controller):
    model = make_net(0)
    opt = distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                model.named_parameters(), controller=controller)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    # Rank 1 overflows at step 2, rank 0 at step 5; GraVAC's windows (3 steps) broadcast.
    bad = {2: 1, 5: 0}.get
    seen = []
    for step in range(10):
        opt.zero_grad()
        x, y = rank_batch(step, COMM.rank)
        scaler.scale(F.cross_entropy(model(x), y)).backward()
        _overflow(model, step, COMM.rank, bad)
        if pattern == "plain":
            scaler.step(opt)
        else:
            opt.synchronize()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            with opt.skip_synchronize():
                scaler.step(opt)
        scaler.update()
        seen.append((scaler.get_scale(), opt.step_count))
    every = COMM.allgather_object(seen, name=f"amp.{pattern}.{controller!r}")
    assert every[0] == every[1], "every rank's scaler and step clock agree"
    assert [s for s, _ in seen][:6] == [1024.0, 1024.0, 512.0, 512.0, 512.0, 256.0]
    assert _spread_is_zero(model, f"amp.params.{pattern}.{controller!r}")
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())


def test_a_run_that_overflows_for_many_steps_first_trains_on():
    # AMP's scaler starts high and halves on each overflow: a dozen overflowing steps in a
    # row are normal, and not what max_consecutive_skips (10) is for.
    model = make_net(0)
    opt = distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                model.named_parameters(), controller=Static(cf=10))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 40)
    for step in range(16):
        opt.zero_grad()
        x, y = rank_batch(step, COMM.rank)
        loss = F.cross_entropy(model(x), y) * 1e30       # overflows until the scale is low
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    assert scaler.get_scale() < 2.0 ** 40
    assert opt.step_count == 16
    assert _spread_is_zero(model, "amp.streak")


def test_synchronize_and_skip_synchronize_mixed_with_plain_steps():
    model = make_net(0)
    opt = distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                model.named_parameters(), controller=Static(cf=10))
    for step in range(8):
        opt.zero_grad()
        x, y = rank_batch(step, COMM.rank)
        F.cross_entropy(model(x), y).backward()
        if step % 3 == 0:
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
    assert opt.step_count == 8
    assert _spread_is_zero(model, "skip_sync.mixed")


@pytest.mark.skipif(BACKEND != "horovod", reason="hvd.broadcast_optimizer_state is Horovod's")
def test_horovod_broadcast_optimizer_state_after_rank0_alone_loaded_a_checkpoint():
    import horovod.torch as hvd

    trained = make_net(0)
    opt = distributed_optimizer(torch.optim.SGD(trained.parameters(), lr=0.05, momentum=0.9),
                                trained.named_parameters(), controller=Static(cf=10))
    for step in range(3):
        opt.zero_grad()
        x, y = rank_batch(step, COMM.rank)
        F.cross_entropy(trained(x), y).backward()
        opt.step()
    checkpoint = {"model": trained.state_dict(), "opt": opt.state_dict()}

    model = make_net(1)
    resumed = distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                    model.named_parameters(), controller=Static(cf=10))
    if COMM.rank == 0:                    # as pytorch_imagenet_resnet50.py resumes
        model.load_state_dict(checkpoint["model"])
        resumed.load_state_dict(checkpoint["opt"])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(resumed, root_rank=0)     # hung: a gravac step on rank 1
    assert resumed.step_count == (3 if COMM.rank == 0 else 0)
    for step in range(3, 6):
        resumed.zero_grad()
        x, y = rank_batch(step, COMM.rank)
        F.cross_entropy(model(x), y).backward()
        resumed.step()
    momentum = [resumed.state[p]["momentum_buffer"] for p in model.parameters()]
    both = gather_rows(torch.cat([m.reshape(-1) for m in momentum]), "bcast.momentum")
    assert torch.equal(both[0], both[1])
    assert _spread_is_zero(model, "bcast.params")
    barrier("bcast.done")


@pytest.mark.parametrize("broadcast", ["horovod", "gravac"])
@pytest.mark.parametrize("controller", [lambda: Static(cf=10),
                                        lambda: GraVAC(theta_min=4, theta_max=64, window=3,
                                                       epsilon=0.3)], ids=["static", "gravac"])
def test_rank0_alone_reloads_a_checkpoint_mid_run_then_broadcasts(broadcast, controller):
    """Rank 0 alone goes back to step 2's checkpoint at step 6, then every rank broadcasts
    (hung under Horovod, a collective mismatch under Gloo: the ranks' step clocks and
    GraVAC's windows differed). After the broadcast the step count and the controller are
    rank 0's on every rank; residuals stay each rank's own."""
    import copy

    if broadcast == "horovod" and BACKEND != "horovod":
        pytest.skip("hvd.broadcast_optimizer_state is Horovod's")
    from gravac.engine.optimizer import broadcast_optimizer_state

    model = make_net(0)
    opt = distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                model.named_parameters(), controller=controller())

    def train(steps):
        for step in steps:
            opt.zero_grad()
            x, y = rank_batch(step, COMM.rank)
            F.cross_entropy(model(x), y).backward()
            opt.step()
    train(range(2))
    checkpoint = copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict()})
    train(range(2, 6))
    if COMM.rank == 0:
        model.load_state_dict(checkpoint["model"])
        opt.load_state_dict(checkpoint["opt"])
    COMM.broadcast_parameters(model.state_dict())
    if broadcast == "horovod":
        import horovod.torch as hvd
        hvd.broadcast_optimizer_state(opt, root_rank=0)
    else:
        broadcast_optimizer_state(opt, COMM)
    train(range(6, 12))
    assert opt.step_count == 8                     # rank 0's 2, then 6 more, on every rank
    described = COMM.allgather_object(opt.controller.describe(), name=f"reload.{broadcast}")
    assert described[0] == described[1]
    assert _spread_is_zero(model, f"reload.params.{broadcast}")
    barrier(f"reload.done.{broadcast}")


@pytest.mark.skipif(BACKEND != "horovod", reason="Horovod's own optimizer is the reference")
@pytest.mark.parametrize("wire", ["none", "fp16"])
def test_with_nothing_to_compress_gravac_equals_horovods_optimizer(wire):
    import horovod.torch as hvd

    import gravac

    compression = getattr(hvd.Compression, wire)
    models, opts = [make_net(0), make_net(0)], []
    for model, front in zip(models, (hvd.DistributedOptimizer, gravac.DistributedOptimizer)):
        extra = {} if front is hvd.DistributedOptimizer else {"compressor": "none"}
        opts.append(front(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                          named_parameters=model.named_parameters(), compression=compression,
                          gradient_predivide_factor=2.0, **extra))
    for step in range(4):
        x, y = rank_batch(step, COMM.rank)
        averaged = []
        for model, opt in zip(models, opts):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.synchronize()
            averaged.append([p.grad.clone() for p in model.parameters()])
            with opt.skip_synchronize():
                opt.step()
        if wire == "fp16":
            # gravac divides by the factor before the cast to fp16, Horovod after it (so a
            # gradient above 65504 survives: test_drop_in_patterns.py). Where a value
            # divided by the factor is subnormal in fp16 the two orders round it apart
            # (by 2^-24), and the sum of the ranks' values can then round to the next fp16
            # number: an average differs by at most one fp16 step (seen: up to 9.5e-7 at
            # 1.5e-3). Such a step moves the next step's gradients, so the models are kept
            # on Horovod's parameters and every step's averages are compared.
            for a, b in zip(*averaged):
                exponent = torch.floor(torch.log2(a.abs().clamp_min(2.0 ** -14)))
                spacing = torch.exp2(exponent - 10)          # one fp16 step at |a|
                assert ((a - b).abs() <= spacing + 8 * 2.0 ** -24).all(), \
                    (step, (a - b).abs().max())
            with torch.no_grad():
                for theirs, ours in zip(models[0].parameters(), models[1].parameters()):
                    ours.copy_(theirs)
    for a, b in zip(*(m.parameters() for m in models)):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    assert _spread_is_zero(models[1], f"equals_horovod.{wire}")


@pytest.mark.skipif(BACKEND != "horovod", reason="Horovod's own optimizer")
def test_horovods_optimizer_refuses_gravacs_compression_before_any_collective():
    import horovod.torch as hvd

    from gravac.hvd import Compression

    model = make_net(0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters(),
                                   compression=Compression.topk(cf=10))
    x, y = rank_batch(0, COMM.rank)
    with pytest.raises(TypeError, match="use gravac.DistributedOptimizer"):
        F.cross_entropy(model(x), y).backward()          # Horovod's hooks compress here
    barrier("hvd_refuses_gravac_compression")
