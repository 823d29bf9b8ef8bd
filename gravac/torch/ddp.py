"""PyTorch DDP as gravac's dense baseline on torch.distributed: what a torchrun user runs
without gravac (as ``hvd.DistributedOptimizer`` is on Horovod).

Example::

    ddp = wrap_ddp(model, comm, fp16=True)       # DDP + its fp16_compress_hook
    ddp = wrap_ddp(model, comm, powersgd_rank=4, start_powersgd_iter=30)   # + its PowerSGD hook
    loss_fn(ddp(x), y).backward()                 # gradients averaged during backward
    optimizer.step()                              # a plain torch optimizer
"""
from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

from ..comm.torchdist import TorchDistComm


def wrap_ddp(model: torch.nn.Module, comm: TorchDistComm, fp16: bool = False,
             powersgd_rank: int | None = None, start_powersgd_iter: int = 1000,
             seed: int = 0, comm_hook: tuple | None = None,
             bucket_cap_mb: float | None = None) -> DistributedDataParallel:
    """``model`` in DDP over ``comm``'s process group (collective: DDP broadcasts rank 0's
    parameters and buffers). ``fp16``: gradients travel as fp16 (DDP's
    ``fp16_compress_hook``, the counterpart of Horovod's ``Compression.fp16``).
    ``powersgd_rank``: DDP's own PowerSGD hook at that rank, with error feedback and warm
    start, plain allreduce for the first ``start_powersgd_iter`` steps (PyTorch's advice:
    let the early, fast-changing gradients through uncompressed); its state (Q, errors)
    lives in the hook and is not in gravac's checkpoints. ``comm_hook``: (state, hook) of
    another hook, e.g. gravac's own (``gravac.torch.hooks``). ``bucket_cap_mb``: DDP's
    bucket size (None: DDP's default; ``float("inf")``: one bucket for the model)."""
    if not isinstance(comm, TorchDistComm):
        raise ValueError(f"DDP needs the torch.distributed transport, got {comm.backend!r}")
    if sum([fp16, powersgd_rank is not None, comm_hook is not None]) > 1:
        raise ValueError("DDP takes one communication hook: fp16, PowerSGD or another, "
                         "not two")
    device_ids = [model_device.index] if (model_device := next(model.parameters()).device).type == "cuda" \
        else None
    size_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    options = {}
    if bucket_cap_mb is not None:
        options["bucket_cap_mb"] = min(bucket_cap_mb, max(25.0, size_mb + 1.0))
    if powersgd_rank is not None and device_ids is None:
        # The PowerSGD hook issues each bucket's second allreduce (Q) from the first one's
        # completion callback; on Gloo two buckets' callbacks may then issue their
        # collectives in a different order on each rank (seen: "Received data size doesn't
        # match expected size" at the first PowerSGD step of the 5.4M-parameter LSTM). One
        # bucket for the whole model leaves a single chain.
        options["bucket_cap_mb"] = max(25.0, size_mb + 1.0)
    ddp = DistributedDataParallel(model, device_ids=device_ids, process_group=comm.group,
                                  **options)
    if fp16:
        ddp.register_comm_hook(comm.group, default_hooks.fp16_compress_hook)
    elif powersgd_rank is not None:
        state = powerSGD_hook.PowerSGDState(
            process_group=comm.group, matrix_approximation_rank=powersgd_rank,
            start_powerSGD_iter=start_powersgd_iter, random_seed=seed)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    elif comm_hook is not None:
        ddp.register_comm_hook(*comm_hook)
    return ddp
