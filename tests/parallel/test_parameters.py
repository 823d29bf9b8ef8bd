"""Awkward parameters, handled the same on every rank: unused branches on one rank only,
sparse embedding gradients, fp16/bf16 parameters, frozen ones, layers smaller than k."""
import torch
import torch.nn.functional as F

import gravac
from gravac.controllers import GraVAC, Static

from helpers import barrier, distributed_optimizer, gather_rows


class Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(500, 16, sparse=True)        # 8000: compressed, sparse grads
        self.left = torch.nn.Linear(16, 64)                        # 1024: compressed
        self.right = torch.nn.Linear(16, 64)                       # used on rank 0 only
        self.head = torch.nn.Linear(64, 5)
        self.frozen = torch.nn.Linear(64, 64)
        self.frozen.requires_grad_(False)

    def forward(self, tokens, use_right):
        h = self.emb(tokens).mean(1)
        h = self.right(h) if use_right else self.left(h)
        return self.head(torch.relu(h))


def _flat(model):
    return torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])


def test_unused_branch_on_one_rank_and_sparse_embedding_gradients(rank):
    torch.manual_seed(0)
    model = Branchy()
    opt = distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      model.named_parameters(),
                                      controller=GraVAC(window=5, alpha=1.0, epsilon=0.3))
    assert "frozen.weight" not in opt.layer_names
    assert {"emb.weight", "left.weight"} <= set(opt.compressed_layer_names)
    for step in range(15):
        g = torch.Generator().manual_seed(step * 10 + rank)
        tokens = torch.randint(0, 500, (8, 6), generator=g)
        opt.zero_grad()
        F.cross_entropy(model(tokens, use_right=(rank == 0 and step % 2 == 0)),
                        torch.randint(0, 5, (8,), generator=g)).backward()
        opt.step()
    both = gather_rows(_flat(model), "params.branchy")
    assert torch.equal(both[0], both[1]), "every rank holds the same parameters"
    assert bool(torch.isfinite(both).all())


def test_half_precision_parameters_keep_fp32_residuals(rank):
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 48),
                                torch.nn.ReLU(), torch.nn.Linear(48, 4))
    model[0].to(torch.bfloat16)           # compressed bf16 layer (2048) + bf16 bias (dense)
    model[2].to(torch.float16)            # compressed fp16 layer (3072) + fp16 bias (dense)
    opt = distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                      model.named_parameters(), controller=Static(cf=10))
    for step in range(6):
        g = torch.Generator().manual_seed(step * 10 + rank)
        x = torch.randn(8, 32, generator=g)
        opt.zero_grad()
        h = model[1](model[0](x.to(torch.bfloat16))).float()
        h = model[3](model[2](h.to(torch.float16))).float()
        F.cross_entropy(model[4](h), torch.randint(0, 4, (8,), generator=g)).backward()
        bias_grads = gather_rows(model[0].bias.grad.float(), "params.bias")
        opt.step()
        # the bf16 bias went dense (as float32 on the wire): its average, rounded to bf16
        assert torch.equal(model[0].bias.grad, bias_grads.mean(0).to(torch.bfloat16))
    assert opt.memory["0.weight"].dtype == torch.float32
    assert opt.memory["2.weight"].dtype == torch.float32
    assert model[0].weight.dtype == torch.bfloat16 and model[2].weight.dtype == torch.float16
    both = gather_rows(_flat(model), "params.half")
    assert torch.equal(both[0], both[1]) and bool(torch.isfinite(both).all())


def test_layers_smaller_than_one_kept_value_per_cf(rank):
    torch.manual_seed(2)
    model = torch.nn.Linear(3, 2)                        # 6 weights, 2 biases
    opt = distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      model.named_parameters(), controller=Static(cf=1000),
                                      min_compress_numel=1)
    model(torch.randn(4, 3) + rank).sum().backward()
    opt.step()
    assert opt.last_stats.values_sent == 2            # k = max(1, ceil(n / 1000)) per layer
    both = gather_rows(_flat(model), "params.tiny")
    assert torch.equal(both[0], both[1])
    barrier("params.done")
