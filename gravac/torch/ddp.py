"""PyTorch DDP as gravac's dense baseline on torch.distributed: what a torchrun user runs
without gravac (as ``hvd.DistributedOptimizer`` is on Horovod).

Example::

    ddp = wrap_ddp(model, comm, fp16=True)       # DDP + its fp16_compress_hook
    loss_fn(ddp(x), y).backward()                 # gradients averaged during backward
    optimizer.step()                              # a plain torch optimizer
"""
from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from ..comm.torchdist import TorchDistComm


def wrap_ddp(model: torch.nn.Module, comm: TorchDistComm, fp16: bool = False) -> DistributedDataParallel:
    """``model`` in DDP over ``comm``'s process group (collective: DDP broadcasts rank 0's
    parameters and buffers). ``fp16``: gradients travel as fp16 (DDP's
    ``fp16_compress_hook``, the counterpart of Horovod's ``Compression.fp16``)."""
    if not isinstance(comm, TorchDistComm):
        raise ValueError(f"DDP needs the torch.distributed transport, got {comm.backend!r}")
    device_ids = [model_device.index] if (model_device := next(model.parameters()).device).type == "cuda" \
        else None
    ddp = DistributedDataParallel(model, device_ids=device_ids, process_group=comm.group)
    if fp16:
        ddp.register_comm_hook(comm.group, default_hooks.fp16_compress_hook)
    return ddp
