"""Shared timing for the benchmarks: the median of repeated runs after a warm-up.

``median_time`` times a CPU callable with the host clock. ``cuda_times`` times GPU work
with CUDA events, rotating through several inputs so that no input sits in the L2 cache
between its own calls (an H200 has 60 MB of L2: a 10M-float tensor is 40 MB).
"""
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


def cuda_times(fn, inputs, repeats: int, warmup: int = 2) -> list[float]:
    """Seconds of ``fn(x, i)`` on the current CUDA stream, one per call, for ``repeats``
    calls that rotate through ``inputs`` (call i gets ``inputs[i % len(inputs)]``), after
    ``warmup`` calls on each input (module loading, the caching allocator's first blocks).

    Each call is bracketed by CUDA events recorded on the stream, so a call that runs
    asynchronously (x.abs()) is timed by its kernels alone, back to back with the calls
    before it, and one that waits on the device inside (a ``nonzero``, an ``.item()``) is
    timed with its idle gaps, as a training step would see it. The calls are not
    synchronised one by one; the events are read after the last.
    """
    import torch

    for w in range(warmup):
        for j, x in enumerate(inputs):
            fn(x, -1 - w * len(inputs) - j)
    torch.cuda.synchronize()
    events = []
    for i in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        x = inputs[i % len(inputs)]
        start.record()
        fn(x, i)
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return [start.elapsed_time(end) / 1e3 for start, end in events]


def host_times(fn, inputs, repeats: int) -> list[float]:
    """``cuda_times``'s contract with the host clock and no warm-up: seconds of ``fn(x, i)``
    for ``repeats`` calls rotating through ``inputs``. What the GPU benchmarks' dry runs on
    CPU tensors time with (tests check their code, not their numbers)."""
    out = []
    for i in range(repeats):
        start = time.perf_counter()
        fn(inputs[i % len(inputs)], i)
        out.append(time.perf_counter() - start)
    return out


def exit_without_cuda(script: str, device, hint: str) -> None:
    """Where a GPU benchmark is asked for a CUDA device this process does not see: one
    line naming the script and the way out, then exit 2; otherwise nothing."""
    import sys

    import torch
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"{script}: --device cuda, but this process sees no CUDA GPU; {hint}",
              file=sys.stderr)
        sys.exit(2)


def device_description(device) -> str:
    """The device, its driver and torch's CUDA, as every GPU figure is recorded beside."""
    import subprocess

    import torch
    if device.type != "cuda":
        return f"cpu; torch {torch.__version__}"
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                                 "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        driver = "unknown"
    return (f"{torch.cuda.get_device_name(device)}, driver {driver or 'unknown'}, "
            f"torch {torch.__version__} (CUDA {torch.version.cuda})")
