"""At its first step every rank takes rank 0's step count, controller and PowerSGD Q (one
broadcast; 3 ranks as threads): a state loaded on rank 0 alone, as Horovod's examples
resume before ``hvd.broadcast_optimizer_state``, leaves no rank's step clock or window
apart. Residuals stay each rank's own."""
import copy

import torch

from gravac.controllers import GraVAC, Static
from gravac.engine.optimizer import wrap_optimizer

from thread_comm import run_ranks

N = 3


def _base():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.ReLU(), torch.nn.Linear(48, 10))


BASE = _base()      # built once: threads seeding the global generator at once would race


def _step(model, opt, rank, step):
    g = torch.Generator().manual_seed(100 * step + rank)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g)
    opt.step()


def test_a_state_loaded_on_rank0_alone_is_every_ranks_at_the_first_step():
    def body(comm):
        def build(compressor="topk", ctrl=None):
            model = copy.deepcopy(BASE)
            opt = wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 model.named_parameters(), comm, compressor=compressor,
                                 controller=ctrl or GraVAC(theta_min=2, theta_max=16, window=2,
                                                           omega=0.0),
                                 min_compress_numel=64)
            return model, opt

        model, opt = build()
        for step in range(5):              # past two windows: the CFs moved
            _step(model, opt, comm.rank, step)
        saved = opt.state_dict()
        model, resumed = build()
        if comm.rank == 0:
            resumed.load_state_dict(saved)
        _step(model, resumed, comm.rank, 5)
        ctrl = resumed.controller.state_dict()["state"]
        # PowerSGD's Q (its warm start, which every rank must share) follows too.
        model, low = build("powersgd", Static(rank=2))
        _step(model, low, comm.rank, 0)
        q = low.compressor.state_dict()["q"]
        return (resumed.step_count, ctrl["theta_min"], ctrl["theta_c"],
                {n: resumed.memory[n].clone() for n in resumed.memory.names()}, q)

    results = run_ranks(N, body)
    assert {r[:3] for r in [(s, a, b) for s, a, b, _, _ in results]} == {results[0][:3]}
    assert results[0][0] == 6
    for name, q in results[0][4].items():
        assert all(torch.equal(q, other[4][name]) for other in results[1:])
    # residuals: each rank's own (rank 0 resumed its own; the others started afresh)
    name = next(iter(results[0][3]))
    assert not torch.equal(results[0][3][name], results[1][3][name])
