"""The NaN/Inf flags of a step without a gains round ride in its dense group (4 ranks as
threads, thread_comm.py): no collective of their own, the same skip on every rank, the
flagged ranks named, residuals rolled back; without a dense group they take a tiny
allreduce of their own, as before."""
from __future__ import annotations

import copy

import pytest
import torch

from gravac.controllers import Static
from gravac.engine.optimizer import wrap_optimizer

import thread_comm
from thread_comm import run_ranks

N = 4
SHAPES = {"0.weight": (48, 32), "0.bias": (48,), "2.weight": (10, 48), "2.bias": (10,)}


def _base():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.ReLU(), torch.nn.Linear(48, 10))


BASE = _base()      # built once: threads seeding the global generator at once would race


def _model():
    return copy.deepcopy(BASE)


def _grads(rank: int, step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return {name: torch.randn(shape, generator=g) for name, shape in SHAPES.items()}


def _run(bad=None, min_compress_numel=256, dense_wire="native", steps=3):
    """Per rank: [(collective names of the step, residuals after it, stats)]."""
    names: dict[int, list[str]] = {r: [] for r in range(N)}
    original = thread_comm.ThreadComm._collective

    def recording(self, kind, name, value, combine):
        names[self.rank].append(name)
        return original(self, kind, name, value, combine)

    def body(comm):
        model = _model()
        opt = wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                             comm, controller=Static(cf=10),
                             min_compress_numel=min_compress_numel, dense_wire=dense_wire)
        out = []
        for step in range(steps):
            for name, p in model.named_parameters():
                p.grad = _grads(comm.rank, step)[name].clone()
            if bad is not None and (comm.rank, step) == bad[:2]:
                dict(model.named_parameters())[bad[2]].grad.view(-1)[3] = bad[3]
            start = len(names[comm.rank])
            opt.step()
            out.append((names[comm.rank][start:],
                        {n: opt.memory[n].clone() for n in opt.memory.names()},
                        opt.last_stats, [p.detach().clone() for p in model.parameters()]))
        return out

    thread_comm.ThreadComm._collective = recording
    try:
        return run_ranks(N, body)
    finally:
        thread_comm.ThreadComm._collective = original


@pytest.mark.parametrize("dense_wire", ["native", "fp16"])
@pytest.mark.parametrize("where, value", [("0.bias", float("nan")),      # a dense layer
                                          ("2.weight", float("inf"))])   # a compressed one
def test_flags_ride_in_the_dense_group_and_skip_everywhere(where, value, dense_wire):
    clean = _run(dense_wire=dense_wire)
    bad = _run(bad=(2, 1, where, value), dense_wire=dense_wire)
    for r in range(N):
        step_names = bad[r][1][0]
        assert "gravac.finite" not in step_names and "gravac.dense" in step_names
        stats = bad[r][1][2]
        assert stats.skipped and stats.nonfinite_ranks == [2]
        # residuals and parameters as after step 0; the next step trains again
        for name, res in bad[r][1][1].items():
            assert torch.equal(res, clean[r][0][1][name])
        for p_bad, p_clean in zip(bad[r][1][3], clean[r][0][3]):
            assert torch.equal(p_bad, p_clean)
        assert not bad[r][2][2].skipped
    # a clean step's result is the same with the flags riding as it was before them
    for r in range(N):
        assert not any(s[2].skipped for s in clean[r])
        assert clean[r][0][3][0].equal(clean[0][0][3][0])


def test_without_a_dense_layer_the_flags_take_an_allreduce_of_their_own():
    bad = _run(bad=(1, 1, "0.bias", float("nan")), min_compress_numel=1)
    for r in range(N):
        # (The first step begins with rank 0's shared state: step count, controller.)
        assert bad[r][0][0] == ["gravac.shared_state", "gravac.sparse", "gravac.finite"]
        assert bad[r][2][0] == ["gravac.sparse", "gravac.finite"]
        assert bad[r][1][2].skipped and bad[r][1][2].nonfinite_ranks == [1]
        assert not bad[r][2][2].skipped


def test_two_ranks_flagged_at_once_are_both_named():
    def body(comm):
        model = _model()
        opt = wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                             comm, controller=Static(cf=10), min_compress_numel=256,
                             dense_wire="fp16")
        for name, p in model.named_parameters():
            p.grad = _grads(comm.rank, 0)[name].clone()
        if comm.rank in (0, 3):
            model[0].bias.grad[0] = float("nan")
        opt.step()
        return opt.last_stats.nonfinite_ranks
    assert run_ranks(N, body) == [[0, 3]] * N


def test_the_one_kernel_device_check_is_exact_and_leaves_the_gradients_alone():
    """The GPU path's NaN/Inf check (torch's GradScaler kernel at a scale of exactly 1) on
    CPU tensors: the right answer for NaN, +-Inf, huge finite values whose sum overflows,
    and every value (subnormals, -0.0) bit for bit as it was."""
    from gravac.engine.selection import _device_nonfinite

    grads = [torch.randn(10), torch.randn(3, 4), torch.randn(5).half(), torch.randn(7).bfloat16()]
    grads[0][0], grads[0][1], grads[1][0, 0] = 1e-42, -0.0, 3e38   # subnormal, -0, huge
    grads[0][2] = 3e38
    before = [g.clone() for g in grads]
    assert not bool(_device_nonfinite(grads))
    assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(grads, before))
    assert 0 < float(grads[0][0]) < 1.2e-38 and str(float(grads[0][1])) == "-0.0"
    for where, value in (((1, (2, 3)), float("nan")), ((2, (4,)), float("inf")),
                         ((3, (0,)), float("-inf"))):
        bad = [g.clone() for g in before]
        bad[where[0]][where[1]] = value
        assert bool(_device_nonfinite(bad)), (where, value)
