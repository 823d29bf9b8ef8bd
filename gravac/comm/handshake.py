"""The first collective of a gravac job: every rank says which gravac it runs.

A host with another gravac (an older install, an edited copy) issues other collectives in
another order: a hang with no output, or tensors mixed up. So ``gravac.comm.init`` starts
with ONE fixed-size allgather of each rank's record (gravac's version, a hash of its source
files, its host) and refuses, on every rank, a job whose records differ, naming the hosts
and both versions. A rank that never joins (a gravac from before this handshake, another
program) is not waited for forever: after ``timeout_s`` the ranks that did join stop with
one line.

Example::

    agree_versions(comm, timeout_s=120)     # raises VersionMismatch on every rank
"""
from __future__ import annotations

import hashlib
import socket
import time
from functools import lru_cache
from pathlib import Path

import torch

from .base import Comm

MAGIC = b"GRAVAC-HS1"
#: Bytes of one rank's record: fixed, so the allgather needs no size round before it.
RECORD_BYTES = 192
#: How long a rank waits for every other to join (their imports and start-up included).
DEFAULT_TIMEOUT_S = 120.0
_PACKAGE = Path(__file__).resolve().parents[1]


class VersionMismatch(RuntimeError):
    """The ranks of a job do not all run the same gravac (raised on every rank that joined)."""


@lru_cache(maxsize=1)
def source_id() -> str:
    """12 hex digits of a hash over gravac's source files (Python and native): two installs
    agree exactly when their code does."""
    digest = hashlib.sha256()
    for path in sorted(p for p in _PACKAGE.rglob("*")
                       if p.suffix in (".py", ".c") and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(_PACKAGE)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def describe() -> str:
    """This process's gravac, as the handshake and the run record name it:
    ``gravac 0.1.0 (source 3f2a9c0d1e4b)``."""
    from .. import __version__
    return f"gravac {__version__} (source {source_id()})"


def _record() -> torch.Tensor:
    text = f"{describe()}\n{socket.gethostname()}".encode()[:RECORD_BYTES - len(MAGIC)]
    raw = (MAGIC + text).ljust(RECORD_BYTES, b"\0")
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


def _parse(raw: bytes) -> tuple[str, str] | None:
    """(gravac description, host) of a record, or None when it is not a handshake record."""
    if not raw.startswith(MAGIC):
        return None
    text = raw[len(MAGIC):].rstrip(b"\0").decode(errors="replace")
    version, _, host = text.partition("\n")
    return version, host


def agree_versions(comm: Comm, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[str]:
    """Collective, and the job's first: every rank's record; raises ``VersionMismatch``
    (one line) on every rank when the ranks run different gravacs or some rank does not
    join within ``timeout_s``. Returns every rank's host name (rank order)."""
    if comm.size == 1:
        return [socket.gethostname()]
    store = _world_store(comm)
    rows = (_gather_by_collective(comm, timeout_s) if store is None else
            _gather_by_store(store, comm, timeout_s))
    records = [_parse(rows[r * RECORD_BYTES:(r + 1) * RECORD_BYTES]) for r in range(comm.size)]
    mine = records[comm.rank]
    for rank, record in enumerate(records):
        if record is None or record[0] != mine[0]:
            theirs = "no gravac handshake record" if record is None else \
                f"{record[0]} on {record[1]}"
            raise VersionMismatch(
                f"gravac's version handshake: rank {rank} runs {theirs}, rank {comm.rank} "
                f"runs {mine[0]} on {mine[1]}; install the same gravac on every host "
                "(hvd_scripts/install.sh), then start the job again")
    return [host for _, host in records]


def _late(comm: Comm, timeout_s: float) -> VersionMismatch:
    return VersionMismatch(
        f"gravac's version handshake: not every rank joined within {timeout_s:g}s (this is "
        f"rank {comm.rank} on {socket.gethostname()}, {describe()}): a host runs an older "
        "gravac or another program, or a rank is stuck starting; install the same gravac on "
        "every host (hvd_scripts/install.sh)")


def _world_store(comm: Comm):
    """torch.distributed's key-value store of the world, when ``comm`` is the world: there
    the records travel without a collective, so a rank that never joins leaves nothing
    pending (a gloo collective left waiting blocks the process's exit)."""
    if comm.backend != "torch" or getattr(comm, "group", None) is not None:
        return None
    from torch.distributed import distributed_c10d
    try:
        return distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError, ValueError):
        return None


def _gather_by_store(store, comm: Comm, timeout_s: float) -> bytes:
    import datetime
    import os

    # A restarted torchrun worker group finds the keys of the attempt before it.
    prefix = f"gravac.handshake/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    store.set(f"{prefix}{comm.rank}", _record().numpy().tobytes())
    keys = [f"{prefix}{r}" for r in range(comm.size)]
    try:
        store.wait(keys, datetime.timedelta(seconds=timeout_s))
    except Exception as exc:        # the store's timeout is a RuntimeError or DistStoreError
        if "timeout" not in str(exc).lower() and "timed out" not in str(exc).lower():
            raise
        raise _late(comm, timeout_s) from None
    return b"".join(store.get(key) for key in keys)


def _gather_by_collective(comm: Comm, timeout_s: float) -> bytes:
    handle = comm.allgather_bytes_async(_record(), name="gravac.handshake", same_size=True)
    deadline = time.monotonic() + timeout_s
    pause = 0.001
    while not handle.ready():
        if time.monotonic() > deadline:
            raise _late(comm, timeout_s)
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    return handle.wait().cpu().numpy().tobytes()
