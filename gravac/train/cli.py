"""Command line of ``train.py``.

    horovodrun -np N python train.py --config FILE [FILE ...] [--set key=value ...]
                                     [--dry-run] [--resume] [--check]
    torchrun --nproc-per-node N train.py --config FILE [FILE ...] ...
"""
from __future__ import annotations

import argparse
import faulthandler
import io
import sys

from ..util.overrides import add_set_option
from .config import ConfigError, check_launcher, load_config

EPILOG = """\
Config files are YAML with the sections run, model, data, optimizer and compression;
later files and --set override earlier ones key by key. Examples:

  horovodrun -np 2 -H localhost:2 --gloo python train.py --config configs/demo.yaml
  torchrun --standalone --nproc-per-node 2 train.py --config configs/demo.yaml
  python train.py --config configs/models/resnet101_cifar10.yaml \\
      configs/compression/gravac_exp_dgc_eps07.yaml --set data.root=~/data --dry-run
  python train.py --config configs/demo.yaml --set run.steps=2000 --resume

The transport is the launcher's (run.backend: auto), or set run.backend=horovod|torch|local.
Every key, its type and its default: gravac/train/config.py (the controllers' options:
gravac/controllers/gravac.py and accordion.py).
"""


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="train.py", description="Train with gravac (adaptive gradient compression on Horovod "
                                     "or torch.distributed).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", nargs="+", required=True, metavar="FILE",
                        help="YAML config files, merged left to right")
    add_set_option(parser, help="override keys (dotted path, YAML value), e.g. "
                                "--set optimizer.lr=0.05 run.steps=100; repeatable")
    parser.add_argument("--dry-run", action="store_true",
                        help="validate the config, build model, data and optimizer, print the "
                             "resolved config and exit")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in run.output_dir/run.name from its latest checkpoint")
    parser.add_argument("--check", action="store_true",
                        help="only check the config and the data files, in this one process "
                             "without a launcher (what hvd_scripts/run_*.sh run before "
                             "launching); exit 0, or 2 with one line")
    return parser.parse_args(argv)


def check(cfg) -> None:
    """The config (already validated) and its data files, in this one process: reading the
    data is what a launched job would fail on next (bad or missing files)."""
    from .tasks import build_task

    build_task(cfg, rank=0, world_size=1)


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
        check_launcher(cfg)     # before any rank starts a transport or touches the run folder
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        try:
            check(cfg)
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
