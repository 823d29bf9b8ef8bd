"""run.elastic on 2 ranks without a membership change: commits change nothing, and a
rollback (what a failed collective triggers) returns exactly to the last commit. Horovod
Elastic is Horovod-only: those tests are skipped under torchrun."""
import copy
from pathlib import Path

import pytest
import torch

from gravac.train.loop import Trainer, train
from helpers import COMM, barrier, distributed_optimizer, demo_config

def _cfg(out, name, *files, steps=30, extra=()):
    return demo_config(out, name, *files, steps=steps,
                       extra=["run.eval_interval=0", "run.checkpoint_interval=0",
                              "run.report=false", *extra])


def _final(out, name, rank):
    folder = Path(out) / name / "checkpoints"
    last = sorted(folder.glob("step_*"))[-1]
    common = torch.load(last / "common.pt", weights_only=False)
    mine = torch.load(last / f"rank_{rank:05d}.pt", weights_only=False)
    return common, mine


@pytest.mark.parametrize("files,extra", [
    (["dense.yaml"], []),
    (["static_dgc_10x.yaml"], []),
    ([], ["compression.gravac.window=8", "compression.gravac.omega=0"]),
], ids=["dense", "static-dgc", "gravac"])
@pytest.mark.horovod_only
def test_elastic_mode_trains_bit_for_bit_like_the_plain_loop(files, extra, shared_tmp, rank):
    train(_cfg(shared_tmp, "plain", *files, extra=extra))
    train(_cfg(shared_tmp, "elastic", *files,
               extra=[*extra, "run.elastic=true", "run.elastic_commit_interval=4"]))
    plain, plain_mine = _final(shared_tmp, "plain", rank)
    elastic, elastic_mine = _final(shared_tmp, "elastic", rank)
    for key, value in plain["model"].items():
        assert torch.equal(value, elastic["model"][key]), key
    # Dense runs plain hvd.DistributedOptimizer (no gravac state); the others must have it.
    has_gravac = files != ["dense.yaml"]
    assert ("gravac" in plain_mine["optimizer"]) == has_gravac
    assert ("gravac" in elastic_mine["optimizer"]) == has_gravac
    if has_gravac:
        a = plain_mine["optimizer"]["gravac"]["memory"]["residuals"]
        b = elastic_mine["optimizer"]["gravac"]["memory"]["residuals"]
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("files,extra", [
    (["dense.yaml"], []),
    ([], ["compression.gravac.window=4", "compression.gravac.omega=0"]),
], ids=["dense", "gravac"])
@pytest.mark.horovod_only
def test_restore_rolls_back_to_the_commit_and_replays_identically(files, extra, shared_tmp):
    from gravac.comm.horovod import HorovodComm
    from gravac.train.elastic import ElasticTrainingState

    cfg = _cfg(shared_tmp, "rollback", *files, steps=10, extra=[*extra, "run.elastic=true"])
    t = Trainer(cfg, COMM, elastic=True)
    state = ElasticTrainingState(t)
    state.sync()
    t.reattach(HorovodComm())
    t.start(resume=False)
    t.started = True
    t.run()
    state.commit()                                   # the commit at step 10
    committed_model = copy.deepcopy(t.model.state_dict())
    memory = getattr(t.opt, "memory", None)
    committed_residuals = {k: memory[k].clone() for k in memory.names()} if memory else {}

    t.total_steps = 17
    t.run()                                          # 7 steps that a failure would lose
    after_first = copy.deepcopy(t.model.state_dict())
    state.restore()
    assert t.step == 10 and t.batch_in_epoch == 10
    for key, value in committed_model.items():
        assert torch.equal(value, t.model.state_dict()[key]), key
    assert (len(committed_residuals) > 0) == (memory is not None)
    for name, residual in committed_residuals.items():
        assert torch.equal(residual, t.opt.memory[name]), name

    t.reattach(HorovodComm())                        # as after a reset: same ranks
    assert t.total_steps == 10                       # restored with the position
    t.total_steps = 17
    t.run()                                          # the same 7 steps again
    assert t.step == 17
    for key, value in after_first.items():
        assert torch.equal(value, t.model.state_dict()[key]), key
    t.close_log()


def test_deferred_agreement_still_refuses_a_mismatch_before_the_first_step(rank):
    model = torch.nn.Linear(64, 32)
    base = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = distributed_optimizer(base, model.named_parameters(), compressor="topk",
                                controller=10, min_compress_numel=1024 if rank else 512,
                                defer_agreement=True, name_prefix="deferred")
    model(torch.randn(4, 64)).sum().backward()
    with pytest.raises(ValueError, match="min_compress_numel"):
        opt.step()
    assert all(p.grad is not None for p in model.parameters())
    barrier("deferred.after")                        # both ranks are still in step
