"""``python benchmarks/scaling SUBCOMMAND ...`` (from any directory) or
``python -m benchmarks.scaling SUBCOMMAND ...`` (from the repository root): the cost model's
command line (``cli.py``).

Example::

    python benchmarks/scaling project --compression runs/scaling/compression.json
"""
import sys
from pathlib import Path

if not __package__:
    # Run as a folder: Python put this folder first on sys.path, where its modules
    # (network, runs, plot, ...) would shadow top-level ones of the same name. The
    # repository root instead, so that the package imports as benchmarks.scaling.
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from benchmarks.scaling.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
