"""The cost model's one error for bad input (a file, a run directory, an argument).

Example::

    raise CliError("run directory runs/x: no metrics.jsonl")
    # the command line prints "benchmarks/scaling validate: error: run directory ..." and
    # exits with status 2, no traceback
"""


class CliError(Exception):
    """Bad input: printed as one line naming the argument, exit status 2."""
