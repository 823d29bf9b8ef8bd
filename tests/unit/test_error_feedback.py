"""Error feedback through the whole step, in one process, against sums computed here: what
a step applies plus the residual it leaves is g_ef = grad + previous residual, bit for bit,
for every sparsifier at both levels and on a dense decision, on data with ties and zeros,
with layers of 0 and 1 elements beside them (sent dense)."""
import pytest
import torch

from gravac.comm.local import LocalComm
from gravac.controllers.base import Controller, StepPlan
from gravac.engine import wrap_optimizer

SHAPES = {"w": (40, 50), "conv": (3, 7, 11, 9), "one": (1,), "none": (0,), "b": (10,)}
COMPRESSED = ("w", "conv")          # min_compress_numel=1024 sends the others dense


class Sends(Controller):
    """θmin 10 with a candidate at 40, sending ``level`` whatever the gains."""

    def __init__(self, level):
        self.level = level

    def plan(self, step):
        return StepPlan(theta_min=10.0, theta_c=40.0, needs_gains=True)

    def decide(self, gain_min, gain_c):
        return self.level


def _grads(step, data, dtype):
    g = torch.Generator().manual_seed(step)
    out = {}
    for name, shape in SHAPES.items():
        n = torch.Size(shape).numel()
        if data == "ties":       # few distinct magnitudes, zeros among them
            x = torch.randint(-3, 4, (n,), generator=g).float()
        else:                    # mostly zeros: fewer nonzeros than either level keeps
            x = torch.zeros(n)
            x[torch.randperm(n, generator=g)[:min(5, n)]] = torch.randn(min(5, n), generator=g)
        out[name] = x.to(dtype).view(shape)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("data", ["ties", "mostly_zero"])
@pytest.mark.parametrize("level", ["min", "candidate", "dense"])
@pytest.mark.parametrize("compressor", ["topk", "dgc", "redsync", "randomk"])
def test_what_is_applied_plus_the_residual_is_g_ef_bit_for_bit(compressor, level, data, dtype):
    params = {name: torch.nn.Parameter(torch.zeros(shape, dtype=dtype))
              for name, shape in SHAPES.items()}
    opt = wrap_optimizer(torch.optim.SGD(params.values(), lr=0.0), list(params.items()),
                         LocalComm(), compressor=compressor, controller=Sends(level),
                         min_compress_numel=1024)
    residual = {name: torch.zeros(params[name].numel()) for name in COMPRESSED}
    for step in range(3):
        grads = _grads(step, data, dtype)
        for name, p in params.items():
            p.grad = grads[name].clone()
        opt.step()
        for name, p in params.items():
            applied = p.grad.reshape(-1)
            if name not in COMPRESSED:
                assert torch.equal(applied, grads[name].reshape(-1)), name
                assert name not in opt.memory
                continue
            g_ef = grads[name].reshape(-1).float() + residual[name]   # fp32 residuals (E4)
            left = opt.memory[name].reshape(-1)
            assert left.dtype == torch.float32
            if level == "dense":
                assert not left.any()
                assert torch.equal(applied, g_ef.to(dtype))
            elif dtype == torch.float32:
                assert torch.equal(applied + left, g_ef), name
                sent = left == 0
                assert torch.equal(applied[~sent], torch.zeros_like(applied[~sent]))
            else:
                # Each entry is either sent (applied: g_ef rounded to the gradient's dtype
                # after the fp32 average; residual 0) or kept (applied 0, residual g_ef).
                kept = (left == g_ef) & (applied == 0)
                sent = (left == 0) & (applied == g_ef.to(dtype))
                assert bool((kept | sent).all()), name
            residual[name] = left.clone()
