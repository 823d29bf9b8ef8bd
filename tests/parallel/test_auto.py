"""controller: auto on 2 ranks, on this run's transport: both ranks run the same method at
every step and make the same decisions (rank 0's timings, broadcast), parameters stay
identical, a dense step of Auto applies exactly the average a plain allreduce computes,
and the trainer's run writes Auto's events and the method of every step."""
import json

import pytest
import torch
import torch.nn.functional as F

from gravac.controllers import Auto
from gravac.train.loop import train

from helpers import COMM, barrier, demo_config, distributed_optimizer, gather_rows, make_net, rank_batch


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
def test_ranks_agree_on_every_method_and_the_dense_steps_are_the_plain_average(overlap):
    model = make_net(0)
    # Without fp16, dense calibrates the link: its steps are measured in every run. At
    # ε = 0.5 Top-k 10x runs its whole trial (gains ~0.51) and PowerSGD rank 4's ends at
    # its first step (~0.38, under 0.425).
    ctrl = Auto(methods=["dense", "powersgd:4", "powersgd:1", "sparse:10", "sparse:40"],
                trial_steps=2, settle_steps=1, recheck_every=8, epsilon=0.5)
    # Each gradient as backward made it: taken by a hook registered before gravac's, which
    # with overlap start reducing it in place during backward.
    raw = {}
    for n, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(
            lambda p, n=n: raw.__setitem__(n, p.grad.detach().clone()))
    # With overlap: buckets of a few KiB, so that several leave from backward's hooks.
    extra = {"overlap": True, "bucket_cap_mb": 0.002} if overlap else {}
    opt = distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                model.named_parameters(), compressor="topk", controller=ctrl,
                                **extra)
    methods, dense_ok = [], []
    for step in range(36):
        x, y = rank_batch(step, COMM.rank)
        opt.zero_grad()
        residual = {n: opt.memory[n].detach().clone().view_as(p) if n in opt.memory
                    else torch.zeros_like(p) for n, p in model.named_parameters()}
        F.cross_entropy(model(x), y).backward()
        opt.synchronize()
        stats = opt.last_stats
        if stats.method == "dense":
            # Every layer: the average over ranks of gradient + residual (flushed whole).
            for n, p in model.named_parameters():
                both = gather_rows(raw[n] + residual[n], name=f"auto.raw.{overlap}.{step}.{n}")
                dense_ok.append(torch.allclose(p.grad.reshape(-1), both.mean(0), atol=1e-7))
        with opt.skip_synchronize():
            opt.step()
        methods.append(f"{stats.method}/{stats.sent}")
    all_methods = COMM.allgather_object(methods, name=f"auto.methods.{overlap}")
    all_decisions = COMM.allgather_object(ctrl.decisions, name=f"auto.decisions.{overlap}")
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    rows = gather_rows(params, name=f"auto.params.{overlap}")
    assert all_methods[0] == all_methods[1]
    assert all_decisions[0] == all_decisions[1]
    assert any(d["event"] == "chosen" for d in all_decisions[0])
    assert any(d["event"] == "abandoned" for d in all_decisions[0])
    assert "powersgd:4/min" in all_methods[0] and "sparse:10/min" in all_methods[0]
    assert torch.equal(rows[0], rows[1])
    assert dense_ok and all(dense_ok)


def test_the_trainer_logs_the_method_of_every_step_and_autos_events(tmp_path):
    out = COMM.broadcast_object(str(tmp_path) if COMM.rank == 0 else None, name="auto.tmp")
    cfg = demo_config(out, "auto", "auto.yaml", steps=30,
                      extra=("compression.auto.recheck_every=10", "run.eval_interval=0"))
    train(cfg)
    barrier("auto.trained")
    lines = [json.loads(line) for line in open(f"{out}/auto/metrics.jsonl")]
    steps = [r for r in lines if r["kind"] == "step"]
    events = [r for r in lines if r["kind"] == "method"]
    assert steps and all(r["method"] for r in steps)
    assert events[0]["event"] == "measured" and events[0]["method"] == "fp16"   # calibration
    assert any(e["event"] == "chosen" for e in events)
    report = open(f"{out}/auto/report.md").read()
    assert "## Method choices (controller: auto)" in report
