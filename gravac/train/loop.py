"""The training loop behind ``train.py``: build, (resume,) train, evaluate, checkpoint, log.

``train(cfg, resume=False, dry_run=False)`` runs on every rank under horovodrun or
torchrun (``run.backend``: auto, horovod or torch); every collective goes through the
run's ``gravac.comm.Comm``. Every collective (gradient exchange, evaluation sums,
checkpoint barrier, controller windows) happens at steps all ranks agree on, because
every rank runs the same number of steps per epoch and the same schedule. With
``run.elastic`` the same ``Trainer`` runs under Horovod Elastic
(``gravac/train/elastic.py``; Horovod only).

Example::

    cfg = load_config(["configs/demo.yaml"])
    summary = train(cfg)         # {"run_dir": ..., "final": {...}, "steps": ...}
"""
from __future__ import annotations

import copy
import os
import random
import time
from pathlib import Path

import torch

from ..comm import Comm
from ..comm import init as init_comm
from ..comm.handshake import describe as describe_gravac
from ..controllers import GraVAC
from ..engine import STATE_KEY, broadcast_optimizer_state
from ..engine.record import step_record
from ..engine.run_record import (EVAL, METHOD, METRICS_FILE, NONFINITE, RANK_STEP_FIELDS,
                                 RUN_END, RUN_START, WINDOW, new_record)
from ..util.malloc import keep_freed_memory
from ..util.atomic import atomic_write_text
from .checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from .config import Config, ConfigError, dump_yaml, to_dict
from .device import describe_device, rank_device, wants_gpu
from .method import build_method, prepare_environment
from .monitor import RankPhaseLog, RunLogger, truncate_metrics
from .resume import occupied, run_dir_problem, world_size_problem
from .run_lock import RunDirLock, clear_run_dir
from .schedule import build_scheduler, changed_schedule_factor, continue_schedule
from .signals import Interrupted, StopSignal
from .tasks import build_task
from .watchdog import CHECKPOINT, COMMIT, EVALUATION, EXCHANGE, StallWatchdog


def _group_options(opt) -> list[dict]:
    """Each param group's hyperparameters as configured (lr, momentum, weight decay, the
    kernel flags), taken before a schedule or a loaded state changes them."""
    return [{k: v for k, v in group.items() if k != "params"} for group in opt.param_groups]


def _configured(opt_state: dict, options: list[dict], lr: float | None = None) -> dict:
    """``opt_state`` with this run's hyperparameters in its param groups: torch's
    ``load_state_dict`` takes the saved ones, so a change ``run.resume_allow_changes``
    forced (optimizer.momentum, optimizer.implementation, which may change freely) would
    be silently undone. The learning rate stays the saved one (the schedule's position)
    unless ``lr`` (a forced change of the schedule) replaces it."""
    groups = []
    for saved, configured in zip(opt_state["param_groups"], options):
        group = {**saved, **{k: v for k, v in configured.items() if k not in ("lr", "initial_lr")}}
        if lr is not None:
            group.update(lr=lr * configured["lr"], initial_lr=configured["lr"])
        groups.append(group)
    return {**opt_state, "param_groups": groups}


def _prepare_run_dir(cfg: Config, run_dir: Path, resume: bool, comm: Comm,
                     lock: RunDirLock) -> None:
    """Rank 0 locks and checks the output directory; every rank gets its verdict."""
    problem = None
    if comm.rank == 0:
        # The lock first: nothing is read or deleted while another run uses the folder.
        problem = run_dir_problem(cfg, run_dir, resume) if lock.acquire() else lock.refusal()
        if problem is None and not resume and cfg.run.overwrite and occupied(run_dir):
            clear_run_dir(run_dir)
    problem = comm.broadcast_object(problem, name="gravac.run_dir")
    if problem:
        if comm.rank == 0:
            lock.abandon()
        raise ConfigError(problem)
    if comm.rank == 0 and not resume:    # a resume writes it once the checkpoint has loaded
        atomic_write_text(run_dir / "config.yaml", dump_yaml(cfg))


class Trainer:
    """One rank's run: task, model, wrapped optimizer, schedule, position and logging.

    Building it issues no collective (so a worker joining an elastic job can build one
    while the others wait in a state sync); ``start`` and ``run`` are collective.

    Example::

        comm = gravac.comm.init(cfg.run.backend, cfg.run.horovod_cycle_time_ms,
                                cfg.run.horovod_wait)
        trainer = Trainer(cfg, comm)
        trainer.start(resume=False)
        trainer.open_log()
        trainer.run()
        summary = trainer.finish()
    """

    def __init__(self, cfg: Config, comm: Comm, elastic: bool = False):
        self.cfg, self.comm = cfg, comm
        self.rank, self.world = comm.rank, comm.size
        if cfg.run.keep_freed_memory:
            keep_freed_memory()
        torch.set_num_threads(cfg.run.threads or max(1, (os.cpu_count() or 1) // comm.local_size))
        torch.manual_seed(cfg.run.seed)
        random.seed(cfg.run.seed)
        self.device = rank_device(cfg.run.device, comm)
        self.task = build_task(cfg, self.rank, self.world).to(self.device)
        self.model = self.task.model
        self.method = build_method(cfg, comm)
        self.opt = self.method.build_optimizer(self.model, defer_agreement=elastic)
        self._options = _group_options(self.opt)
        # The task's forward (and so backward) goes through DDP where the method is DDP,
        # which averages the gradients; checkpoints and evaluation keep the bare model.
        self.task.model = self.method.wrap_model(self.model)
        self.scheduler = build_scheduler(self.opt, cfg.optimizer)
        self.total_steps = cfg.run.steps or cfg.run.epochs * self.task.steps_per_epoch
        self.run_dir = Path(cfg.run.output_dir) / cfg.run.name
        self._run_lock = RunDirLock(self.run_dir)    # rank 0 takes it in start()
        #: Watches run() and finish()'s final evaluation and checkpoint; keeps what it
        #: measured between them.
        self.watchdog = StallWatchdog(cfg.run.stall_timeout, self.rank)
        # None for the plain dense baselines (Horovod's optimizer, DDP); gravac's has one.
        self.controller = self.method.controller(self.opt)
        self.dense_numel = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        self.step = self.epoch = self.batch_in_epoch = 0
        self.elapsed0 = 0.0
        self.cum_floats = self.cum_dense = 0
        self.resumed = False
        self._final, self._final_at, self._resumed_at = None, None, None
        self.stop: StopSignal | None = None      # SIGINT/SIGTERM agreement (train() sets it)
        self.started = False                     # elastic: set once the run has begun
        self.log = RunLogger(self.run_dir, enabled=False, total_steps=0)
        self.rank_log = RankPhaseLog(self.run_dir, self.rank, enabled=False)
        self._clock0 = time.perf_counter()
        self._decisions_logged = 0

    # -- set-up ---------------------------------------------------------------------------
    def release_run_dir(self) -> None:
        """Let another run use the run folder (rank 0 held it since ``start``; ``finish``
        and ``train`` let it go)."""
        self._run_lock.release()

    def describe(self) -> str:
        cfg, opt = self.cfg, self.opt
        params = sum(p.numel() for p in self.model.parameters())
        lines = [f"model {cfg.model.name}: {params:,} parameters; data {cfg.data.name}: "
                 f"{self.task.steps_per_epoch} steps per epoch at batch {cfg.data.batch_size} "
                 f"per rank x {self.world} ranks; {self.total_steps} steps"]
        lines.append(self.method.describe(opt))
        line = (f"transport {self.comm.backend}: {self.world} rank(s); device "
                f"{describe_device(self.device)}")
        if self.comm.backend == "horovod":
            from ..comm.horovod import wait_mode
            mode, why = wait_mode()
            line += (f"; Horovod cycle {os.environ.get('HOROVOD_CYCLE_TIME', '1')} ms; waits "
                     f"{mode} ({why})")
        lines.append(line)
        ctrl = self.controller
        if isinstance(ctrl, GraVAC) and ctrl.window >= self.total_steps:
            # GraVAC moves its CFs only when a window ends: a short run whose window was left
            # at its default (500) would train as a static one and say nothing.
            lines.append(f"warning: compression.gravac.window={ctrl.window} is not shorter than "
                         f"the run's {self.total_steps} steps: no window ends before the run "
                         "does, so GraVAC never changes its CFs; lower the window or raise "
                         "run.steps")
        return "\n".join(lines)

    def elapsed(self) -> float:
        """Training time so far, across resumes and elastic resets."""
        return self.elapsed0 + time.perf_counter() - self._clock0

    def start(self, resume: bool) -> None:
        """Collective: claim the run directory, then resume or broadcast rank 0's model."""
        rank, comm = self.rank, self.comm
        _prepare_run_dir(self.cfg, self.run_dir, resume, comm, self._run_lock)
        self.resumed = resume
        if not resume:
            comm.broadcast_parameters(self.model.state_dict())
            broadcast_optimizer_state(self.opt, comm)
            self._clock0 = time.perf_counter()
            return
        common, rank_state, info = load_checkpoint(
            self.run_dir, comm, log=lambda text: print(f"[rank {rank}] {text}", flush=True))
        problem = world_size_problem(info["world_size"], self.world)
        if problem:
            raise ConfigError(problem)
        try:
            self.model.load_state_dict(common["model"])
        except RuntimeError as exc:       # every rank builds the same model: all fail here
            first = next((line.strip() for line in str(exc).splitlines()[1:] if line.strip()),
                         str(exc))
            raise ConfigError(f"--resume: the checkpoint in {self.run_dir / 'checkpoints'} "
                              f"holds another model ({first}); resume with the run's "
                              "model settings or start a new run") from None
        # A schedule changed under run.resume_allow_changes goes on from the saved step.
        factor = changed_schedule_factor(common["scheduler"], self.cfg.optimizer,
                                         (common.get("config") or {}).get("optimizer"))
        try:
            self.opt.load_state_dict(_configured(rank_state["optimizer"], self._options, factor))
        except ValueError as exc:    # a controller's state saved with other settings
            raise ConfigError(f"--resume: the optimizer state in "
                              f"{self.run_dir / 'checkpoints' / info['dir']} does not fit this "
                              f"run's ({exc}); a controller's state cannot be carried over to "
                              "other compression settings, even forced: resume with the run's "
                              "own or start a new run") from None
        continue_schedule(self.scheduler, common["scheduler"], changed=factor is not None)
        set_rng_state(rank_state["rng"])
        self.task.load_state_dict(rank_state["task"])
        self.step, self.epoch = common["step"], common["epoch"]
        # A finished run's last checkpoint holds its final evaluation (None before that).
        self._final, self._resumed_at = common.get("final"), self.step
        self._final_at = self.step if self._final is not None else None
        self.batch_in_epoch = common["batch_in_epoch"]
        self.elapsed0 = common["elapsed"]
        self.cum_floats, self.cum_dense = common["cum_floats"], common["cum_dense"]
        self._clock0 = time.perf_counter()
        if rank == 0:
            atomic_write_text(self.run_dir / "config.yaml", dump_yaml(self.cfg))
            truncate_metrics(self.run_dir, self.step)
            print(f"resuming from step {self.step} "
                  f"({self.run_dir / 'checkpoints' / info['dir']})", flush=True)

    def open_log(self, record: dict | None = None) -> None:
        """(Re)open the metrics/TensorBoard writers on rank 0 and say what runs."""
        self.close_log()
        self.log = RunLogger(self.run_dir, enabled=self.rank == 0, total_steps=self.total_steps,
                             progress=self.cfg.run.progress, initial_step=self.step)
        self.rank_log = RankPhaseLog(self.run_dir, self.rank, enabled=self.cfg.run.rank_phases)
        self._decisions_logged = self.controller.decisions_made if self.controller else 0
        self.log.record(record or new_record(
            RUN_START, name=self.cfg.run.name, time=self.elapsed(), step=self.step,
            world_size=self.world, **self.method.start_fields(),
            model=self.cfg.model.name, dataset=self.cfg.data.name,
            batch_size=self.cfg.data.batch_size, metric=self.task.metric,
            total_steps=self.total_steps, resumed=self.resumed,
            elastic=bool(self.cfg.run.elastic), backend=self.comm.backend,
            device=describe_device(self.device), gravac=describe_gravac()))
        self.log.message(self.describe())

    def close_log(self) -> None:
        self.log.close()
        self.rank_log.close()

    # -- in-memory state (Horovod Elastic commits) ------------------------------------------
    #: The loop position a snapshot carries (shared: rank 0's wins on a sync).
    POSITION = ("step", "epoch", "batch_in_epoch", "cum_floats", "cum_dense", "world",
                "total_steps", "started", "resumed")

    def snapshot(self) -> dict:
        """The trainer's state deep-copied to host memory: ``model``, ``shared`` (what
        every rank takes from rank 0 on a sync: optimizer, controller, schedule, position)
        and ``local`` (this process's own: residuals, compressor and RNG states, data)."""
        opt_state = self.opt.state_dict()
        extra = opt_state.pop(STATE_KEY, None)
        local = {"rng": rng_state(), "task": self.task.state_dict()}
        if extra is not None:
            extra = dict(extra)
            local["memory"] = extra.pop("memory")
            local["compressor"] = extra.pop("compressor")
        shared = {"optimizer": opt_state, "gravac": extra, "scheduler": self.scheduler.state_dict(),
                  "position": {k: getattr(self, k) for k in self.POSITION}}
        return copy.deepcopy({"model": self.model.state_dict(), "shared": shared, "local": local})

    def restore(self, model_state: dict | None, shared: dict, local: dict) -> None:
        """Load what ``snapshot`` returned (``model_state`` None: keep the model)."""
        if model_state is not None:
            self.model.load_state_dict(model_state)
        opt_state = copy.deepcopy(shared["optimizer"])
        if shared["gravac"] is not None:
            extra = copy.deepcopy(shared["gravac"])
            extra["memory"] = copy.deepcopy(local["memory"])
            extra["compressor"] = copy.deepcopy(local["compressor"])
            opt_state[STATE_KEY] = extra
        # Also drops gradient handles a failed collective left behind (Horovod's optimizer
        # clears them in load_state_dict; gravac's resets its step flags).
        self.opt.load_state_dict(_configured(opt_state, self._options))
        self.scheduler.load_state_dict(copy.deepcopy(shared["scheduler"]))
        for key, value in shared["position"].items():
            setattr(self, key, value)
        set_rng_state(local["rng"])
        self.task.load_state_dict(copy.deepcopy(local["task"]))

    def restart_clock(self, elapsed: float) -> None:
        """Continue the training-time clock from ``elapsed`` seconds."""
        self.elapsed0, self._clock0 = elapsed, time.perf_counter()

    def reattach(self, comm: Comm) -> int | None:
        """Adopt a new set of ranks (an elastic reset). Collective over ``comm``. Returns
        the world size the position was reached with when it differs, else None."""
        # Every rank must stand at the same step, or the collectives below would pair up
        # wrongly; also orders this after every rank has left the previous attempt.
        steps = comm.allgather_object(self.step, name="gravac.elastic.attach")
        if len(set(steps)) != 1:
            raise RuntimeError(f"elastic reset: ranks stand at different steps {steps}; the "
                               "committed states differ, which must not happen")
        rank, world = comm.rank, comm.size
        previous = self.world if self.world != world else None
        if (rank, world) != (self.task.rank, self.task.world_size) or previous is not None:
            self.batch_in_epoch = self.task.reshard(rank, world, self.batch_in_epoch, self.world)
            if self.cfg.run.epochs is not None:
                spe = self.task.steps_per_epoch
                self.total_steps = (self.step + (spe - self.batch_in_epoch)
                                    + (self.cfg.run.epochs - self.epoch - 1) * spe)
        self.comm, self.rank, self.world = comm, rank, world
        self.method.reset_world(self.opt, comm)
        return previous

    # -- work -----------------------------------------------------------------------------
    def checkpoint(self) -> Path:
        common = {"model": self.model.state_dict(), "scheduler": self.scheduler.state_dict(),
                  "step": self.step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
                  "elapsed": self.elapsed(), "cum_floats": self.cum_floats,
                  "cum_dense": self.cum_dense, "config": to_dict(self.cfg),
                  "world_size": self.world,
                  # the final evaluation, in the checkpoint of the step it was made at only
                  "final": self._final if self._final_at == self.step else None}
        rank_state = {"optimizer": self.opt.state_dict(), "rng": rng_state(),
                      "task": self.task.state_dict()}
        return save_checkpoint(self.run_dir, self.step, common, rank_state, self.comm,
                               self.cfg.run.keep_checkpoints)

    def evaluate(self) -> dict:
        result = self.task.evaluate(self.cfg.run.eval_batches, self.comm)
        self.log.record(new_record(EVAL, step=self.step, time=self.elapsed(), **result))
        shown = ", ".join(f"{k} {v:.4g}" for k, v in result.items())
        self.log.message(f"step {self.step}: {shown}")
        return result

    def run(self, after_step=None) -> None:
        """Train from the current position to ``total_steps``. ``after_step()`` runs after
        every step on every rank (elastic commits)."""
        cfg, opt, method = self.cfg, self.opt, self.method
        self.model.train()
        # Watched while training (not between: an elastic reset's re-rendezvous is not a
        # stall); finish() watches its final evaluation and checkpoint with what this
        # measured.
        watchdog = self.watchdog.start()
        samples_per_step = cfg.data.batch_size * self.world
        batches = self.task.batches(self.epoch, self.batch_in_epoch)
        next_stop_check = self.step + 1     # the first step's time sets the interval
        try:
            while self.step < self.total_steps:
                # A step's time starts here: the logging, evaluation and checkpoint after
                # the previous step are not training time (nor in the controller's table).
                last_end = time.perf_counter()
                method.begin_step(opt)
                batch = next(batches, None)
                if batch is None:                  # end of an epoch, the same step on all ranks
                    if self.controller is not None:
                        self.controller.on_epoch_end()   # Accordion's default interval
                    self.epoch, self.batch_in_epoch = self.epoch + 1, 0
                    batches = self.task.batches(self.epoch, 0)
                    continue
                opt.zero_grad()
                loss = self.task.loss(batch)
                loss.backward()
                watchdog.phase(EXCHANGE)
                method.step(opt, self.model.parameters(), cfg.optimizer.grad_clip)
                lr = opt.param_groups[0]["lr"]
                self.scheduler.step()
                self.step += 1
                self.batch_in_epoch += 1
                t_iter = time.perf_counter() - last_end
                self._log_step(loss, lr, t_iter, samples_per_step)
                watchdog.beat()
                step = self.step
                if self.stop is not None and step >= next_stop_check:
                    # collective, at the same steps on every rank (from agreed numbers)
                    signum, every = self.stop.agreed(self.comm, step, t_iter,
                                                     cfg.run.stop_check_interval)
                    next_stop_check = step + every
                    if signum:
                        with watchdog.timed(CHECKPOINT):
                            where = self.checkpoint()
                        raise Interrupted(signum, step, str(where))
                if cfg.run.eval_interval and step % cfg.run.eval_interval == 0 \
                        and step < self.total_steps:
                    with watchdog.timed(EVALUATION):
                        self.evaluate()
                if cfg.run.checkpoint_interval and step % cfg.run.checkpoint_interval == 0 \
                        and step < self.total_steps:
                    with watchdog.timed(CHECKPOINT):
                        self.checkpoint()
                if after_step is not None:
                    with watchdog.timed(COMMIT):
                        after_step()
        finally:
            watchdog.stop()

    def _log_step(self, loss, lr: float, t_iter: float, samples_per_step: int) -> None:
        stats = self.method.step_stats(self.opt, self.step - 1, self.dense_numel)
        step, elapsed = self.step, self.elapsed()
        if stats.skipped:
            self.log.record(new_record(NONFINITE, step=step, time=elapsed,
                                       ranks=stats.nonfinite_ranks))
            self.log.message(f"step {step}: non-finite gradient on rank(s) "
                             f"{stats.nonfinite_ranks}; step skipped on every rank")
        self.cum_floats += stats.floats_sent
        self.cum_dense += stats.dense_floats
        if step % self.cfg.run.log_interval == 0 or step == 1 or step == self.total_steps:
            entry = step_record(stats, step=step, epoch=self.epoch, time=elapsed,
                                loss=loss.item(), lr=lr, world_size=self.world,
                                cum_floats_sent=self.cum_floats,
                                cum_dense_floats=self.cum_dense, t_iter=t_iter,
                                samples_per_sec=samples_per_step / t_iter if t_iter > 0
                                else None)
            self.log.record(entry)
            self.rank_log.record({k: entry[k] for k in RANK_STEP_FIELDS})
            self.log.progress(step, loss=entry["loss"], cf=stats.cf,
                              samples_per_sec=entry["samples_per_sec"])
        controller = self.controller
        made = controller.decisions_made if controller is not None else 0
        if made > self._decisions_logged:
            # ``decisions`` holds the latest records only (DECISIONS_KEPT): the new ones
            # are its last, numbered from the count of all made.
            new = controller.decisions[-(made - self._decisions_logged):]
            for number, d in enumerate(new, start=made - len(new) + 1):
                if "table" in d:                   # GraVAC window decisions
                    # "step" counts steps done, as step and eval records do (the controller
                    # indexes steps from 0); "window" numbers windows from 1.
                    fields = {**{k: v for k, v in d.items() if k != "table"},
                              "step": d["step"] + 1, "window": number,
                              "table": {str(k): v for k, v in d["table"].items()}}
                    self.log.record(new_record(WINDOW, time=elapsed, **fields))
                elif "event" in d:                 # Auto's method events
                    self.log.record(new_record(METHOD, time=elapsed,
                                               **{**d, "step": d["step"] + 1}))
            self._decisions_logged = made

    def finish(self) -> dict:
        """Collective: final evaluation and checkpoint; rank 0 closes the log and reports."""
        if self._final is not None and self.step == self._resumed_at:
            # --resume of a run that had finished: its final evaluation and checkpoint are
            # in place already (every rank read the same checkpoint, so all skip them)
            final, elapsed = self._final, self.elapsed()
            self.log.message(f"the run had finished its {self.step} steps already; "
                             "raise run.steps to train on")
        else:
            if self.step == self._resumed_at and self.total_steps < self.step:
                # a resume with fewer steps than done: nothing trains; said, not silent
                self.log.message(f"the checkpoint is at step {self.step}, past the run's "
                                 f"{self.total_steps} steps (run.steps, run.epochs): the run "
                                 "ends there; raise them to train on")
            try:
                self.watchdog.start()
                with self.watchdog.timed(EVALUATION):
                    final = self._final = self.evaluate()
                self._final_at = self.step
                with self.watchdog.timed(CHECKPOINT):
                    self.checkpoint()
            finally:
                self.watchdog.stop()
            elapsed = self.elapsed()
        # resuming drops run_end records (truncate_metrics): the run ends here again
        self.log.record(new_record(RUN_END, step=self.step, time=elapsed, final=final))
        self.close_log()
        if self.rank == 0:
            _finish(self.cfg, self.run_dir, self.step, elapsed, final)
        self.release_run_dir()
        return {"run_dir": str(self.run_dir), "steps": self.step, "final": final,
                "time": elapsed}


def train(cfg: Config, resume: bool = False, dry_run: bool = False) -> dict:
    """Run (or with ``dry_run``, only build and describe) the configured training."""
    prepare_environment(cfg)
    comm = init_comm(cfg.run.backend, cfg.run.horovod_cycle_time_ms, cfg.run.horovod_wait,
                     elastic=cfg.run.elastic, gpu=wants_gpu(cfg.run.device))
    trainer = Trainer(cfg, comm, elastic=cfg.run.elastic)
    if dry_run:
        if trainer.rank == 0:
            print(dump_yaml(cfg), end="")
            print(trainer.describe())
        comm.close()
        return {"run_dir": str(trainer.run_dir), "dry_run": True}
    trainer.stop = StopSignal(trainer.rank).install()
    try:
        if cfg.run.elastic:
            from .elastic import train_elastic

            return train_elastic(trainer, resume)
        trainer.start(resume)
        trainer.open_log()
        try:
            trainer.run()
            result = trainer.finish()
        finally:
            trainer.close_log()
        # Only after a run that ended on every rank: a failed rank's peers are stopped by
        # the launcher (or the stall watchdog), not kept waiting in a barrier.
        comm.close()
        return result
    except Interrupted as stop:
        if trainer.rank == 0:
            print(stop, flush=True)              # "interrupted by SIGTERM at step N: ..."
        raise
    finally:
        trainer.watchdog.stop()
        trainer.stop.uninstall()
        trainer.release_run_dir()


def _finish(cfg: Config, run_dir: Path, step: int, elapsed: float, final: dict) -> None:
    shown = ", ".join(f"{k} {v:.4g}" for k, v in final.items())
    print(f"finished {step} steps in {elapsed:.1f}s: {shown}")
    print(f"metrics:     {run_dir / METRICS_FILE}")
    print(f"tensorboard: tensorboard --logdir {run_dir / 'tensorboard'}")
    if cfg.run.report:
        # Imported here, not at the top: the report needs matplotlib, training does not.
        from ..report import build_report
        try:
            path = build_report([run_dir], out_dir=run_dir)
            print(f"report:      {path}")
        except (OSError, ValueError) as exc:
            # The run itself succeeded; say why there is no report instead of failing it.
            print(f"report not written: {exc}")
