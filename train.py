"""Train with gravac: ``horovodrun -np N python train.py --config FILE [FILE ...]``.

See ``python train.py --help`` and README.md.
"""
import sys

from gravac.train.cli import main

if __name__ == "__main__":
    sys.exit(main())
