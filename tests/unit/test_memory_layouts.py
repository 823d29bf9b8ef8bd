"""Gradients in another memory layout (channels_last conv weights) are compressed and
averaged like contiguous ones, in one process."""
import pytest
import torch

from gravac.comm.local import LocalComm
from gravac.controllers import GraVAC, Static
from gravac.engine import wrap_optimizer


def _model(channels_last):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3), torch.nn.ReLU(),
                                torch.nn.Conv2d(32, 8, 3), torch.nn.Flatten(),
                                torch.nn.Linear(8 * 4 * 4, 4))
    return model.to(memory_format=torch.channels_last) if channels_last else model


def _backward(model, step, channels_last):
    x = torch.randn(4, 16, 8, 8, generator=torch.Generator().manual_seed(step))
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    model(x).pow(2).mean().backward()


@pytest.mark.parametrize("compressor,controller,overlap", [
    ("topk", lambda: Static(cf=10), False),
    ("topk", lambda: Static(cf=10), True),
    ("randomk", lambda: GraVAC(theta_min=10, window=2, alpha=1.0, epsilon=0.1), False),
    ("dgc", lambda: Static(cf=10), True),
    ("powersgd", lambda: Static(rank=2), False),
])
def test_channels_last_gradients_train_like_contiguous_ones(compressor, controller, overlap):
    runs = []
    for channels_last in (False, True):
        model = _model(channels_last)
        if channels_last:           # autograd's gradients follow the weights' layout
            _backward(model, 99, True)
            assert not model[0].weight.grad.is_contiguous()
            model.zero_grad()
        opt = wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                             model.named_parameters(), LocalComm(), compressor=compressor,
                             controller=controller(), min_compress_numel=1024, overlap=overlap)
        for step in range(3):
            opt.zero_grad()
            _backward(model, step, channels_last)
            opt.step()
        runs.append((model, opt))
    (plain, plain_opt), (last, last_opt) = runs
    for (name, a), b in zip(plain.named_parameters(), last.parameters()):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), name
    for name in ("0.weight", "2.weight"):
        assert torch.allclose(plain_opt.memory[name], last_opt.memory[name],
                              rtol=1e-5, atol=1e-6), name
