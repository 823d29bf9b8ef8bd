"""Check every run of a series before any starts (hvd_scripts/lib/series.sh): each run is
``train.py --config MODEL_CONFIG FILE TRAIN_ARGS --check LAUNCHER``, all in this one
process. A problem several runs share (a data.root without the data) is one line naming
them, as a sweep prints it (``errors.problem_lines``).

Usage (from where train.py runs, the repository root)::

    python -m gravac.sweep.check LAUNCHER MODEL_CONFIG FILE [FILE ...] [-- TRAIN_ARGS...]
    python -m gravac.sweep.check horovodrun configs/demo.yaml \\
        configs/compression/dense.yaml configs/compression/static_topk_10x.yaml \\
        -- --set data.root=/data

Exit status: 0 every run is valid; 2 with one line per distinct problem (naming the runs
by their FILE's name) and a last line counting the invalid runs.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from .errors import problem_lines


def main(argv: Sequence[str] | None = None) -> int:
    from ..comm import LAUNCHERS
    from ..train.cli import check, parse_args
    from ..train.config import ConfigError, check_launcher, load_config

    argv = list(sys.argv[1:] if argv is None else argv)
    head, tail = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv \
        else (argv, [])
    if len(head) < 3 or head[0] not in LAUNCHERS.values():
        print("usage: python -m gravac.sweep.check LAUNCHER MODEL_CONFIG FILE [FILE ...] "
              f"[-- TRAIN_ARGS...]; LAUNCHER is one of {', '.join(LAUNCHERS.values())}",
              file=sys.stderr)
        return 2
    launcher, model, *files = head
    problems = []
    for name in files:
        args = parse_args(["--config", model, name, *tail])
        try:
            cfg = load_config(args.config, args.overrides)
            check_launcher(cfg, launcher=launcher)
            check(cfg, run_folder=False)    # series.sh resumes or replaces each run itself
        except ConfigError as exc:
            problems.append((Path(name).name, f"config error: {exc}"))
    if not problems:
        return 0
    for line in problem_lines(problems, len(files)):
        print(line, file=sys.stderr)
    bad = len({label for label, _ in problems})
    print(f"{bad} of {len(files)} runs invalid; nothing was launched", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
