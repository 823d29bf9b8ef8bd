"""What ``--resume`` does with one run, decided as a sweep's ``--resume`` decides it
(``runner.resume_plan``), for the series scripts (hvd_scripts/lib/series.sh): prints
``skip`` (it finished the steps asked for), ``resume`` (from its checkpoint), ``restart``
(it logged but never checkpointed) or ``new`` (nothing there yet).

Usage (train.py's arguments; run from where train.py runs, the repository root)::

    python -m gravac.sweep.plan --config configs/demo.yaml --set run.steps=600

Exit status: 0, or 2 with the config's one line when it does not load.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from ..train.cli import parse_args
    from ..train.config import ConfigError, load_config
    from .runner import resume_plan

    args = parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    print(resume_plan(Path(cfg.run.output_dir) / cfg.run.name, cfg)[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
