"""One run at a time in a run folder: an exclusive lock held for the run's life.

Rank 0 (the process that prepares the folder) takes ``fcntl.flock`` on ``RUN_DIR/.lock``
before it reads, resumes or clears anything there, and keeps it until the run ends. The
kernel drops the lock when the process ends, however it ends, so no stale lock is left
behind; the file itself stays (removing it would let a third run lock a new file while a
second still holds the old one). A second run on the same folder, with or without
``run.overwrite``, is refused before it deletes anything.

Example::

    lock = RunDirLock(run_dir)
    if not lock.acquire():
        raise ConfigError(lock.refusal())
    clear_run_dir(run_dir)          # run.overwrite: everything but the lock
    ...
    lock.release()
"""
from __future__ import annotations

import fcntl
import os
import shutil
import socket
from pathlib import Path

LOCK_FILE = ".lock"


class RunDirLock:
    """The lock of one run folder (not re-entrant: a second ``RunDirLock`` on the same folder,
    in this process or another, is refused while the first is held)."""

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._file = None
        self.created = False             # acquire made the folder
        # acquire's mkdir also makes missing parents (a new run.output_dir): the topmost
        # of them, which abandon removes again when they stayed empty
        self._created_top = None

    def acquire(self) -> bool:
        """Take the lock (creating the folder); False when another run holds it."""
        self.created = not self.run_dir.exists()
        missing = [p for p in [self.run_dir, *self.run_dir.parents] if not p.exists()]
        self._created_top = missing[-1] if missing else None
        self.run_dir.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+", encoding="utf-8")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            return False
        try:            # who holds it, for the refusal of the next run; optional on a full disk
            f.truncate(0)
            f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
            f.flush()
        except OSError:
            pass
        self._file = f
        return True

    def refusal(self) -> str:
        """The one line that refuses a second run of this folder."""
        try:
            holder = self.path.read_text(encoding="utf-8").strip()
        except OSError:
            holder = ""
        return (f"{self.run_dir} is in use by another run{f' ({holder})' if holder else ''}; "
                "wait until it ends, or choose another run.name or run.output_dir")

    def release(self) -> None:
        if self._file is not None:
            self._file.close()           # closing the file drops the flock
            self._file = None

    def abandon(self) -> None:
        """Release, and remove the folder where ``acquire`` created it and nothing but the
        lock is in it, with the parents it created that are empty then (a run refused
        before it wrote anything leaves nothing behind, not even a new run.output_dir)."""
        self.release()
        if self.created and self.path.exists() and \
                [p.name for p in self.run_dir.iterdir()] == [LOCK_FILE]:
            self.path.unlink()
            self.run_dir.rmdir()
            for parent in self.run_dir.parents:
                if self._created_top is None or self._created_top not in \
                        [parent, *parent.parents] or any(parent.iterdir()):
                    break
                parent.rmdir()


def clear_run_dir(run_dir: str | os.PathLike) -> None:
    """Remove what a previous run left in ``run_dir`` (``run.overwrite``), keeping the lock
    file that this run holds."""
    for entry in Path(run_dir).iterdir():
        if entry.name == LOCK_FILE:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
