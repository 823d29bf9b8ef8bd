"""Overlap with backward on 2 ranks (both transports): each rank trains an overlapped and
a plain optimizer side by side on its own data; the parameters must be equal bit for bit,
on every rank, and the same across ranks. Also: GraVAC's decide="previous" decisions are
the same on every rank, a NaN on one rank skips the step everywhere, a layer that has a
gradient on one rank only does not hang."""
import pytest
import torch
import torch.nn.functional as F

from gravac.controllers import Accordion, GraVAC, Static

from helpers import barrier, distributed_optimizer, gather_rows, make_net, rank_batch

LEVELS = ["candidate", "min", "dense", "skipped"]
CONTROLLERS = {
    "static": lambda: Static(cf=10),
    "accordion": lambda: Accordion(low_cf=4, high_cf=40, interval_steps=3, switch_freq=1,
                                   eta=1.0),
    # Windows longer than the run: window decisions follow timings, which differ per run.
    "gravac-current": lambda: GraVAC(theta_min=4, theta_max=64, window=100, epsilon=0.5,
                                     alpha=1.0),
    "gravac-previous": lambda: GraVAC(theta_min=4, theta_max=64, window=100, epsilon=0.5,
                                      alpha=1.0, decide="previous"),
}


def _pair(kind, cap_mb, prefix):
    plain_model, over_model = make_net(), make_net()
    plain = distributed_optimizer(torch.optim.SGD(plain_model.parameters(), lr=0.1, momentum=0.9),
                                  plain_model.named_parameters(), controller=CONTROLLERS[kind](),
                                  name_prefix=f"{prefix}.plain")
    over = distributed_optimizer(torch.optim.SGD(over_model.parameters(), lr=0.1, momentum=0.9),
                                 over_model.named_parameters(), controller=CONTROLLERS[kind](),
                                 name_prefix=f"{prefix}.over", overlap=True,
                                 bucket_cap_mb=cap_mb)
    return (plain_model, plain), (over_model, over)


def _train(model, opt, rank, steps, nan_at=None, unused_on=None):
    sent = []
    for step in range(steps):
        x, y = rank_batch(step, rank)
        if nan_at == (step, rank):
            x[0, 0] = float("nan")
        opt.zero_grad()
        if unused_on == rank:
            # fc1 gets no gradient on this rank: its bucket leaves only at step().
            h = torch.relu(x @ torch.ones(32, 96) / 32)
            out = model.out(model.norm(torch.relu(model.fc2(h))))
        else:
            out = model(x)
        F.cross_entropy(out, y).backward()
        opt.step()
        sent.append(opt.last_stats.sent)
    return sent


def _flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("kind", sorted(CONTROLLERS))
@pytest.mark.parametrize("cap_mb", [0.01, 25.0])
def test_overlapped_and_plain_steps_agree_bit_for_bit_on_every_rank(kind, cap_mb, rank):
    prefix = f"ov.{kind}.{cap_mb}"
    (plain_model, plain), (over_model, over) = _pair(kind, cap_mb, prefix)
    sent_plain = _train(plain_model, plain, rank, 12)
    sent_over = _train(over_model, over, rank, 12)
    same_here = torch.equal(_flat(plain_model), _flat(over_model))
    rows = gather_rows(_flat(over_model), f"{prefix}.params")
    sents = gather_rows(torch.tensor([LEVELS.index(s) for s in sent_over]), f"{prefix}.sent")
    flags = gather_rows(torch.tensor([float(same_here)]), f"{prefix}.same")
    assert sent_plain == sent_over
    assert bool(flags.all()), "overlapped parameters differ from the plain step's"
    assert torch.equal(rows[0], rows[1]), "ranks hold different parameters"
    assert torch.equal(sents[0], sents[1]), "ranks sent different levels"
    if kind == "gravac-previous":
        assert sent_over[0] == "dense" and "dense" not in sent_over[1:]


def test_a_nan_on_one_rank_skips_the_overlapped_step_everywhere(rank):
    (plain_model, plain), (over_model, over) = _pair("static", 0.01, "ov.nan")
    sent_plain = _train(plain_model, plain, rank, 8, nan_at=(3, 1))
    sent_over = _train(over_model, over, rank, 8, nan_at=(3, 1))
    same_here = torch.equal(_flat(plain_model), _flat(over_model))
    flags = gather_rows(torch.tensor([float(same_here)]), "ov.nan.same")
    assert sent_over[3] == "skipped" and sent_over == sent_plain
    assert over.skipped_steps == [{"step": 3, "ranks": [1]}]
    assert bool(flags.all())
    assert bool(torch.isfinite(_flat(over_model)).all())


def test_a_layer_without_gradient_on_one_rank_is_sent_at_step_without_a_hang(rank):
    (plain_model, plain), (over_model, over) = _pair("static", 0.01, "ov.unused")
    _train(plain_model, plain, rank, 5, unused_on=1)
    _train(over_model, over, rank, 5, unused_on=1)
    same_here = torch.equal(_flat(plain_model), _flat(over_model))
    rows = gather_rows(_flat(over_model), "ov.unused.params")
    flags = gather_rows(torch.tensor([float(same_here)]), "ov.unused.same")
    assert bool(flags.all())
    assert torch.equal(rows[0], rows[1])
    barrier("ov.done")
