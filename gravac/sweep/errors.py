"""The sweep's one error: a problem with the sweep file or its runs, in one line naming
the field (what ``python -m gravac.sweep`` prints before exiting 2)."""


class SweepError(ValueError):
    """A problem with the sweep file or its runs, in one line naming the field."""
