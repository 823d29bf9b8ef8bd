"""Ranks that disagree on the set-up fail on every rank, before the first step."""
import pytest
import torch

from gravac.controllers import GraVAC, Static

from helpers import COMM, distributed_optimizer, make_net, rank_batch


def _opt(model, **kwargs):
    return distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       model.named_parameters(), **kwargs)


def test_same_setup_passes_and_ranks_then_step_in_lockstep(rank):
    model = make_net()
    opt = _opt(model, controller=GraVAC(window=10))
    descriptions = COMM.allgather_object(opt.describe_setup(), name="t.describe")
    assert descriptions[0] == descriptions[1]
    x, y = rank_batch(0, rank)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    # Different data on each rank, the same averaged update: parameters stay identical.
    params = COMM.allgather_object([p.detach().clone() for p in model.parameters()], name="t.p")
    assert all(torch.equal(a, b) for a, b in zip(*params))
    s = opt.last_stats
    decided = COMM.allgather_object((s.sent, s.cf, s.theta_min, s.gain_min), name="t.decided")
    assert decided[0] == decided[1] and s.theta_min == 10.0


def test_different_cf_is_named_with_ranks(rank):
    with pytest.raises(ValueError, match=r"controller\.cf: rank 0 has 100\.0; rank 1 has 10\.0"):
        _opt(make_net(), controller=Static(cf=100 if rank == 0 else 10))


def test_different_compressor_and_options(rank):
    with pytest.raises(ValueError, match=r"compressor\.name: rank 0 has \"topk\"; rank 1 has \"dgc\""):
        _opt(make_net(), compressor="topk" if rank == 0 else "dgc")
    with pytest.raises(ValueError, match=r"compressor\.seed: rank 0 has 0; rank 1 has 1"):
        _opt(make_net(), compressor="randomk", compressor_options={"seed": rank})


def test_different_model_shapes_and_min_numel(rank):
    model = make_net()
    if rank == 1:
        model.fc2 = torch.nn.Linear(96, 96, bias=False)       # a parameter less on rank 1
    with pytest.raises(ValueError, match=r"parameters\.length: rank 0 has 8; rank 1 has 7"):
        _opt(model)
    with pytest.raises(ValueError, match=r"min_compress_numel: rank 0 has 1024; rank 1 has 2048"):
        _opt(make_net(), min_compress_numel=1024 * (rank + 1))
