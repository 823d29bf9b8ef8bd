"""What an elastic reset relies on, without Horovod: tasks re-dealt to another number of
ranks go on from the right place, and controllers rebound to new ranks keep their state."""
import pytest
import torch

from gravac.controllers import Accordion, GraVAC, LocalSync, StepRecord
from gravac.controllers.gravac import default_alpha
from gravac.train.config import load_config
from gravac.train.tasks import build_task


class TwoRanks(LocalSync):
    size = 2


def _cfg(*overrides):
    return load_config(["configs/demo.yaml"], ["run.report=false", *overrides])


def _indices(task, epoch, start_batch, batches):
    """Sample indices of ``batches`` batches of ``task`` from ``start_batch`` of ``epoch``."""
    task.sampler.set_epoch(epoch)
    task.sampler.set_start(start_batch * task.batch_size)
    idx = list(task.sampler)
    return idx[:batches * task.batch_size]


def test_image_reshard_goes_on_with_exactly_the_samples_not_yet_seen():
    cfg = _cfg()
    two = [build_task(cfg, r, 2) for r in range(2)]
    done = 10                                       # batches each of 2 ranks has done
    seen = set()
    for task in two:
        seen.update(_indices(task, 3, 0, done))
    one = build_task(cfg, 0, 2)                     # a survivor: rank 0 of 2 ...
    start = one.reshard(0, 1, done, from_world_size=2)        # ... alone from now on
    assert (one.rank, one.world_size, one.steps_per_epoch) == (0, 1, one.steps_for(1))
    assert start == 2 * done                        # batch 16: 320 samples = 20 batches of 1
    rest = _indices(one, 3, start, one.steps_per_epoch - start)
    assert not seen & set(rest)                     # nothing seen twice ...
    assert len(seen) + len(rest) == one.steps_per_epoch * one.batch_size   # ... nothing skipped


def test_image_reshard_to_more_ranks_rounds_down_and_every_rank_agrees():
    cfg = _cfg()
    survivor = build_task(cfg, 0, 1)                # was alone, now rank 0 of 2
    assert survivor.reshard(0, 2, 21, from_world_size=1) == 10   # 21 x 16 = 10.5 x 32
    joiner = build_task(cfg, 1, 2)                  # built for the new world: same answer
    assert joiner.reshard(1, 2, 21, from_world_size=1) == 10


def test_language_reshard_keeps_the_fraction_of_the_epoch_and_resets_the_state():
    cfg = load_config(["configs/demo.yaml"], [
        "model.name=lstm", "data.name=synthetic_text", "data.batch_size=4", "data.bptt=10",
        "data.options={num_tokens: 20000, valid_tokens: 2000, vocab_size: 50}",
        "model.options={embedding_dim: 8, hidden_dim: 8, num_layers: 1}"])
    task = build_task(cfg, 0, 2)
    task.hidden = (torch.ones(1), torch.ones(1))
    before = task.steps_per_epoch
    start = task.reshard(0, 1, before // 2, from_world_size=2)
    assert task.steps_per_epoch == task.steps_for(1) > before
    assert start == task.steps_per_epoch // 2 and task.hidden is None


def test_gravac_rebind_keeps_what_it_learned_and_takes_alpha_from_the_new_ranks():
    ctrl = GraVAC(theta_min=10, theta_max=1000, window=2, omega=0.0)
    ctrl.bind(["w"], TwoRanks())
    for step in range(8):
        plan = ctrl.plan(step)
        sent = ctrl.decide(0.95, 0.9)
        ctrl.end_step(StepRecord(step=step, sent=sent, cf=plan.theta_c or plan.theta_min,
                                 gain=0.9, t_iter=0.1, samples=32), TwoRanks())
    before = ctrl.state_dict()["state"]
    assert ctrl.alpha == default_alpha(2) and len(before["decisions"]) >= 3
    ctrl.rebind(["w"], LocalSync())                 # one rank left
    after = ctrl.state_dict()["state"]
    assert ctrl.alpha == default_alpha(1)
    assert {k: v for k, v in after.items() if k != "alpha"} == \
        {k: v for k, v in before.items() if k != "alpha"}
    fixed = GraVAC(alpha=0.5)
    fixed.bind(["w"], TwoRanks())
    fixed.rebind(["w"], LocalSync())
    assert fixed.alpha == 0.5                       # a configured α is left alone


def test_accordion_rebind_keeps_the_per_layer_cfs():
    ctrl = Accordion(low_cf=10, high_cf=1000, switch_freq=2, interval_steps=2)
    ctrl.bind(["a", "b"], LocalSync())
    ctrl._state["layer_cf"]["a"] = 1000             # as after a critical-regime decision
    ctrl.rebind(["a", "b"], TwoRanks())
    assert ctrl.layer_cf == {"a": 1000, "b": 10}
