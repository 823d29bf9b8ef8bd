"""Transports: the ``Comm`` interface and its Horovod, torch.distributed and local forms.

``init(backend)`` starts the chosen one and returns the world's ``Comm``:

* ``"horovod"``: ``hvd.init()`` (under ``horovodrun``);
* ``"torch"``: ``torch.distributed.init_process_group`` with nccl when this process trains
  on a GPU (``gpu``), else gloo (under ``torchrun``, which sets the rendezvous environment);
* ``"local"``: one process, no launcher;
* ``"auto"``: what launched this process (``detect_backend``).

Its first collective is the version handshake (``handshake.py``): a job whose hosts run
different gravacs stops there, in one line, instead of hanging later.

Example::

    comm = gravac.comm.init("auto")
    print(comm.backend, comm.rank, comm.size)
    ...                      # train
    comm.close()             # every rank, after its last collective
"""
from __future__ import annotations

import importlib.util
import os
from typing import Mapping

from .base import OPS, Comm, Done, Handle
from .handshake import DEFAULT_TIMEOUT_S, VersionMismatch, agree_versions
from .local import LocalComm
from .process_exit import end_process

BACKENDS = ("auto", "horovod", "torch", "local")
#: How gravac waits for a Horovod collective (``horovod.py``): poll and "sleep", or "spin"
#: in Horovod's own loop; ``run.horovod_wait`` also takes "auto" (``init``).
WAIT_MODES = ("sleep", "spin")
HOROVOD_WAITS = ("auto", *WAIT_MODES)


#: The launcher that starts each transport's ranks.
LAUNCHERS = {"horovod": "horovodrun", "torch": "torchrun"}


def launched_by(environ: Mapping[str, str] | None = None) -> str | None:
    """The transport of the launcher that started this process, read from the environment
    it gives its ranks: ``"horovod"`` (horovodrun, or mpirun), ``"torch"`` (torchrun), or
    None (no launcher).

    >>> launched_by({"TORCHELASTIC_RUN_ID": "x", "LOCAL_RANK": "0", "WORLD_SIZE": "2"})
    'torch'
    >>> launched_by({}) is None
    True
    """
    env = os.environ if environ is None else environ
    if "HOROVOD_RANK" in env or "OMPI_COMM_WORLD_RANK" in env:
        return "horovod"
    if "TORCHELASTIC_RUN_ID" in env or ("LOCAL_RANK" in env and "WORLD_SIZE" in env):
        return "torch"
    return None


def detect_backend(environ: Mapping[str, str] | None = None) -> str:
    """The launcher of this process: ``"torch"`` under torchrun, ``"horovod"`` under
    horovodrun (or any process where Horovod is installed), ``"local"`` otherwise.

    >>> detect_backend({"TORCHELASTIC_RUN_ID": "x", "LOCAL_RANK": "0", "WORLD_SIZE": "2"})
    'torch'
    >>> detect_backend({"HOROVOD_RANK": "1"})
    'horovod'
    """
    launcher = launched_by(environ)
    if launcher is not None:
        return launcher
    # Only whether Horovod is installed: importing horovod.torch would load its library.
    return "horovod" if importlib.util.find_spec("horovod") is not None else "local"


def torch_launch_problem(environ: Mapping[str, str] | None = None) -> str | None:
    """Why torch.distributed cannot start its process group in a process with this
    environment (default: this process's), or None: neither torchrun nor the user gave it
    the rendezvous (torch.distributed's env:// reads MASTER_ADDR, MASTER_PORT, RANK and
    WORLD_SIZE).

    >>> torch_launch_problem({"TORCHELASTIC_RUN_ID": "x"}) is None
    True
    """
    env = os.environ if environ is None else environ
    if "MASTER_ADDR" in env or "TORCHELASTIC_RUN_ID" in env:
        return None
    return ("needs a torchrun launch (torchrun --nproc-per-node N ...) or "
            "MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE in the environment")


def _check_one_gpu_per_rank(gpus: int) -> None:
    """Before NCCL starts: this host has a GPU for each of its ranks (torchrun's
    ``LOCAL_WORLD_SIZE``). Why: NCCL refuses two ranks on one device, and a rank without a
    GPU of its own fails in ``set_device`` with "invalid device ordinal", which names
    neither the cause nor the way out (gloo, whose wire is the host)."""
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if ranks > gpus:
        raise RuntimeError(
            f"backend 'torch' on GPUs runs NCCL, which needs one GPU per rank: {ranks} ranks "
            f"share {gpus} GPU(s) on this host; start at most {gpus} rank(s) per host, or run "
            "gloo: gravac.comm.init('torch', gpu=False) (in train.py: run.device=cpu, which also "
            "trains on the CPU)")


def init(backend: str = "auto", horovod_cycle_time_ms="auto",
         horovod_wait: str = "auto", elastic: bool = False, gpu: bool | None = None,
         handshake_timeout_s: float = DEFAULT_TIMEOUT_S) -> Comm:
    """Start ``backend`` (see the module docstring) and return the world's ``Comm``.

    ``horovod_cycle_time_ms``: Horovod's background cycle (``horovod_cycle.py``): "auto"
    lengthens it on hosts with fewer than two cores per rank, a number sets it, "horovod"
    leaves it alone. ``horovod_wait``: "sleep" polls a collective's handle and sleeps
    between polls, "spin" waits in Horovod's own yield loop (``horovod.wait_sleeping``),
    "auto" sleeps where more ranks share a machine than it has cores (one collective, the
    ranks' host names, to find out; ``horovod.resolve_wait_mode``). ``elastic``: workers
    join a Horovod Elastic job at any time, so no collective may run here: "auto" counts
    the ranks Horovod places on this host instead. ``gpu``: whether this process trains on
    a GPU (torch.distributed then runs nccl on the local rank's GPU, else gloo); None:
    whenever one is visible; more ranks on a host than GPUs stop here in one line.
    ``handshake_timeout_s``: how long the version handshake waits for every rank to join
    (not run under ``elastic``, whose workers join at any time)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "auto":
        backend = detect_backend()
    if backend == "local":
        return LocalComm()
    if backend == "horovod":
        import horovod.torch as hvd

        from .horovod import HorovodComm, resolve_wait_mode, set_wait_mode
        from .horovod_cycle import apply_cycle_time
        if horovod_wait not in HOROVOD_WAITS:
            raise ValueError(f"horovod_wait must be one of {', '.join(HOROVOD_WAITS)}, "
                             f"got {horovod_wait!r}")
        apply_cycle_time(horovod_cycle_time_ms)   # read by hvd.init()
        hvd.init()
        comm = HorovodComm()
        if elastic:
            hosts, rank = [""] * hvd.local_size(), 0
        else:
            hosts, rank = agree_versions(comm, handshake_timeout_s), comm.rank
        set_wait_mode(*resolve_wait_mode(horovod_wait, hosts, rank, os.cpu_count() or 1))
        return comm
    import torch
    import torch.distributed as dist

    from .torchdist import TorchDistComm
    started = not dist.is_initialized()
    if started:
        problem = torch_launch_problem()
        if problem:
            raise RuntimeError(f"backend 'torch' {problem}")
        gpu = torch.cuda.is_available() if gpu is None else gpu
        if gpu:
            _check_one_gpu_per_rank(torch.cuda.device_count())
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl" if gpu else "gloo")
    comm = TorchDistComm(owns_process_group=started)
    agree_versions(comm, handshake_timeout_s)
    return comm


__all__ = ["BACKENDS", "LAUNCHERS", "OPS", "Comm", "Done", "Handle", "LocalComm",
           "VersionMismatch", "detect_backend", "end_process", "init", "launched_by",
           "torch_launch_problem"]
