"""Near misses in the names a user types: the "did you mean ...?" of every error that
refuses an unknown config key or a value outside a fixed set of names.

A list of twenty known keys tells the user what exists but not which one they meant;
the typical mistakes are a letter too few or too many (``controler``, ``run.step``), a
name in another case (``GraVAC``) or with a separator the name does not have (``top-k``,
``all_gather``, ``resnet-18``). The first kind is found by difflib's similarity ratio,
the others by comparing the names without case and separators.

Example::

    closest("GraVAC", ["dense", "static", "gravac"])        # 'gravac'
    one_of("top-k", ["topk", "dgc"])      # "must be one of topk, dgc; did you mean topk?"
"""
from __future__ import annotations

import difflib
from typing import Iterable

# difflib's own default: below it the closest name shares too little with what was typed
# to be what the user meant ("magic" and "static": 0.55), above it are one or two letters
# missing, doubled or swapped even in short names ("stpe" and "steps": 0.67).
CUTOFF = 0.6


def _folded(name) -> str:
    return str(name).lower().replace("-", "").replace("_", "").replace(" ", "")


def closest(word, choices: Iterable) -> str | None:
    """The choice that ``word`` most likely misspells, or None when none is close."""
    choices = [str(c) for c in choices]
    folded = _folded(word)
    same = [c for c in choices if _folded(c) == folded]
    if same:
        return same[0]
    by_folded = {}
    for c in choices:
        by_folded.setdefault(_folded(c), c)
    match = difflib.get_close_matches(folded, list(by_folded), n=1, cutoff=CUTOFF)
    return by_folded[match[0]] if match else None


def did_you_mean(word, choices: Iterable) -> str:
    """ "; did you mean X?" for the closest choice, or "" when none is close."""
    match = closest(word, choices)
    return f"; did you mean {match}?" if match is not None and match != str(word) else ""


def one_of(value, choices: Iterable) -> str:
    """The refusal of a value outside ``choices``: "must be one of a, b, c" and, where the
    value is a near miss, "; did you mean b?"."""
    choices = [str(c) for c in choices]
    return f"must be one of {', '.join(choices)}{did_you_mean(value, choices)}"
