"""The training loop behind ``train.py``: build, (resume,) train, evaluate, checkpoint, log.

``train(cfg, resume=False, dry_run=False)`` runs on every rank under horovodrun. Every
collective (gradient exchange, evaluation sums, checkpoint barrier, controller windows)
happens at steps all ranks agree on, because every rank runs the same number of steps
per epoch and the same schedule. With ``run.elastic`` the same ``Trainer`` runs under
Horovod Elastic (``gravac/train/elastic.py``).

Example::

    cfg = load_config(["configs/demo.yaml"])
    summary = train(cfg)         # {"run_dir": ..., "final": {...}, "steps": ...}
"""
from __future__ import annotations

import os
import random
import shutil
import time
from pathlib import Path

import torch

from .checkpoint import latest_info, load_checkpoint, rng_state, save_checkpoint, set_rng_state
from .config import Config, ConfigError, build_controller, dump_yaml, to_dict
from .monitor import METRICS, RunLogger, truncate_metrics
from .tasks import build_task
from .watchdog import StallWatchdog


def build_optimizer(cfg: Config, model: torch.nn.Module, defer_agreement: bool = False):
    """The wrapped optimizer: plain Horovod for ``dense``, gravac's otherwise."""
    import horovod.torch as hvd

    import gravac

    o = cfg.optimizer
    base = torch.optim.SGD(model.parameters(), lr=o.lr, momentum=o.momentum,
                           weight_decay=o.weight_decay, nesterov=o.nesterov)
    c = cfg.compression
    if c.controller == "dense":
        compression = hvd.Compression.fp16 if c.horovod_compression == "fp16" else hvd.Compression.none
        return hvd.DistributedOptimizer(base, named_parameters=model.named_parameters(),
                                        compression=compression)
    return gravac.DistributedOptimizer(base, model.named_parameters(), compressor=c.compressor,
                                       compressor_options=c.compressor_options,
                                       controller=build_controller(c),
                                       min_compress_numel=c.min_compress_numel,
                                       batch_size=cfg.data.batch_size,
                                       nonfinite=c.nonfinite,
                                       max_consecutive_skips=c.max_consecutive_skips,
                                       defer_agreement=defer_agreement)


def _prepare_run_dir(cfg: Config, run_dir: Path, resume: bool, rank: int) -> None:
    """Rank 0 checks the output directory; every rank gets its verdict."""
    import horovod.torch as hvd

    problem = None
    if rank == 0:
        occupied = (run_dir / METRICS).exists() or (run_dir / "checkpoints").exists()
        if resume:
            if latest_info(run_dir) is None:
                problem = (f"--resume: no checkpoint in {run_dir / 'checkpoints'}; start without "
                           "--resume, or set run.output_dir/run.name to the run to continue")
        elif occupied and not cfg.run.overwrite:
            problem = (f"{run_dir} already holds a run; continue it with --resume, replace it "
                       "with --set run.overwrite=true, or choose another run.name")
        elif occupied:
            shutil.rmtree(run_dir)
    problem = hvd.broadcast_object(problem, root_rank=0, name="gravac.run_dir")
    if problem:
        raise ConfigError(problem)
    if rank == 0:
        from .atomic import atomic_write_text

        atomic_write_text(run_dir / "config.yaml", dump_yaml(cfg))


def _step_stats(opt, dense_numel: int) -> dict:
    stats = getattr(opt, "last_stats", None)
    if stats:
        return dict(stats)
    return {"cf": 1.0, "sent": "dense", "floats_sent": dense_numel, "dense_floats": dense_numel,
            "theta_min": None, "theta_c": None, "gain_min": None, "gain_c": None,
            "t_compute": None, "t_compress": None, "t_comm": None}


class Trainer:
    """One rank's run: task, model, wrapped optimizer, schedule, position and logging.

    Building it issues no collective (so a worker joining an elastic job can build one
    while the others wait in a state sync); ``start`` and ``run`` are collective.

    Example::

        hvd.init()
        trainer = Trainer(cfg)
        trainer.start(resume=False)
        trainer.open_log()
        trainer.run()
        summary = trainer.finish()
    """

    def __init__(self, cfg: Config, elastic: bool = False):
        import horovod.torch as hvd

        self.cfg = cfg
        self.rank, self.world = hvd.rank(), hvd.size()
        torch.set_num_threads(cfg.run.threads or max(1, (os.cpu_count() or 1) // hvd.local_size()))
        torch.manual_seed(cfg.run.seed)
        random.seed(cfg.run.seed)
        self.task = build_task(cfg, self.rank, self.world)
        self.model = self.task.model
        self.opt = build_optimizer(cfg, self.model, defer_agreement=elastic)
        o = cfg.optimizer
        self.scheduler = torch.optim.lr_scheduler.MultiStepLR(self.opt, milestones=o.lr_milestones,
                                                              gamma=o.lr_gamma)
        self.total_steps = cfg.run.steps or cfg.run.epochs * self.task.steps_per_epoch
        self.run_dir = Path(cfg.run.output_dir) / cfg.run.name
        self.controller = getattr(self.opt, "controller", None)
        self.dense_numel = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        self.step = self.epoch = self.batch_in_epoch = 0
        self.elapsed0 = 0.0
        self.cum_floats = self.cum_dense = 0
        self.resumed = False
        self.started = False                     # elastic: set once the run has begun
        self.log = RunLogger(self.run_dir, enabled=False, total_steps=0)
        self._clock0 = time.perf_counter()
        self._decisions_logged = 0

    # -- set-up ---------------------------------------------------------------------------
    def describe(self) -> str:
        cfg, opt = self.cfg, self.opt
        params = sum(p.numel() for p in self.model.parameters())
        lines = [f"model {cfg.model.name}: {params:,} parameters; data {cfg.data.name}: "
                 f"{self.task.steps_per_epoch} steps per epoch at batch {cfg.data.batch_size} "
                 f"per rank x {self.world} ranks; {self.total_steps} steps"]
        if hasattr(opt, "compressed_layer_names"):
            names = opt.compressed_layer_names
            lines.append(f"compressor {cfg.compression.compressor}, controller "
                         f"{opt.controller!r}; {len(names)} of {len(opt.layer_names)} layers "
                         "compressed")
        else:
            lines.append(f"dense Horovod allreduce (compression "
                         f"{cfg.compression.horovod_compression})")
        return "\n".join(lines)

    def elapsed(self) -> float:
        """Training time so far, across resumes and elastic resets."""
        return self.elapsed0 + time.perf_counter() - self._clock0

    def start(self, resume: bool) -> None:
        """Collective: claim the run directory, then resume or broadcast rank 0's model."""
        import horovod.torch as hvd

        rank = self.rank
        _prepare_run_dir(self.cfg, self.run_dir, resume, rank)
        self.resumed = resume
        if not resume:
            hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
            hvd.broadcast_optimizer_state(self.opt, root_rank=0)
            self._clock0 = time.perf_counter()
            return
        common, rank_state, info = load_checkpoint(
            self.run_dir, rank, log=lambda text: print(f"[rank {rank}] {text}", flush=True))
        if info["world_size"] != self.world:
            raise ConfigError(f"--resume: the checkpoint was written by {info['world_size']} "
                              f"ranks, this job has {self.world}; run with -np "
                              f"{info['world_size']}")
        self.model.load_state_dict(common["model"])
        self.opt.load_state_dict(rank_state["optimizer"])
        self.scheduler.load_state_dict(common["scheduler"])
        set_rng_state(rank_state["rng"])
        self.task.load_state_dict(rank_state["task"])
        self.step, self.epoch = common["step"], common["epoch"]
        self.batch_in_epoch = common["batch_in_epoch"]
        self.elapsed0 = common["elapsed"]
        self.cum_floats, self.cum_dense = common["cum_floats"], common["cum_dense"]
        self._clock0 = time.perf_counter()
        if rank == 0:
            truncate_metrics(self.run_dir, self.step)
            print(f"resuming from step {self.step} "
                  f"({self.run_dir / 'checkpoints' / info['dir']})", flush=True)

    def open_log(self, record: dict | None = None) -> None:
        """(Re)open the metrics/TensorBoard writers on rank 0 and say what runs."""
        import horovod.torch as hvd

        self.log.close()
        self.log = RunLogger(self.run_dir, enabled=self.rank == 0, total_steps=self.total_steps,
                             progress=self.cfg.run.progress, initial_step=self.step)
        self._decisions_logged = len(self.controller.decisions) if self.controller else 0
        c = self.cfg.compression
        self.log.record(record or {
            "kind": "run_start", "name": self.cfg.run.name, "time": self.elapsed(),
            "step": self.step, "world_size": self.world, "controller": c.controller,
            "compressor": c.compressor if c.controller != "dense" else c.horovod_compression,
            "model": self.cfg.model.name, "dataset": self.cfg.data.name,
            "batch_size": self.cfg.data.batch_size, "metric": self.task.metric,
            "total_steps": self.total_steps, "resumed": self.resumed,
            "elastic": bool(self.cfg.run.elastic), "horovod_size": hvd.size()})
        self.log.message(self.describe())

    def close_log(self) -> None:
        self.log.close()

    # -- work -----------------------------------------------------------------------------
    def checkpoint(self) -> None:
        common = {"model": self.model.state_dict(), "scheduler": self.scheduler.state_dict(),
                  "step": self.step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
                  "elapsed": self.elapsed(), "cum_floats": self.cum_floats,
                  "cum_dense": self.cum_dense, "config": to_dict(self.cfg),
                  "world_size": self.world}
        rank_state = {"optimizer": self.opt.state_dict(), "rng": rng_state(),
                      "task": self.task.state_dict()}
        save_checkpoint(self.run_dir, self.step, common, rank_state, self.rank, self.world,
                        self.cfg.run.keep_checkpoints)

    def evaluate(self) -> dict:
        result = self.task.evaluate(self.cfg.run.eval_batches)
        self.log.record({"kind": "eval", "step": self.step, "time": self.elapsed(), **result})
        shown = ", ".join(f"{k} {v:.4g}" for k, v in result.items())
        self.log.message(f"step {self.step}: {shown}")
        return result

    def run(self, after_step=None) -> None:
        """Train from the current position to ``total_steps``. ``after_step()`` runs after
        every step on every rank (elastic commits)."""
        cfg, opt, o = self.cfg, self.opt, self.cfg.optimizer
        self.model.train()
        watchdog = StallWatchdog(cfg.run.stall_timeout, self.rank).start()
        samples_per_step = cfg.data.batch_size * self.world
        last_end = time.perf_counter()
        batches = self.task.batches(self.epoch, self.batch_in_epoch)
        try:
            while self.step < self.total_steps:
                batch = next(batches, None)
                if batch is None:                  # end of an epoch, the same step on all ranks
                    if getattr(self.controller, "interval_steps", 0) is None:
                        self.controller.end_interval()   # Accordion's default: one epoch
                    self.epoch, self.batch_in_epoch = self.epoch + 1, 0
                    batches = self.task.batches(self.epoch, 0)
                    continue
                opt.zero_grad()
                loss = self.task.loss(batch)
                loss.backward()
                if o.grad_clip is not None:
                    opt.synchronize()              # clip the averaged gradient, as Horovod advises
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), o.grad_clip)
                    with opt.skip_synchronize():
                        opt.step()
                else:
                    opt.step()
                lr = opt.param_groups[0]["lr"]
                self.scheduler.step()
                self.step += 1
                self.batch_in_epoch += 1
                now = time.perf_counter()
                t_iter, last_end = now - last_end, now
                self._log_step(loss, lr, t_iter, samples_per_step)
                watchdog.beat()
                step = self.step
                if cfg.run.eval_interval and step % cfg.run.eval_interval == 0 \
                        and step < self.total_steps:
                    with watchdog.paused():
                        self.evaluate()
                if cfg.run.checkpoint_interval and step % cfg.run.checkpoint_interval == 0 \
                        and step < self.total_steps:
                    with watchdog.paused():
                        self.checkpoint()
                if after_step is not None:
                    with watchdog.paused():
                        after_step()
                    last_end = time.perf_counter()
        finally:
            watchdog.stop()

    def _log_step(self, loss, lr: float, t_iter: float, samples_per_step: int) -> None:
        stats = _step_stats(self.opt, self.dense_numel)
        step, elapsed = self.step, self.elapsed()
        if stats["sent"] == "skipped":
            self.log.record({"kind": "nonfinite", "step": step, "time": elapsed,
                             "ranks": stats["nonfinite_ranks"]})
            self.log.message(f"step {step}: non-finite gradient on rank(s) "
                             f"{stats['nonfinite_ranks']}; step skipped on every rank")
        self.cum_floats += stats["floats_sent"]
        self.cum_dense += stats["dense_floats"]
        if step % self.cfg.run.log_interval == 0 or step == 1 or step == self.total_steps:
            entry = {"kind": "step", "step": step, "epoch": self.epoch, "time": elapsed,
                     "loss": loss.item(), "lr": lr, "world_size": self.world,
                     "cf": stats["cf"], "sent": stats["sent"],
                     "theta_min": stats.get("theta_min"), "theta_c": stats.get("theta_c"),
                     "gain_min": stats.get("gain_min"), "gain_c": stats.get("gain_c"),
                     "delta_min": getattr(self.controller, "delta_min", None),
                     "delta_c": getattr(self.controller, "delta_c", None),
                     "floats_sent": stats["floats_sent"], "cum_floats_sent": self.cum_floats,
                     "dense_floats": stats["dense_floats"], "cum_dense_floats": self.cum_dense,
                     "t_compute": stats.get("t_compute"), "t_compress": stats.get("t_compress"),
                     "t_comm": stats.get("t_comm"), "t_iter": t_iter,
                     "samples_per_sec": samples_per_step / t_iter if t_iter > 0 else None}
            self.log.record(entry)
            self.log.progress(step, loss=entry["loss"], cf=stats["cf"],
                              samples_per_sec=entry["samples_per_sec"])
        controller = self.controller
        if controller is not None and len(controller.decisions) > self._decisions_logged:
            for d in controller.decisions[self._decisions_logged:]:
                if "table" in d:                   # GraVAC window decisions
                    self.log.record({"kind": "window", "time": elapsed,
                                     **{k: v for k, v in d.items() if k != "table"},
                                     "table": {str(k): v for k, v in d["table"].items()}})
            self._decisions_logged = len(controller.decisions)

    def finish(self) -> dict:
        """Collective: final evaluation and checkpoint; rank 0 closes the log and reports."""
        final = self.evaluate()
        self.checkpoint()
        elapsed = self.elapsed()
        self.log.record({"kind": "run_end", "step": self.step, "time": elapsed, "final": final})
        self.log.close()
        if self.rank == 0:
            _finish(self.cfg, self.run_dir, self.step, elapsed, final)
        return {"run_dir": str(self.run_dir), "steps": self.step, "final": final,
                "time": elapsed}


def train(cfg: Config, resume: bool = False, dry_run: bool = False) -> dict:
    """Run (or with ``dry_run``, only build and describe) the configured training."""
    import horovod.torch as hvd

    hvd.init()
    trainer = Trainer(cfg, elastic=cfg.run.elastic)
    if dry_run:
        if trainer.rank == 0:
            print(dump_yaml(cfg), end="")
            print(trainer.describe())
        return {"run_dir": str(trainer.run_dir), "dry_run": True}
    if cfg.run.elastic:
        from .elastic import train_elastic

        return train_elastic(trainer, resume)
    trainer.start(resume)
    trainer.open_log()
    try:
        trainer.run()
        return trainer.finish()
    finally:
        trainer.close_log()


def _finish(cfg: Config, run_dir: Path, step: int, elapsed: float, final: dict) -> None:
    shown = ", ".join(f"{k} {v:.4g}" for k, v in final.items())
    print(f"finished {step} steps in {elapsed:.1f}s: {shown}")
    print(f"metrics:     {run_dir / METRICS}")
    print(f"tensorboard: tensorboard --logdir {run_dir / 'tensorboard'}")
    if cfg.run.report:
        try:
            from ..report import build_report
        except ImportError:
            return
        try:
            path = build_report([run_dir], out_dir=run_dir)
            print(f"report:      {path}")
        except (OSError, ValueError) as exc:
            # The run itself succeeded; say why there is no report instead of failing it.
            print(f"report not written: {exc}")
