"""PyTorch DDP's communication hooks as gravac's torchrun baselines (gravac/torch/ddp.py):
the PowerSGD hook is really applied, from the step it is told to start at."""
import pytest
import torch
import torch.nn.functional as F

from helpers import BACKEND, COMM, gather_rows, make_net, rank_batch

pytestmark = pytest.mark.skipif(BACKEND != "torch", reason="DDP runs on torch.distributed only")


def _grads_after_backward(ddp, model, step, rank):
    model.zero_grad()
    x, y = rank_batch(step, rank)
    F.cross_entropy(ddp(x), y).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def test_powersgd_hook_starts_at_its_step_and_compresses(rank):
    from gravac.torch.ddp import wrap_ddp

    plain_model, psgd_model = make_net(), make_net()
    plain = wrap_ddp(plain_model, COMM)
    psgd = wrap_ddp(psgd_model, COMM, powersgd_rank=1, start_powersgd_iter=2)
    for step in range(4):
        a = _grads_after_backward(plain, plain_model, step, rank)
        b = _grads_after_backward(psgd, psgd_model, step, rank)
        weight = [i for i, p in enumerate(plain_model.parameters()) if p.dim() == 2][0]
        if step < 2:
            # Before start_powersgd_iter the hook is a plain allreduce (average).
            assert all(torch.allclose(x, y, atol=1e-6) for x, y in zip(a, b)), step
        else:
            # Then a rank-1 approximation of the average: rank 1, not the average.
            assert not torch.allclose(a[weight], b[weight], atol=1e-4), step
            assert torch.linalg.matrix_rank(b[weight]) == 1
        both = gather_rows(torch.cat([g.reshape(-1) for g in b]), f"ddp.psgd.{step}")
        assert torch.equal(both[0], both[1]), "every rank applies the same gradient"


def test_one_hook_only():
    from gravac.torch.ddp import wrap_ddp

    with pytest.raises(ValueError, match="one communication hook"):
        wrap_ddp(make_net(), COMM, fp16=True, powersgd_rank=1)
