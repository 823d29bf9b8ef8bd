"""The training loop behind ``train.py``: build, (resume,) train, evaluate, checkpoint, log.

``train(cfg, resume=False, dry_run=False)`` runs on every rank under horovodrun. Every
collective (gradient exchange, evaluation sums, checkpoint barrier, controller windows)
happens at steps all ranks agree on, because every rank runs the same number of steps
per epoch and the same schedule.

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


def build_optimizer(cfg: Config, model: torch.nn.Module):
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
                                       max_consecutive_skips=c.max_consecutive_skips)


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


def _describe(cfg: Config, task, opt, total_steps: int, world_size: int) -> str:
    params = sum(p.numel() for p in task.model.parameters())
    lines = [f"model {cfg.model.name}: {params:,} parameters; data {cfg.data.name}: "
             f"{task.steps_per_epoch} steps per epoch at batch {cfg.data.batch_size} per rank "
             f"x {world_size} ranks; {total_steps} steps"]
    if hasattr(opt, "compressed_layer_names"):
        names = opt.compressed_layer_names
        lines.append(f"compressor {cfg.compression.compressor}, controller "
                     f"{opt.controller!r}; {len(names)} of {len(opt.layer_names)} layers compressed")
    else:
        lines.append(f"dense Horovod allreduce (compression {cfg.compression.horovod_compression})")
    return "\n".join(lines)


def _step_stats(opt, dense_numel: int) -> dict:
    stats = getattr(opt, "last_stats", None)
    if stats:
        return dict(stats)
    return {"cf": 1.0, "sent": "dense", "floats_sent": dense_numel, "dense_floats": dense_numel,
            "theta_min": None, "theta_c": None, "gain_min": None, "gain_c": None,
            "t_compute": None, "t_compress": None, "t_comm": None}


def train(cfg: Config, resume: bool = False, dry_run: bool = False) -> dict:
    """Run (or with ``dry_run``, only build and describe) the configured training."""
    import horovod.torch as hvd

    hvd.init()
    rank, world = hvd.rank(), hvd.size()
    torch.set_num_threads(cfg.run.threads or max(1, (os.cpu_count() or 1) // hvd.local_size()))
    torch.manual_seed(cfg.run.seed)
    random.seed(cfg.run.seed)

    task = build_task(cfg, rank, world)
    model = task.model
    opt = build_optimizer(cfg, model)
    o = cfg.optimizer
    scheduler = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=o.lr_milestones,
                                                     gamma=o.lr_gamma)
    total_steps = cfg.run.steps or cfg.run.epochs * task.steps_per_epoch
    run_dir = Path(cfg.run.output_dir) / cfg.run.name
    if dry_run:
        if rank == 0:
            print(dump_yaml(cfg), end="")
            print(_describe(cfg, task, opt, total_steps, world))
        return {"run_dir": str(run_dir), "dry_run": True}

    _prepare_run_dir(cfg, run_dir, resume, rank)
    step = epoch = batch_in_epoch = 0
    elapsed0 = 0.0
    cum_floats = cum_dense = 0
    if resume:
        common, rank_state, info = load_checkpoint(
            run_dir, rank, log=lambda text: print(f"[rank {rank}] {text}", flush=True))
        if info["world_size"] != world:
            raise ConfigError(f"--resume: the checkpoint was written by {info['world_size']} ranks, "
                              f"this job has {world}; run with -np {info['world_size']}")
        model.load_state_dict(common["model"])
        opt.load_state_dict(rank_state["optimizer"])
        scheduler.load_state_dict(common["scheduler"])
        set_rng_state(rank_state["rng"])
        task.load_state_dict(rank_state["task"])
        step, epoch, batch_in_epoch = common["step"], common["epoch"], common["batch_in_epoch"]
        elapsed0 = common["elapsed"]
        cum_floats, cum_dense = common["cum_floats"], common["cum_dense"]
        if rank == 0:
            truncate_metrics(run_dir, step)
            print(f"resuming from step {step} ({run_dir / 'checkpoints' / info['dir']})", flush=True)
    else:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)

    log = RunLogger(run_dir, enabled=rank == 0, total_steps=total_steps,
                    progress=cfg.run.progress, initial_step=step)
    controller = getattr(opt, "controller", None)
    decisions_logged = len(controller.decisions) if controller is not None else 0
    dense_numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
    samples_per_step = cfg.data.batch_size * world
    c = cfg.compression
    log.record({"kind": "run_start", "name": cfg.run.name, "time": elapsed0, "step": step,
                "world_size": world, "controller": c.controller,
                "compressor": c.compressor if c.controller != "dense" else c.horovod_compression,
                "model": cfg.model.name, "dataset": cfg.data.name,
                "batch_size": cfg.data.batch_size, "metric": task.metric,
                "total_steps": total_steps, "resumed": resume})
    log.message(_describe(cfg, task, opt, total_steps, world))

    def checkpoint():
        common = {"model": model.state_dict(), "scheduler": scheduler.state_dict(),
                  "step": step, "epoch": epoch, "batch_in_epoch": batch_in_epoch,
                  "elapsed": elapsed0 + time.perf_counter() - start,
                  "cum_floats": cum_floats, "cum_dense": cum_dense,
                  "config": to_dict(cfg), "world_size": world}
        rank_state = {"optimizer": opt.state_dict(), "rng": rng_state(),
                      "task": task.state_dict()}
        save_checkpoint(run_dir, step, common, rank_state, rank, world, cfg.run.keep_checkpoints)

    def evaluate():
        result = task.evaluate(cfg.run.eval_batches)
        entry = {"kind": "eval", "step": step,
                 "time": elapsed0 + time.perf_counter() - start, **result}
        log.record(entry)
        shown = ", ".join(f"{k} {v:.4g}" for k, v in result.items())
        log.message(f"step {step}: {shown}")
        return result

    model.train()
    watchdog = StallWatchdog(cfg.run.stall_timeout, rank).start()
    start = time.perf_counter()
    last_end = start
    final = {}
    batches = task.batches(epoch, batch_in_epoch)
    while step < total_steps:
        batch = next(batches, None)
        if batch is None:                        # end of an epoch, the same step on all ranks
            if getattr(controller, "interval_steps", 0) is None:
                controller.end_interval()        # Accordion's default interval: one epoch
            epoch, batch_in_epoch = epoch + 1, 0
            batches = task.batches(epoch, 0)
            continue
        opt.zero_grad()
        loss = task.loss(batch)
        loss.backward()
        if o.grad_clip is not None:
            opt.synchronize()                    # clip the averaged gradient, as Horovod advises
            torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
        lr = opt.param_groups[0]["lr"]
        scheduler.step()
        step += 1
        batch_in_epoch += 1
        now = time.perf_counter()
        t_iter, last_end = now - last_end, now

        stats = _step_stats(opt, dense_numel)
        if stats["sent"] == "skipped":
            log.record({"kind": "nonfinite", "step": step, "time": elapsed0 + now - start,
                        "ranks": stats["nonfinite_ranks"]})
            log.message(f"step {step}: non-finite gradient on rank(s) "
                        f"{stats['nonfinite_ranks']}; step skipped on every rank")
        cum_floats += stats["floats_sent"]
        cum_dense += stats["dense_floats"]
        if step % cfg.run.log_interval == 0 or step == 1 or step == total_steps:
            entry = {"kind": "step", "step": step, "epoch": epoch,
                     "time": elapsed0 + now - start, "loss": loss.item(), "lr": lr,
                     "cf": stats["cf"], "sent": stats["sent"],
                     "theta_min": stats.get("theta_min"), "theta_c": stats.get("theta_c"),
                     "gain_min": stats.get("gain_min"), "gain_c": stats.get("gain_c"),
                     "delta_min": getattr(controller, "delta_min", None),
                     "delta_c": getattr(controller, "delta_c", None),
                     "floats_sent": stats["floats_sent"], "cum_floats_sent": cum_floats,
                     "dense_floats": stats["dense_floats"], "cum_dense_floats": cum_dense,
                     "t_compute": stats.get("t_compute"), "t_compress": stats.get("t_compress"),
                     "t_comm": stats.get("t_comm"), "t_iter": t_iter,
                     "samples_per_sec": samples_per_step / t_iter if t_iter > 0 else None}
            log.record(entry)
            log.progress(step, loss=entry["loss"], cf=stats["cf"],
                         samples_per_sec=entry["samples_per_sec"])
        if controller is not None and len(controller.decisions) > decisions_logged:
            for d in controller.decisions[decisions_logged:]:
                if "table" in d:                 # GraVAC window decisions
                    log.record({"kind": "window", "time": elapsed0 + now - start,
                                **{k: v for k, v in d.items() if k != "table"},
                                "table": {str(k): v for k, v in d["table"].items()}})
            decisions_logged = len(controller.decisions)
        watchdog.beat()
        if cfg.run.eval_interval and step % cfg.run.eval_interval == 0 and step < total_steps:
            with watchdog.paused():
                evaluate()
        if cfg.run.checkpoint_interval and step % cfg.run.checkpoint_interval == 0 \
                and step < total_steps:
            with watchdog.paused():
                checkpoint()

    with watchdog.paused():
        final = evaluate()
        checkpoint()
    watchdog.stop()
    elapsed = elapsed0 + time.perf_counter() - start
    log.record({"kind": "run_end", "step": step, "time": elapsed, "final": final})
    log.close()
    if rank == 0:
        _finish(cfg, run_dir, step, elapsed, final)
    return {"run_dir": str(run_dir), "steps": step, "final": final, "time": elapsed}


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
