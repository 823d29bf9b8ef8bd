"""The ``--set KEY=VALUE`` option of the command lines without positional arguments
(train.py, the end-to-end and step-profile benchmarks): one or more overrides after each
``--set``, as ``--config`` takes its files, and the flag repeatable. The sweep, whose
command line ends with its file, takes one per ``--set``: after a greedy ``--set`` the file
would be read as an override.

Example::

    parser = argparse.ArgumentParser()
    add_set_option(parser, help="override keys, e.g. --set optimizer.lr=0.05 run.steps=100")
    parser.parse_args(["--set", "run.steps=5", "optimizer.lr=0.1", "--set", "run.name=x"])
    # Namespace(overrides=['run.steps=5', 'optimizer.lr=0.1', 'run.name=x'])
"""
from __future__ import annotations

import argparse


def add_set_option(parser: argparse.ArgumentParser, *, help: str,
                   dest: str = "overrides") -> None:
    """Add ``--set KEY=VALUE [KEY=VALUE ...]`` (repeatable) to ``parser``, collected in
    order into the list ``dest``. "--set a=1 b=2" is what a user types first; "--set a=1
    --set b=2" stays valid."""
    parser.add_argument("--set", dest=dest, action="extend", nargs="+", default=[],
                        metavar="KEY=VALUE", help=help)
