"""A NaN/Inf gradient on one rank: detected by every rank in the same step."""
import pytest
import torch
import torch.nn.functional as F

import gravac
from gravac.controllers import Accordion, GraVAC, Static

from helpers import barrier, distributed_optimizer, gather_rows, make_net, rank_batch


def _run(opt, model, rank, steps, poison):
    """Train; ``poison(step, rank)`` puts a NaN/Inf into that rank's gradient."""
    snapshots = []
    for step in range(steps):
        x, y = rank_batch(step, rank)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        value = poison(step, rank)
        if value is not None:
            model.fc2.weight.grad[3, 5] = value
        params = [p.detach().clone() for p in model.parameters()]
        residuals = {n: opt.memory[n].clone() for n in opt.memory.names()}
        opt.step()
        snapshots.append((params, residuals, opt.last_stats))
    return snapshots


# The flags travel three ways (gravac/engine/step.py): beside the exchange (Static), in
# the gains allreduce (GraVAC), in a round of their own first (Accordion observes gradients).
@pytest.mark.parametrize("controller", [Static(cf=10), GraVAC(window=4, alpha=1.0),
                                        Accordion(low_cf=10, high_cf=100, interval_steps=3)],
                         ids=["static", "gravac", "accordion"])
def test_nan_on_one_rank_skips_the_step_everywhere_without_poisoning_residuals(controller, rank):
    model = make_net()
    opt = distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                      model.named_parameters(), controller=controller)
    poison = lambda s, r: float("nan") if (s, r) == (5, 1) else (float("inf") if (s, r) == (8, 0) else None)
    snaps = _run(opt, model, rank, 12, poison)
    for step, expected_ranks in ((5, [1]), (8, [0])):
        params_before, residuals_before, stats = snaps[step]
        assert stats.sent == "skipped" and stats.nonfinite_ranks == expected_ranks
        params_after = snaps[step + 1][0]
        for before, after in zip(params_before, params_after):
            assert torch.equal(before, after), "a skipped step must not update parameters"
        for name, res in residuals_before.items():
            assert torch.equal(snaps[step + 1][1][name], res), "residuals must not change"
    assert [e["step"] for e in opt.skipped_steps] == [5, 8]
    assert all(s[2].sent != "skipped" for i, s in enumerate(snaps) if i not in (5, 8))
    for p in model.parameters():
        assert bool(torch.isfinite(p).all())
    both = gather_rows(torch.cat([p.detach().reshape(-1) for p in model.parameters()]), "nf.params")
    assert torch.equal(both[0], both[1]), "ranks still hold identical parameters"
    for name in opt.memory.names():
        assert bool(torch.isfinite(opt.memory[name]).all())


def test_raise_mode_and_skip_budget_stop_every_rank(rank):
    model = make_net()
    opt = distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      model.named_parameters(), nonfinite="raise")
    with pytest.raises(FloatingPointError, match=r"at step 2 on rank\(s\) 1; stopping: nonfinite='raise'"):
        _run(opt, model, rank, 4, lambda s, r: float("nan") if (s, r) == (2, 1) else None)
    model = make_net()
    opt = distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      model.named_parameters(), max_consecutive_skips=2)
    with pytest.raises(FloatingPointError, match=r"3 consecutive steps skipped \(max_consecutive_skips=2\)"):
        _run(opt, model, rank, 6, lambda s, r: float("inf") if s >= 1 and r == 0 else None)
    barrier("nf.done")   # both ranks got here
