"""The cost model's command line: ``python benchmarks/scaling SUBCOMMAND ...`` (or
``python -m benchmarks.scaling``, from the repository root), docs/SCALING.md §2. The
arguments are parsed here; ``commands.py`` does the work.

Subcommands::

    measure-compression --out C.json           # this machine's local costs
    measure-collectives --out M.json --link 1gbit   # under horovodrun (= collectives.py)
    calibrate M.json --out L.json               # α, β of the links, the lockstep factors
    validate RUN_DIR... --calibration L.json --compression C.json
    project --compression C.json --out projection.md

Bad input is one line on stderr naming the argument (exit status 2), never a traceback.

Example::

    from benchmarks.scaling.cli import main
    main(["calibrate", "runs/scaling/collectives_2x2.json", "--out", "cal.json"])   # 0
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from .commands import (PROG, REPO, cmd_calibrate, cmd_measure_collectives,
                       cmd_measure_compression, cmd_project, cmd_validate)
from .errors import CliError
from .models import PAPER_MODELS
from .projection import (DEFAULT_ALPHA_US, DEFAULT_DEVICE_TFLOPS, DEFAULT_LOCAL_ALPHA_US,
                         DEFAULT_LOCAL_GBIT)
from .rounds import EXCHANGES

DESCRIPTION = "A cost model of gravac's step from 2 to 1,024 workers (docs/SCALING.md)."
#: What ``project --exchanges`` may name: every exchange the model prices but Horovod's
#: dense fp32 step, which every projection compares against anyway.
PROJECTED = tuple(e for e in EXCHANGES if e != "dense")


def parse_rate_gbit(text: str) -> float:
    """A link rate in Gbit/s from ``"1gbit"``, ``"100mbit"``, ``"10"`` (Gbit/s).

    >>> parse_rate_gbit("100mbit"), parse_rate_gbit("10gbit"), parse_rate_gbit("2.5")
    (0.1, 10.0, 2.5)
    """
    t = str(text).strip().lower()
    for unit, scale in (("gbit", 1.0), ("mbit", 1e-3), ("kbit", 1e-6)):
        if t.endswith(unit):
            t, factor = t[: -len(unit)], scale
            break
    else:
        factor = 1.0
    try:
        value = float(t) * factor
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a rate (e.g. 1gbit, 100mbit, 10)") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"{text!r}: a rate must be > 0")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line naming the argument."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


#: How a bad value's message names the kind it should be.
_KIND_NAMES = {int: "a whole number", float: "a number"}


def _positive(kind):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {_KIND_NAMES[kind]}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value
    return parse


def _cf(text: str) -> float:
    """A compression factor: a number >= 1 (1 = dense)."""
    value = _positive(float)(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"a CF must be >= 1 (1 = dense), got {text}")
    return value


def _matrix(text: str) -> tuple[int, int]:
    rows, sep, cols = text.lower().partition("x")
    try:
        shape = (int(rows), int(cols))
    except ValueError:
        shape = None
    if not sep or shape is None or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not ROWSxCOLS (e.g. 512x1024)")
    return shape


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("measure-compression", help="time gravac's local work on this machine")
    p.add_argument("--out", type=Path, default=None, help="JSON file (default: stdout)")
    p.add_argument("--sizes", type=_positive(int), nargs="+",
                   default=[1 << 12, 1 << 16, 1 << 18, 1 << 20, 1 << 22])
    p.add_argument("--cfs", type=_cf, nargs="+", default=[10, 100, 1000])
    p.add_argument("--chunks", type=_positive(int), nargs="+", default=[1, 8, 32],
                   help="ranks' chunks in the unpacked buffer")
    p.add_argument("--repeats", type=_positive(int), default=5)
    p.add_argument("--threads", type=_positive(int), default=1,
                   help="torch threads (1: as each of 2 ranks on 2 cores)")
    p.add_argument("--compressor", default="topk", choices=("topk", "dgc", "redsync", "randomk"))
    p.add_argument("--lowrank-shapes", type=_matrix, nargs="+",
                   default=[(64, 64), (256, 256), (512, 1024), (1024, 2048)],
                   help="PowerSGD matrices ROWSxCOLS")
    p.add_argument("--lowrank-ranks", type=_positive(int), nargs="+", default=[1, 2, 4])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--procs", type=_positive(int), default=1,
                   help="processes measuring at once, each sample started together: the "
                        "costs under the contention of that many ranks on this machine "
                        "(validate then scales them by no factor at that many ranks)")

    sub.add_parser("measure-collectives", add_help=False,
                   help="(under a launcher) time gravac's collectives: benchmarks/collectives.py")

    p = sub.add_parser("calibrate", help="fit α, β of the links from measure-collectives JSON")
    p.add_argument("inputs", type=Path, nargs="+")
    p.add_argument("--out", type=Path, default=None)

    p = sub.add_parser("validate", help="predicted vs measured step times of runs")
    p.add_argument("runs", nargs="+", help="train.py run directories (one layout)")
    p.add_argument("--calibration", type=Path, required=True)
    p.add_argument("--compression", type=Path, default=None,
                   help="measure-compression JSON (default: no local cost)")
    p.add_argument("--hosts", type=_positive(int), default=None)
    p.add_argument("--slots", type=_positive(int), default=None)
    p.add_argument("--compute", default=None,
                   help="compute per step: SECONDS at --compute-ranks ranks, or a reference "
                        "run directory (its t_compute + t_update); default: each run's own")
    p.add_argument("--compute-ranks", type=_positive(int), default=None)
    p.add_argument("--compute-calibration", type=Path, default=None,
                   help="the calibration of the --compute reference's layout (its lockstep "
                        "fits turn the reference's compute into compute alone)")
    p.add_argument("--assume-contention", action="store_true",
                   help="ignore the calibration's lockstep fits; stretch CPU work by "
                        "max(1, ranks / cores)")
    p.add_argument("--plain-calibration", type=Path, default=None,
                   help="links of the same layout measured with Horovod's own spinning wait "
                        "(collectives.py --horovod-wait spin): the collectives of plain "
                        "Horovod runs (dense, fp16: hvd.DistributedOptimizer) are priced "
                        "by them")
    p.add_argument("--cores", type=_positive(int), default=os.cpu_count() or 1,
                   help="cores the sandbox's ranks share (default: this machine's)")
    p.add_argument("--warmup", type=int, default=10, help="steps left out at the start")
    p.add_argument("--tolerance", type=_positive(float), default=0.25)
    p.add_argument("--out", type=Path, default=None)

    p = sub.add_parser("project", help="step times for N = 8..1024 at 1, 10, 100 Gbit/s")
    p.add_argument("--models", nargs="*", default=list(PAPER_MODELS),
                   help=f"{', '.join(PAPER_MODELS)} or train.py config files")
    p.add_argument("--shapes", nargs="*", type=Path, default=None,
                   help="ModelShapes JSON files (name, min_compress_numel, params)")
    p.add_argument("--compute-ms", nargs="*", default=None, metavar="MODEL=MS",
                   help="compute time per step (default: FLOPs / --device-tflops)")
    p.add_argument("--device-tflops", type=_positive(float), default=DEFAULT_DEVICE_TFLOPS)
    p.add_argument("--n", type=_positive(int), nargs="+", default=None)
    p.add_argument("--slots", type=_positive(int), default=8)
    p.add_argument("--links", type=parse_rate_gbit, nargs="+", default=[1.0, 10.0, 100.0])
    p.add_argument("--alpha-us", type=_positive(float), default=DEFAULT_ALPHA_US)
    p.add_argument("--local-gbit", type=parse_rate_gbit, default=DEFAULT_LOCAL_GBIT)
    p.add_argument("--local-alpha-us", type=_positive(float), default=DEFAULT_LOCAL_ALPHA_US)
    p.add_argument("--calibration", type=Path, default=None,
                   help="take α of the inter-host link from this calibration")
    p.add_argument("--compression", type=Path, default=None)
    p.add_argument("--compression-speedup", type=_positive(float), default=1.0,
                   help="divide the measured local costs by this (a faster device)")
    p.add_argument("--cfs", type=_cf, nargs="+", default=[10, 100, 1000])
    p.add_argument("--ranks", type=_positive(int), nargs="+", default=[1, 4])
    p.add_argument("--exchanges", nargs="+", choices=PROJECTED, default=list(PROJECTED))
    p.add_argument("--max-n", type=_positive(int), default=8192,
                   help="crossovers are searched up to this N")
    p.add_argument("--out", type=Path, default=None, help="markdown (default: stdout)")
    p.add_argument("--json", type=Path, default=None, help="every number, as JSON")
    p.add_argument("--plot-dir", default=str(REPO / "docs/img"),
                   help="where scaling_<model>.png goes ('' for no plot)")
    return parser


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "measure-collectives":
        return cmd_measure_collectives(None, argv[1:])
    args = build_parser().parse_args(argv)
    handler = {"measure-compression": cmd_measure_compression, "calibrate": cmd_calibrate,
               "validate": cmd_validate, "project": cmd_project}[args.command]
    try:
        return handler(args)
    except CliError as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return 2
