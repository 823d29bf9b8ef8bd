"""Train with gravac: ``horovodrun -np N python train.py --config FILE [FILE ...]``.

See ``python train.py --help`` and README.md.
"""
from gravac.comm import end_process
from gravac.train.cli import main

if __name__ == "__main__":
    # after gloo, without finalization: gravac/comm/process_exit.py says why
    end_process(main())
