"""Command line of ``train.py``.

    horovodrun -np N python train.py --config FILE [FILE ...] [--set key=value ...]
                                     [--dry-run] [--resume]
    torchrun --nproc-per-node N train.py --config FILE [FILE ...] ...
"""
from __future__ import annotations

import argparse
import sys

from .config import ConfigError, load_config

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
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE",
                        help="override one key (dotted path, YAML value), e.g. "
                             "--set optimizer.lr=0.05; repeatable")
    parser.add_argument("--dry-run", action="store_true",
                        help="validate the config, build model, data and optimizer, print the "
                             "resolved config and exit")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in run.output_dir/run.name from its latest checkpoint")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    from .loop import train   # imports Horovod: only once the config is known to be good

    from .checkpoint import CheckpointError
    from .signals import Interrupted

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
    return 0
