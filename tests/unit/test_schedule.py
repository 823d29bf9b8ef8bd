"""train.py's learning-rate schedule: the linear warm-up against its formula, milestones
against torch's MultiStepLR, a resume that continues the same rates, and train.py's logged
rates."""
import json
from pathlib import Path

import pytest
import torch

from gravac.train.config import OptimizerConfig, load_config
from gravac.train.loop import train
from gravac.train.schedule import build_scheduler, lr_factor

REPO = Path(__file__).resolve().parents[2]


def _rates(o: OptimizerConfig, steps: int, state=None) -> tuple[list[float], tuple]:
    """The rate each of ``steps`` optimizer steps runs at, as train.py steps it, and the
    optimizer's and scheduler's states after them (what a checkpoint holds)."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=o.lr)
    scheduler = build_scheduler(opt, o)
    if state is not None:
        opt.load_state_dict(state[0])
        scheduler.load_state_dict(state[1])
    rates = []
    for _ in range(steps):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        scheduler.step()
    return rates, (opt.state_dict(), scheduler.state_dict())


def test_without_warm_up_it_is_torchs_multisteplr():
    o = OptimizerConfig(lr=0.5, lr_milestones=[3, 7], lr_gamma=0.1)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=o.lr)
    assert isinstance(build_scheduler(opt, o), torch.optim.lr_scheduler.MultiStepLR)
    rates, _ = _rates(o, 10)
    # The formula the warm-up path uses, checked against torch's own scheduler.
    assert rates == pytest.approx([0.5 * lr_factor(s, o) for s in range(10)])
    assert rates == pytest.approx([0.5] * 3 + [0.05] * 4 + [0.005] * 3)


def test_the_warm_up_rises_linearly_and_milestones_stay_absolute():
    o = OptimizerConfig(lr=0.2, lr_warmup_steps=4, lr_warmup_start=0.1, lr_milestones=[6],
                        lr_gamma=0.5)
    rates, _ = _rates(o, 8)
    assert rates == pytest.approx([0.02, 0.065, 0.11, 0.155, 0.2, 0.2, 0.1, 0.1])


def test_a_resumed_schedule_continues_the_same_rates():
    o = OptimizerConfig(lr=1.0, lr_warmup_steps=5, lr_milestones=[8])
    whole, _ = _rates(o, 12)
    first, state = _rates(o, 3)
    rest, _ = _rates(o, 9, state=state)
    assert first + rest == pytest.approx(whole)


def test_train_py_runs_its_steps_at_the_warm_up_rates(tmp_path):
    cfg = load_config([str(REPO / "configs/demo.yaml")],
                      [f"run.output_dir={tmp_path}", "run.name=warm", "run.steps=6",
                       "run.backend=local", "run.log_interval=1", "run.progress=never",
                       "run.report=false", "optimizer.lr=0.1", "optimizer.lr_warmup_steps=4",
                       "optimizer.lr_warmup_start=0.2"])
    train(cfg)
    steps = [json.loads(line) for line in
             (tmp_path / "warm" / "metrics.jsonl").read_text().splitlines()]
    rates = [r["lr"] for r in steps if r["kind"] == "step"]
    assert rates == pytest.approx([0.02, 0.04, 0.06, 0.08, 0.1, 0.1])
