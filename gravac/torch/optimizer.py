"""gravac.torch.DistributedOptimizer: the same optimizer on torch.distributed (torchrun).

It behaves exactly as the Horovod front end (``gravac.DistributedOptimizer``): the same
engine, the same step record, the same checkpoints; only the transport differs (gloo on
CPU, nccl on GPU). Use it where jobs start with ``torchrun`` instead of ``horovodrun``.
"""
from __future__ import annotations

from ..comm.torchdist import TorchDistComm
from ..engine.optimizer import wrap_optimizer
from ..engine.options import GravacOptions


def DistributedOptimizer(optimizer, named_parameters=None, compressor="topk", controller=None,
                         compressor_options: dict | None = None, group=None, **options):
    """Wrap a torch optimizer so that ``step()`` averages gradients across the ranks of a
    torch.distributed process group with compressed communication and error feedback.

    Arguments as ``gravac.DistributedOptimizer`` (see its docstring), with ``group`` (a
    torch.distributed process group; default: the world) in place of Horovod's
    ``process_set``; ``options`` are the fields of ``gravac.engine.GravacOptions``, Horovod's
    ``backward_passes_per_step``, ``op`` (``"average"`` or ``"sum"``) and
    ``gradient_predivide_factor`` among them. Initialise the process group first.

    Example (``torchrun --nproc-per-node 2 train_me.py``)::

        import torch, torch.distributed as dist, gravac.torch
        dist.init_process_group("gloo")
        model = Net()
        opt = gravac.torch.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
            compressor="topk", controller=gravac.controllers.Static(cf=100))
        for p in model.state_dict().values():      # start from rank 0's weights
            dist.broadcast(p, src=0)
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        dist.barrier(); dist.destroy_process_group()
        gravac.comm.end_process(0)     # after gloo: no finalization (docs/USAGE.md)
    """
    return wrap_optimizer(optimizer, named_parameters, TorchDistComm(group),
                          compressor=compressor, controller=controller,
                          compressor_options=compressor_options, **options)


DistributedOptimizer.__doc__ += "\n    Options:\n" + GravacOptions.doc() + "\n"
