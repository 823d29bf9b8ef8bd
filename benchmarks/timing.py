"""Shared timing for the benchmarks: the median of repeated runs after one warm-up."""
from __future__ import annotations

import statistics
import time


def median_time(fn, repeats: int) -> float:
    """Median wall time of ``fn()`` in seconds over ``repeats`` runs (after a warm-up)."""
    fn()  # warm-up (allocator, lazy initialisation, scratch buffers)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)
