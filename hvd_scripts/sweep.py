"""Run a grid of gravac trainings and tabulate the results: ``python -m gravac.sweep``.

Usage (the sweep file format is in gravac/sweep/__init__.py)::

    .venv/bin/python hvd_scripts/sweep.py configs/sweeps/demo_sweep.yaml [--launcher torchrun]
"""
import sys
from pathlib import Path

# The gravac package of this checkout, as train.py uses, also without an installed venv.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gravac.sweep import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
