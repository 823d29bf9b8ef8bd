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

After every reset (``Trainer.reattach``) the data are dealt again to the new ranks (the epoch goes
on from the same place), the gravac optimizer re-runs its set-up agreement and binds its
controller to the new ranks (what it learned is kept; GraVAC's default α follows the rank
count), metrics continue on the new rank 0, and an ``elastic_reset`` record is logged.

What is synchronised from rank 0: model, the wrapped optimizer's state (momentum), the
controller (CFs, EWMAs, windows), the LR schedule and the position (step, epoch, batch,
counters). What stays per process: its residual memory (error feedback is one process's
unsent gradient; a joining process starts with none, a rolled-back one gets its committed
residuals back), its random generators and its data-loading state.

Horovod only: ``run.backend=torch`` with ``run.elastic`` is refused by the config.
"""
from __future__ import annotations

import horovod.torch as hvd
from horovod.common.elastic import State

from ..comm.horovod import HorovodComm
from ..engine.run_record import ELASTIC_RESET, new_record
from .monitor import truncate_metrics


class ElasticTrainingState(State):
    """``hvd.elastic.State`` of a ``Trainer``: commit / restore / sync as Horovod asks.

    Example::

        state = ElasticTrainingState(trainer)
        @hvd.elastic.run
        def body(state): ...; state.commit(); ...
        body(state)
    """

    def __init__(self, trainer):
        self.trainer = trainer
        self._saved = trainer.snapshot()
        super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank)

    def save(self) -> None:
        self._saved = self.trainer.snapshot()

    def restore(self) -> None:
        saved = self._saved
        self.trainer.restore(saved["model"], saved["shared"], saved["local"])

    def sync(self) -> None:
        t = self.trainer
        # Live state equals the last commit here (Horovod restores before it syncs), so
        # rank 0's committed state is what everyone gets; residuals stay per process.
        comm = HorovodComm()
        comm.broadcast_parameters(t.model.state_dict())
        shared, elapsed = comm.broadcast_object(
            (self._saved["shared"], t.elapsed()) if comm.rank == 0 else None,
            name="gravac.elastic.sync")
        t.restore(None, shared, self._saved["local"])
        t.restart_clock(elapsed)
        self.save()


def train_elastic(trainer, resume: bool) -> dict:
    """Run ``trainer`` under Horovod Elastic (see the module docstring)."""
    interval = trainer.cfg.run.elastic_commit_interval
    state = ElasticTrainingState(trainer)

    @hvd.elastic.run
    def body(state: ElasticTrainingState) -> dict:
        t = state.trainer
        # hvd.init() ran again after a reset: a new Comm sees the new ranks.
        previous = t.reattach(HorovodComm())
        if not t.started:
            t.start(resume)
            t.started = True
            state.save()
            t.open_log()
        else:
            if t.rank == 0:
                truncate_metrics(t.run_dir, t.step)   # steps rolled back are logged again
            t.open_log(new_record(ELASTIC_RESET, step=t.step, time=t.elapsed(),
                                  world_size=t.world, previous_world_size=previous,
                                  epoch=t.epoch, batch_in_epoch=t.batch_in_epoch,
                                  total_steps=t.total_steps))
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
