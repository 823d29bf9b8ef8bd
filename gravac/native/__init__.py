"""gravac's native kernel (``scan.c``): the indices of the entries of a CPU tensor that
pass a magnitude threshold, in one read of it.

On one core NumPy's ``abs`` + ``>=`` + ``flatnonzero`` over the LSTM's 2.56M-entry output
layer took ~3.7 ms at CF 40, mostly ``flatnonzero``'s branch per entry; the kernel
compares 64 entries at a time into a bit mask and visits only the set bits
(docs/notes/2026-11-benchmarks.md §4, "The candidates in one read"). Same answer as NumPy's,
entry for entry (``tests/unit/test_native.py``).

The C file is compiled with the machine's C compiler (``cc``, or ``$CC``) the first time
it is needed, into ``$GRAVAC_NATIVE_DIR`` (default ``~/.cache/gravac``) under a name that
carries a hash of the source, the compiler command and the machine, so hosts that share
a home directory never load another's build; ``make install`` builds it ahead. Written
to a temporary name and renamed, so ranks building at once do not collide. Where no
compiler works, or ``GRAVAC_NATIVE=0``, ``scan`` returns None and the callers take NumPy
(slower, same indices).

Example::

    idx = scan(grad.view(-1), 1e-3)   # ascending int64 indices of |grad| >= 1e-3, or None
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("scan.c")
FLAGS = ("-O3", "-shared", "-fPIC")

_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_failed: str | None = None


def _compiler() -> list[str]:
    return shlex.split(os.environ.get("CC") or "cc")


def library_path() -> Path:
    """Where the built library is (or would be) for this source, compiler and machine."""
    key = hashlib.sha256(SOURCE.read_bytes()
                         + " ".join([*_compiler(), *FLAGS]).encode()
                         + f"{platform.machine()} {platform.system()}".encode()).hexdigest()
    root = Path(os.environ.get("GRAVAC_NATIVE_DIR") or Path.home() / ".cache" / "gravac")
    return root / f"gravac_scan-{key[:16]}.so"


def build() -> Path:
    """Compile ``scan.c`` unless this build exists; returns the library's path. Raises
    RuntimeError (with the compiler's message) when it cannot."""
    path = library_path()
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.stem + ".", suffix=".tmp.so", dir=path.parent)
    os.close(fd)
    try:
        cmd = [*_compiler(), *FLAGS, "-o", tmp, str(SOURCE)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RuntimeError(f"{' '.join(cmd)}: {exc}") from None
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()[-2000:]}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def enabled() -> bool:
    """Whether the kernel may be used (``GRAVAC_NATIVE=0`` turns it off)."""
    return os.environ.get("GRAVAC_NATIVE", "1") != "0"


def load() -> ctypes.CDLL | None:
    """The loaded library, built first if needed; None when disabled or it cannot be
    built (``why_not()`` says why; it is not retried in this process)."""
    global _library, _failed
    if not enabled():
        return None
    if _library is not None or _failed is not None:
        return _library
    with _lock:
        if _library is None and _failed is None:
            try:
                lib = ctypes.CDLL(str(build()))
                for name, real in (("gravac_scan_f32", ctypes.c_float),
                                   ("gravac_scan_f64", ctypes.c_double)):
                    fn = getattr(lib, name)
                    fn.restype = ctypes.c_int64
                    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, real, ctypes.c_int,
                                   ctypes.c_void_p]
                _library = lib
            except (RuntimeError, OSError) as exc:
                _failed = str(exc)
    return _library


def why_not() -> str | None:
    """Why the kernel is not in use (None when it is)."""
    if not enabled():
        return "GRAVAC_NATIVE=0"
    load()
    return _failed


def scan_ok(x: torch.Tensor) -> bool:
    """Whether ``scan`` takes ``x``: a contiguous 1-D float32/float64 CPU tensor."""
    return x.device.type == "cpu" and x.dim() == 1 and x.is_contiguous() \
        and x.dtype in (torch.float32, torch.float64) and load() is not None


def scan(x: torch.Tensor, threshold, out: torch.Tensor | None = None) -> torch.Tensor | None:
    """Ascending int64 indices of the entries of ``x`` with ``|x| >= threshold``
    (threshold > 0) or ``x != 0`` (threshold 0), the threshold taken in x's dtype as
    NumPy and torch take it; None when the kernel cannot take ``x`` (``scan_ok``).
    ``out``: an optional int64 scratch of at least x's length (overwritten); the result
    is always a tensor of its own."""
    if not scan_ok(x):
        return None
    n = x.numel()
    if out is None or out.numel() < n or out.dtype != torch.int64 or not out.is_contiguous():
        out = torch.empty(n, dtype=torch.int64)
    t = float(threshold)
    zero_test = 1 if t == 0 else 0
    fn = _library.gravac_scan_f32 if x.dtype == torch.float32 else _library.gravac_scan_f64
    count = fn(x.data_ptr(), n, t, zero_test, out.data_ptr())
    return out[:count].clone()
