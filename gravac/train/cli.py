"""Command line of ``train.py``.

    horovodrun -np N python train.py --config FILE [FILE ...] [--set key=value ...]
                                     [--dry-run] [--resume] [--check [LAUNCHER] [--here] [--ranks N]]
    torchrun --nproc-per-node N train.py --config FILE [FILE ...] ...
"""
from __future__ import annotations

import argparse
import faulthandler
import io
import sys

from ..comm import LAUNCHERS
from ..util.overrides import add_set_option
from .config import ConfigError, check_launcher, load_config

EPILOG = """\
Config files are YAML with the sections run, model, data, optimizer and compression;
later files and --set override earlier ones key by key. Examples:

  horovodrun -np 2 -H localhost:2 --gloo python train.py --config configs/demo.yaml
  torchrun --standalone --nproc-per-node 2 train.py --config configs/demo.yaml
  python train.py --config configs/models/resnet101_cifar10.yaml \\
      configs/compression/gravac_exp_dgc_eps07.yaml --set data.root=~/data --dry-run
  horovodrun -np 2 -H localhost:2 --gloo python train.py --config configs/demo.yaml \\
      --set run.steps=2000 --resume

--resume continues with as many ranks as the run had. The transport is the launcher's
(run.backend: auto), or set run.backend=horovod|torch|local.
Every key, its type, its default and its meaning: docs/CONFIG.md.
"""


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="train.py", description="Train with gravac (adaptive gradient compression on Horovod "
                                     "or torch.distributed).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    # Repeatable as --set is: a second --config adds its files instead of dropping the first.
    parser.add_argument("--config", nargs="+", action="extend", required=True, metavar="FILE",
                        help="YAML config files, merged left to right; repeatable")
    add_set_option(parser, help="override keys (dotted path, YAML value), e.g. "
                                "--set optimizer.lr=0.05 run.steps=100; repeatable")
    parser.add_argument("--dry-run", action="store_true",
                        help="validate the config, build model, data and optimizer, print the "
                             "resolved config and exit")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in run.output_dir/run.name from its latest checkpoint")
    parser.add_argument("--check", nargs="?", const="", default=None, metavar="LAUNCHER",
                        help="only check the config, the data files and the run folder (in "
                             "use by another run? anything to --resume?), in this one process "
                             "without a launcher (what hvd_scripts/run_*.sh run before "
                             "launching); exit 0, or 2 with one line. With the launcher "
                             "that will start the job (horovodrun or torchrun) its options "
                             "are checked against it too")
    parser.add_argument("--here", action="store_true",
                        help="with --check: the job starts on this host only "
                             "(hvd_scripts/run_single_node.sh, a one-node run_torchrun.sh), so "
                             "run.device=cuda is checked here too (a GPU this process sees, "
                             "Horovod's GPU operations); a multi-node launch checks it on the "
                             "hosts that train")
    parser.add_argument("--ranks", type=int, default=None, metavar="N",
                        help="with --check --resume: the job will start N ranks; a checkpoint "
                             "written by another number is refused here, before the launch")
    args = parser.parse_args(argv)
    if args.here and args.check is None:
        parser.error("--here goes with --check (it says where the checked job will start)")
    if args.ranks is not None and (args.check is None or args.ranks < 1):
        parser.error("--ranks N goes with --check, N >= 1 (the ranks the checked job starts)")
    if args.check and args.check not in LAUNCHERS.values():
        parser.error(f"--check {args.check}: the launcher is one of "
                     f"{', '.join(LAUNCHERS.values())}")
    return args


def check(cfg, resume: bool = False, run_folder: bool = True,
          device_backend: str | None = None, ranks: int | None = None) -> None:
    """The config (already validated), its data files and (``run_folder``) the run folder,
    in this one process: what a launched job would fail on next (bad or missing files, a
    folder that holds another run, a resume that has nothing to continue or changes the
    experiment). A dry run writes no folder; a series decides per run whether it resumes.
    ``device_backend`` (the transport of a job that starts on this host): run.device=cuda
    is checked here too. ``ranks`` (the ranks the job starts): a resumed checkpoint's
    world size must be it."""
    from pathlib import Path

    from .checkpoint import latest_info
    from .device import gpu_problem
    from .resume import run_dir_problem, world_size_problem
    from .tasks import build_task

    if device_backend is not None and cfg.run.device == "cuda":
        problem = gpu_problem(device_backend)
        if problem is not None:
            raise ConfigError(problem)
    build_task(cfg, rank=0, world_size=1)
    run_dir = Path(cfg.run.output_dir) / cfg.run.name
    problem = run_folder and run_dir_problem(cfg, run_dir, resume)
    if problem:
        raise ConfigError(problem)
    info = latest_info(run_dir) if run_folder and resume and ranks is not None else None
    problem = info is not None and world_size_problem(info["world_size"], ranks)
    if problem:
        raise ConfigError(problem)


def _print_stacks_on_crash() -> None:
    """A rank that dies in native code (SIGSEGV, SIGABRT) prints its Python stacks: the
    launcher reports only the signal, and on another host nothing else would tell where.
    Skipped where stderr is no file (main() called under a capturing test runner)."""
    try:
        faulthandler.enable(file=sys.stderr, all_threads=True)
    except (AttributeError, ValueError, io.UnsupportedOperation):
        pass


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        # before any rank starts a transport or touches the run folder
        check_launcher(cfg, launcher=args.check or None, starts=args.check is None)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    if args.check is not None:
        try:
            backend = {name: b for b, name in LAUNCHERS.items()}.get(args.check, "local")
            check(cfg, resume=args.resume, run_folder=not args.dry_run,
                  device_backend=backend if args.here else None, ranks=args.ranks)
        except ConfigError as exc:
            print(f"config error: {exc}", file=sys.stderr)
            return 2
        print(f"config ok: {cfg.run.name} ({cfg.model.name} on {cfg.data.name}, "
              f"{cfg.compression.controller})")
        return 0
    from .loop import train   # imports Horovod: only once the config is known to be good

    from ..comm import VersionMismatch
    from .checkpoint import CheckpointError
    from .monitor import MetricsError
    from .signals import Interrupted

    _print_stacks_on_crash()
    try:
        train(cfg, resume=args.resume, dry_run=args.dry_run)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    except Interrupted as stop:          # SIGINT/SIGTERM: checkpoint saved, said on rank 0
        return stop.exit_code
    except CheckpointError as exc:       # e.g. a full disk: one line, the previous is kept
        print(f"checkpoint error: {exc}", file=sys.stderr)
        return 1
    except MetricsError as exc:          # e.g. a full disk: one line, the checkpoints stay
        print(f"metrics error: {exc}", file=sys.stderr)
        return 1
    except VersionMismatch as exc:       # hosts with different gravacs: before any training
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
