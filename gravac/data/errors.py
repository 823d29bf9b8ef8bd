"""The error a data loader raises for a file it cannot use: the message names the file,
what is wrong with it and how to fix it (the trainer shows it as one line, exit 2).

Example::

    raise DataFileError("/data/ptb/ptb.train.txt", "empty", "copy the full file again")
"""
from __future__ import annotations

import os


class DataFileError(ValueError):
    """``path``: ``problem``; ``fix``."""

    def __init__(self, path: str | os.PathLike, problem: str, fix: str):
        self.path = os.fspath(path)
        super().__init__(f"{self.path}: {problem}; {fix}")


def check_root(root: str | os.PathLike, holds: str) -> None:
    """``data.root`` must be a folder (one that ``holds`` what the data set needs): a file
    given there was reported as a folder not found inside it."""
    if os.path.isfile(root):
        # (A FileNotFoundError: the loaders' callers report it as data.root's problem.)
        raise FileNotFoundError(f"a file, not a folder; give the folder that holds {holds}")
