"""Where a rank trains: ``run.device`` (auto, cpu, cuda) turned into this rank's device.

``cuda`` gives each rank the GPU of its local rank (``cuda:<local_rank>``), as
torchvision's reference train.py and Horovod's examples do; ``auto`` takes it when the
process sees a GPU and its transport can move GPU tensors (always for one process and
torch.distributed, which then runs nccl; for Horovod only when it was built with GPU
operations), else the CPU. A request that cannot be met is one line naming
``run.device`` and the fix, before any work starts.

Example::

    comm = gravac.comm.init("auto", gpu=wants_gpu("auto"))
    device = rank_device("auto", comm)          # cuda:0 on a GPU machine, else cpu
    model.to(device)
"""
from __future__ import annotations

import torch

from ..util.choices import one_of
from .config import DEVICES, ConfigError


def wants_gpu(setting: str) -> bool:
    """Before the transport starts: whether this process will train on a GPU (torch.distributed
    then takes nccl, else gloo)."""
    return setting != "cpu" and torch.cuda.is_available()


def _horovod_gpu_ops() -> bool:
    """Whether this Horovod build moves GPU tensors itself (NCCL or CUDA-aware MPI/Gloo)."""
    import horovod.torch as hvd

    return bool(hvd.nccl_built() or hvd.cuda_built() or hvd.rocm_built())


def gpu_problem(backend: str) -> str | None:
    """Why this process cannot train on a GPU over transport ``backend`` ("horovod",
    "torch", "local"), said as ``run.device=cuda``'s refusal; None when it can. What
    ``rank_device`` refuses, and ``train.py --here --check`` before a launch on this host."""
    if not torch.cuda.is_available():
        return ("run.device='cuda': this process sees no CUDA GPU (torch.cuda.is_available() "
                "is False: a CPU build of torch, or no driver); use run.device=cpu or auto")
    if backend == "horovod" and not _horovod_gpu_ops():
        return ("run.device='cuda': this Horovod was built without GPU operations, so it "
                "cannot move CUDA tensors; rebuild it with HOROVOD_GPU_OPERATIONS=NCCL, launch "
                "with torchrun (run.backend=torch), or use run.device=cpu")
    return None


def rank_device(setting: str, comm) -> torch.device:
    """This rank's device for ``run.device=setting`` on transport ``comm`` (started)."""
    if setting not in DEVICES:
        raise ConfigError(f"run.device={setting!r}: {one_of(setting, DEVICES)}")
    if setting == "cpu":
        return torch.device("cpu")
    problem = gpu_problem(comm.backend)
    if problem is not None:
        if setting == "auto":
            return torch.device("cpu")
        raise ConfigError(problem)
    if comm.backend == "torch":
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_backend() != "nccl":
            if setting == "auto":
                return torch.device("cpu")
            raise ConfigError(f"run.device='cuda': torch.distributed runs "
                              f"{dist.get_backend()}, not nccl; start it with a GPU visible "
                              "(gravac.comm.init picks nccl then) or use run.device=cpu")
    count = torch.cuda.device_count()
    if comm.local_rank >= count:
        raise ConfigError(f"run.device={setting!r}: local rank {comm.local_rank} needs GPU "
                          f"{comm.local_rank} but this host has {count}; start at most "
                          f"{count} rank(s) per host or use run.device=cpu")
    device = torch.device("cuda", comm.local_rank)
    torch.cuda.set_device(device)
    return device


def describe_device(device: torch.device) -> str:
    """``cpu`` or ``cuda:0 (NVIDIA H200)``."""
    if device.type != "cuda":
        return str(device)
    return f"{device} ({torch.cuda.get_device_name(device)})"


def to_device(batch, device: torch.device):
    """A batch (a tensor or a tuple/list of them) on ``device``; CPU stays as is.

    From pinned memory the copy runs asynchronously; the tensors here are pageable, for
    which ``non_blocking`` is harmless."""
    if device.type == "cpu":
        return batch
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    return type(batch)(to_device(t, device) for t in batch)
