"""Horovod Elastic training: ranks may leave and join while the run goes on.

Launch with a host discovery script instead of a fixed host list::

    horovodrun -np 2 --min-np 1 --max-np 4 --host-discovery-script ./discover_hosts.sh \\
        python train.py --config configs/demo.yaml --set run.elastic=true

Every ``run.elastic_commit_interval`` steps the whole training state is committed to host
memory (``ElasticTrainingState.commit``; that is also where Horovod's notice of added or
removed hosts is checked, collectively). Then:

- a rank fails in a collective (killed, lost host): the survivors roll back to the last
  commit, Horovod re-forms the ring from the hosts left, and training goes on;
- hosts are added or removed: at the next commit every rank stops, Horovod re-forms the
  ring, a joining worker receives rank 0's state, and training goes on.

After every reset (``_attach``) the data are dealt again to the new ranks (the epoch goes
on from the same place), the gravac optimizer re-runs its set-up agreement and binds its
controller to the new ranks (what it learned is kept; GraVAC's default α follows the rank
count), metrics continue on the new rank 0, and an ``elastic_reset`` record is logged.

What is synchronised from rank 0: model, the wrapped optimizer's state (momentum), the
controller (CFs, EWMAs, windows), the LR schedule and the position (step, epoch, batch,
counters). What stays per process: its residual memory (error feedback is one process's
unsent gradient; a joining process starts with none, a rolled-back one gets its committed
residuals back), its random generators and its data-loading state.
"""
from __future__ import annotations

import copy
import time

import horovod.torch as hvd
from horovod.common.elastic import State

from ..hvd.optimizer import STATE_KEY
from .checkpoint import rng_state, set_rng_state
from .loop import Trainer
from .monitor import truncate_metrics

_POSITION = ("step", "epoch", "batch_in_epoch", "cum_floats", "cum_dense", "world",
             "total_steps", "started", "resumed")


def _snapshot(t: Trainer) -> dict:
    """The trainer's state, deep-copied to host memory: shared (rank 0's wins) and local."""
    opt_state = t.opt.state_dict()
    extra = opt_state.pop(STATE_KEY, None)
    local = {"rng": rng_state(), "task": t.task.state_dict()}
    if extra is not None:
        extra = dict(extra)
        local["memory"] = extra.pop("memory")
        local["compressor"] = extra.pop("compressor")
    shared = {"optimizer": opt_state, "gravac": extra, "scheduler": t.scheduler.state_dict(),
              "position": {k: getattr(t, k) for k in _POSITION}}
    return copy.deepcopy({"model": t.model.state_dict(), "shared": shared, "local": local})


def _load(t: Trainer, model_state: dict | None, shared: dict, local: dict) -> None:
    if model_state is not None:
        t.model.load_state_dict(model_state)
    opt_state = copy.deepcopy(shared["optimizer"])
    if shared["gravac"] is not None:
        extra = copy.deepcopy(shared["gravac"])
        extra["memory"] = copy.deepcopy(local["memory"])
        extra["compressor"] = copy.deepcopy(local["compressor"])
        opt_state[STATE_KEY] = extra
    # Also drops gradient handles a failed collective left behind (Horovod's optimizer
    # clears them in load_state_dict; gravac's resets its step flags).
    t.opt.load_state_dict(opt_state)
    t.scheduler.load_state_dict(copy.deepcopy(shared["scheduler"]))
    for key, value in shared["position"].items():
        setattr(t, key, value)
    set_rng_state(local["rng"])
    t.task.load_state_dict(copy.deepcopy(local["task"]))


class ElasticTrainingState(State):
    """``hvd.elastic.State`` of a ``Trainer``: commit / restore / sync as Horovod asks.

    Example::

        state = ElasticTrainingState(trainer)
        @hvd.elastic.run
        def body(state): ...; state.commit(); ...
        body(state)
    """

    def __init__(self, trainer: Trainer):
        self.trainer = trainer
        self._saved = _snapshot(trainer)
        super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank)

    def save(self) -> None:
        self._saved = _snapshot(self.trainer)

    def restore(self) -> None:
        saved = self._saved
        _load(self.trainer, saved["model"], saved["shared"], saved["local"])

    def sync(self) -> None:
        t = self.trainer
        # Live state equals the last commit here (Horovod restores before it syncs), so
        # rank 0's committed state is what everyone gets; residuals stay per process.
        hvd.broadcast_parameters(t.model.state_dict(), root_rank=0)
        shared, elapsed = hvd.broadcast_object(
            (self._saved["shared"], t.elapsed()) if hvd.rank() == 0 else None,
            root_rank=0, name="gravac.elastic.sync")
        _load(t, None, shared, self._saved["local"])
        t.elapsed0, t._clock0 = elapsed, time.perf_counter()
        self.save()


def _attach(t: Trainer) -> int | None:
    """After (re)start: adopt the current ranks. Collective. Returns the world size the
    position was reached with when it differs from the current one, else None."""
    rank, world = hvd.rank(), hvd.size()
    # Every rank must stand at the same step, or the collectives below would pair up
    # wrongly; also orders this after every rank has left the previous attempt.
    steps = hvd.allgather_object(t.step, name="gravac.elastic.attach")
    if len(set(steps)) != 1:
        raise RuntimeError(f"elastic reset: ranks stand at different steps {steps}; the "
                           "committed states differ, which must not happen")
    previous = t.world if t.world != world else None
    if (rank, world) != (t.task.rank, t.task.world_size) or previous is not None:
        t.batch_in_epoch = t.task.reshard(rank, world, t.batch_in_epoch, t.world)
        if t.cfg.run.epochs is not None:
            spe = t.task.steps_per_epoch
            t.total_steps = (t.step + (spe - t.batch_in_epoch)
                             + (t.cfg.run.epochs - t.epoch - 1) * spe)
    t.rank, t.world = rank, world
    if hasattr(t.opt, "reset_world"):
        t.opt.reset_world()
    return previous


def train_elastic(trainer: Trainer, resume: bool) -> dict:
    """Run ``trainer`` under Horovod Elastic (see the module docstring)."""
    interval = trainer.cfg.run.elastic_commit_interval
    state = ElasticTrainingState(trainer)

    @hvd.elastic.run
    def body(state: ElasticTrainingState) -> dict:
        t = state.trainer
        previous = _attach(t)
        if not t.started:
            t.start(resume)
            t.started = True
            state.save()
            t.open_log()
        else:
            if t.rank == 0:
                truncate_metrics(t.run_dir, t.step)   # steps rolled back are logged again
            t.open_log({"kind": "elastic_reset", "step": t.step, "time": t.elapsed(),
                        "world_size": t.world, "previous_world_size": previous,
                        "epoch": t.epoch, "batch_in_epoch": t.batch_in_epoch,
                        "total_steps": t.total_steps})
            t.log.message(f"elastic reset at step {t.step}: {t.world} rank(s)"
                          + (f" (were {previous})" if previous else ""))

        def commit():
            if t.step % interval == 0:
                state.commit()

        try:
            t.run(after_step=commit)
            return t.finish()
        finally:
            t.close_log()

    return body(state)
