"""Keep freed memory in the process instead of handing it back to the kernel (glibc).

PyTorch's CPU tensors come from malloc. glibc serves a large block (above its mmap
threshold, which adapts up to 32 MiB) with a fresh ``mmap`` and unmaps it on free, and
trims the top of its heap once 128 KiB or more are free there. So every training step's
gradients, activations and temporaries (tens of MB) arrive as untouched pages, and the
first write to each page is a page fault plus the kernel zeroing it: on the LSTM
workload (5.4M parameters) that was a quarter of forward + backward (t_compute 51-56 ms
-> 40-41 ms with the memory kept; docs/notes/2026-11-benchmarks.md §4).

``keep_freed_memory()`` raises both thresholds with ``mallopt``, so freed blocks stay in
the heap and the next step reuses them. The process's resident memory then stays at its
peak instead of shrinking between steps, which a training process reaches every step
anyway. The trainer calls it at start-up (``run.keep_freed_memory``, default true); a
loop of your own can call it before building the model.

Example::

    from gravac.util.malloc import keep_freed_memory
    keep_freed_memory()        # True on glibc; False (and nothing changed) elsewhere
"""
from __future__ import annotations

import ctypes
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: glibc refuses an mmap threshold above HEAP_MAX_SIZE / 2 (32 MiB on 64-bit): blocks
#: larger than that are still mapped and unmapped each time.
MMAP_THRESHOLD = 32 * 1024 * 1024
TRIM_THRESHOLD = 1024 * 1024 * 1024

_done = None


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds (once per process); True when applied."""
    global _done
    if _done is not None:
        return _done
    _done = False
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False                # not glibc (musl, another libc): leave it alone
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    _done = (mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
             and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1)
    return _done
