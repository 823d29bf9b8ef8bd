"""World sizes other than 2 and 4, in one process (thread_comm.py): 3 ranks, layers whose
sizes no rank count divides and a compressed layer smaller than the world, every exchange
against a reference computed here from the ranks' gradients with torch.topk alone; and
``controller: auto`` on 4 ranks across the CF at which a sparse method leaves the
allgather for ``shared_index`` (``Method.exchange_for``), residuals carried over.

Gradients are set by hand, lr=0, so ``p.grad`` after ``step()`` is the averaged gradient.
"""
from __future__ import annotations

import math

import pytest
import torch

from gravac.controllers import Auto, Static
from gravac.engine.exchanges import shard_layers
from gravac.engine.layers import Layer
from gravac.engine.optimizer import wrap_optimizer

from thread_comm import run_ranks

#: 1073 and 1031 entries: not a multiple of 3 or 4; "c.weight" (2 entries) is compressed
#: (min_compress_numel=2) to k = 1 while smaller than the world.
SHAPES = {"a.weight": (37, 29), "a.bias": (37,), "b.weight": (1031,), "c.weight": (2,),
          "d.bias": (1,)}
MIN_NUMEL = 2
COMPRESSED = [n for n, s in SHAPES.items() if math.prod(s) >= MIN_NUMEL]


class _Params(torch.nn.Module):
    def __init__(self):
        super().__init__()
        for name, shape in SHAPES.items():
            owner, attr = name.split(".")
            if not hasattr(self, owner):
                setattr(self, owner, torch.nn.Module())
            getattr(self, owner).register_parameter(attr, torch.nn.Parameter(torch.zeros(shape)))


def grads_of(rank: int, step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return {n: torch.randn(s, generator=g, dtype=torch.float64).float().view(-1)
            for n, s in SHAPES.items()}


def _run(n_ranks, steps, controller, exchange="allgather", hosts=None, methods=None):
    """Every rank's averaged gradients per step; ``methods``: Auto's method per step."""
    def body(comm):
        model = _Params()
        ctrl = controller()
        opt = wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                             model.named_parameters(), comm, controller=ctrl,
                             min_compress_numel=MIN_NUMEL, exchange=exchange,
                             host_of_rank=hosts)
        out = []
        for step in range(steps):
            if methods is not None:
                ctrl._switch(methods[step], "run")
            for name, p in model.named_parameters():
                p.grad = grads_of(comm.rank, step)[name].view(SHAPES[name]).clone()
            opt.step()
            assert methods is None or opt.last_stats.method == methods[step]
            out.append({n: p.grad.detach().clone().view(-1) for n, p in model.named_parameters()})
        return out
    return run_ranks(n_ranks, body, hosts=hosts)


def _leader_base(n_ranks):
    layers = [Layer(i, n, torch.zeros(1), math.prod(SHAPES[n]), True)
              for i, n in enumerate(COMPRESSED)]
    return dict(zip(COMPRESSED, shard_layers(layers, n_ranks)))


def _reference(n_ranks, steps, cf_of_step, exchange_of_step, host_groups=None):
    """The averaged gradients per step: each rank's (or host average's) own Top-k of its
    error-fed gradient, averaged (allgather); or every rank's values at the layer's leader's
    Top-k (shared_index: leader (base + step) mod N); CF 1: the plain average."""
    groups = host_groups or [[r] for r in range(n_ranks)]
    base = _leader_base(n_ranks)
    residual = {(h, n): torch.zeros(math.prod(s)) for h in range(len(groups))
                for n, s in SHAPES.items()}
    out = []
    for step in range(steps):
        cf, exchange = cf_of_step(step), exchange_of_step(step)
        raw = {r: grads_of(r, step) for r in range(n_ranks)}
        expected = {}
        for name, shape in SHAPES.items():
            numel = math.prod(shape)
            g_ef = [torch.stack([raw[r][name] for r in g]).mean(0) + residual[(h, name)]
                    for h, g in enumerate(groups)]
            if name not in COMPRESSED or cf <= 1:
                expected[name] = torch.stack(g_ef).mean(0)
                for h in range(len(groups)):
                    residual[(h, name)] = torch.zeros(numel)
                continue
            k = max(1, math.ceil(numel / cf))
            total = torch.zeros(numel)
            if exchange == "shared_index":
                idx = torch.topk(g_ef[(base[name] + step) % n_ranks].abs(), k).indices
                total[idx] = torch.stack([e[idx] for e in g_ef]).mean(0)
                chosen = [idx] * len(groups)
            else:
                chosen = [torch.topk(e.abs(), k).indices for e in g_ef]
                for e, idx in zip(g_ef, chosen):
                    total[idx] += e[idx]
                total /= len(groups)
            for h, (e, idx) in enumerate(zip(g_ef, chosen)):
                left = e.clone()
                left[idx] = 0
                residual[(h, name)] = left
            expected[name] = total
        out.append(expected)
    return out


def _assert_matches(result, expected):
    for step, want in enumerate(expected):
        for name in SHAPES:
            for rank, per_step in enumerate(result):
                # every rank holds the same bits; the reference sums in another order
                assert torch.equal(per_step[step][name], result[0][step][name]), (step, name, rank)
            torch.testing.assert_close(result[0][step][name], want[name], rtol=0, atol=1e-6,
                                       msg=f"{name} at step {step}")


@pytest.mark.parametrize("exchange", ["allgather", "allgather_coded", "shared_index"])
@pytest.mark.parametrize("cf", [10, 3, 2, 1])
def test_three_ranks_on_odd_and_tiny_layers_match_the_reference(exchange, cf):
    result = _run(3, 3, lambda: Static(cf=cf), exchange)
    _assert_matches(result, _reference(3, 3, lambda s: cf, lambda s: exchange))


@pytest.mark.parametrize("hosts, groups", [([0, 1, 2], [[0], [1], [2]]),
                                           ([0, 0, 0], [[0, 1, 2]])],
                         ids=["a-rank-per-host", "one-host-of-three"])
def test_three_ranks_hierarchical_is_topk_of_each_hosts_average(hosts, groups):
    result = _run(3, 3, lambda: Static(cf=10), "hierarchical", hosts=hosts)
    _assert_matches(result, _reference(3, 3, lambda s: 10, lambda s: "allgather", groups))


def test_three_ranks_on_two_hosts_are_refused_naming_the_layout():
    with pytest.raises(AssertionError, match=r"host 0: ranks \[0, 1\], host 1: ranks \[2\]"):
        _run(3, 1, lambda: Static(cf=10), "hierarchical", hosts=[0, 0, 1])


def test_auto_on_four_ranks_switches_exchange_where_the_cf_reaches_the_ranks():
    """sparse:10 and sparse:5 by allgather, sparse:4 and below by shared_index, dense between:
    each step the reference's, the residuals carried across the exchanges."""
    methods = ["sparse:10", "sparse:4", "sparse:3", "sparse:5", "sparse:4", "dense", "sparse:2"]
    cfs = [1.0 if m == "dense" else float(m.split(":")[1]) for m in methods]
    result = _run(4, len(methods), lambda: Auto(methods=sorted(set(methods)), trial_steps=2,
                                                settle_steps=1, recheck_every=1000,
                                                epsilon=1e-6),
                  methods=methods)
    expected = _reference(4, len(methods), lambda s: cfs[s],
                          lambda s: "shared_index" if cfs[s] <= 4 else "allgather")
    _assert_matches(result, expected)
