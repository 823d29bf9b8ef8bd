"""``python -m gravac.report RUN_DIR [RUN_DIR ...] [--out OUT_DIR] [--baseline RUN_DIR]``

Example::

    python -m gravac.report runs/dense runs/gravac runs/static --out report
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from . import RunLoadError, build_report


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gravac.report",
        description="Plot training runs and write a report.md summary comparing them.")
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR",
                        help="run directories, each with a metrics.jsonl")
    parser.add_argument("--out", metavar="OUT_DIR", default=None,
                        help="where to write the plots and report.md (default: the run "
                             "directory for one run, ./report for several)")
    parser.add_argument("--baseline", metavar="RUN_DIR", default=None,
                        help="run to compute speedup and communication saving against "
                             "(default: the first run whose controller is 'dense')")
    parser.add_argument("--dpi", type=int, default=100, help="PNG resolution (default 100)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns 0, or exits with status 2 and a message on bad input.

    Example::

        main(["runs/dense", "runs/gravac", "--out", "report"])
    """
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.dpi <= 0:
        parser.error(f"--dpi must be positive, got {args.dpi}")
    try:
        report = build_report(args.runs, out_dir=args.out, baseline=args.baseline,
                              dpi=args.dpi)
    except (RunLoadError, ValueError, OSError) as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    print(f"wrote {report} and its plots")
    return 0


if __name__ == "__main__":
    sys.exit(main())
