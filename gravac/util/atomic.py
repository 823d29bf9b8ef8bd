"""Atomic file writes: a reader sees the old file or the new one, never half of one.

Write to a temporary file in the same directory, flush and fsync it, then ``os.replace``
it over the target (atomic on POSIX within one file system). A write the file system
refuses (a full disk) raises ``OSError``, whoever wrote: ``write_problem`` says it in words.

Example::

    atomic_write_text("runs/a/report.md", text)
    atomic_torch_save(state, "runs/a/checkpoints/step_000100.pt")
"""
from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import Callable, IO

#: The errnos of a full disk (or a full quota).
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def write_problem(exc: OSError, path) -> str:
    """What a failed write of ``path`` means, in words: "no space left on the device while
    writing PATH" or "cannot write PATH: REASON"."""
    if exc.errno in NO_SPACE:
        return f"no space left on the device while writing {path}"
    return f"cannot write {path}: {exc.strerror or exc}"


def _os_error_in(exc: BaseException) -> OSError | None:
    """The OSError that ``exc`` was raised in the handling of, if any."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _atomic(path: str | os.PathLike, write: Callable[[IO[bytes]], None]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            try:
                write(f)
            except RuntimeError as exc:
                # torch.save reports a write that failed (ENOSPC) as "[enforce fail at
                # inline_container.cc:...] unexpected pos": the OSError is its context.
                cause = _os_error_in(exc)
                if cause is None:
                    raise
                raise OSError(cause.errno, cause.strerror, str(path)) from exc
            f.flush()
            os.fsync(f.fileno())
        # mkstemp creates 0600 files; give the result the mode a plain open() would.
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    return _atomic(path, lambda f: f.write(data))


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_torch_save(obj, path: str | os.PathLike) -> Path:
    import torch
    return _atomic(path, lambda f: torch.save(obj, f))


def atomic_savefig(fig, path: str | os.PathLike, **kwargs) -> Path:
    """Save a matplotlib figure atomically (format from the path's suffix)."""
    fmt = Path(path).suffix.lstrip(".") or "png"
    return _atomic(path, lambda f: fig.savefig(f, format=fmt, **kwargs))
