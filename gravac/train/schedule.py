"""train.py's learning-rate schedule: an optional linear warm-up, then the steps of
``optimizer.lr_milestones`` (torchvision's reference train.py: ``--lr-warmup-epochs``,
``--lr-warmup-decay``, ``--lr-steps``; counted here in iterations).

The milestones stay absolute iteration numbers whether or not there is a warm-up (the
rate at step s is lr x warm-up factor(s) x lr_gamma ** (milestones <= s)), so adding a
warm-up never moves a decay. Without one the scheduler is torch's ``MultiStepLR``, which
checkpoints written before warm-up existed hold.

Example::

    scheduler = build_scheduler(opt, OptimizerConfig(lr=0.05, lr_warmup_steps=20))
    scheduler.step()        # after every optimizer step, as train.py does
"""
from __future__ import annotations

import bisect

import torch

from .config import OptimizerConfig


def lr_factor(step: int, o: OptimizerConfig) -> float:
    """The learning rate at iteration ``step`` as a fraction of ``o.lr``: the warm-up rises
    linearly from ``o.lr_warmup_start`` to 1 over ``o.lr_warmup_steps`` steps; each
    milestone reached multiplies by ``o.lr_gamma``."""
    warm = 1.0
    if step < o.lr_warmup_steps:
        warm = o.lr_warmup_start + (1 - o.lr_warmup_start) * step / o.lr_warmup_steps
    return warm * o.lr_gamma ** bisect.bisect_right(o.lr_milestones, step)


def build_scheduler(opt: torch.optim.Optimizer, o: OptimizerConfig):
    """The scheduler train.py steps once per iteration."""
    if o.lr_warmup_steps == 0:
        return torch.optim.lr_scheduler.MultiStepLR(opt, milestones=o.lr_milestones,
                                                    gamma=o.lr_gamma)
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(step, o))


#: The optimizer keys the learning rate of a step follows.
SCHEDULE_KEYS = ("lr", "lr_milestones", "lr_gamma", "lr_warmup_steps", "lr_warmup_start")


def changed_schedule_factor(saved_schedule: dict, o: OptimizerConfig,
                            saved: dict | None) -> float | None:
    """For a resume whose schedule keys differ from ``saved`` (the checkpoint's optimizer
    config; a change run.resume_allow_changes forced): ``lr_factor`` at the saved step, the
    fraction of the new ``o.lr`` to go on with. None when they are the same (or the
    checkpoint holds no config): the saved rates then go on exactly as they were."""
    if saved is None:
        return None
    default = OptimizerConfig()
    if all(saved.get(k, getattr(default, k)) == getattr(o, k) for k in SCHEDULE_KEYS):
        return None
    return lr_factor(saved_schedule["last_epoch"], o)


def continue_schedule(scheduler, saved_schedule: dict, changed: bool) -> None:
    """Load the saved schedule; where it ``changed``, keep the one built from the config
    (another class with a warm-up, other milestones) at the saved step instead, the
    optimizer's rates being set already (``changed_schedule_factor``)."""
    if not changed:
        scheduler.load_state_dict(saved_schedule)
        return
    scheduler.last_epoch = saved_schedule["last_epoch"]
    scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]
