"""gravac: adaptive gradient compression for data-parallel PyTorch on Horovod.

Example::

    import horovod.torch as hvd, torch, gravac
    hvd.init()
    opt = gravac.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      model.named_parameters(), compressor="topk",
                                      controller=gravac.controllers.Static(cf=100))

Under torchrun, ``gravac.torch.DistributedOptimizer`` is the same optimizer on
torch.distributed. ``gravac.compressors``, ``memory``, ``controllers`` and ``engine`` are
pure PyTorch; only ``gravac.hvd`` / ``gravac.comm.horovod`` (and
``gravac.DistributedOptimizer``) import Horovod, only ``gravac.torch`` /
``gravac.comm.torchdist`` import torch.distributed.
"""
from . import comm, compressors, controllers, engine, memory

__version__ = "0.1.0"


def __getattr__(name):
    # Horovod is imported only when the optimizer is used, so the pure tensor code (and
    # its unit tests) works without initialising Horovod.
    if name == "DistributedOptimizer":
        from .hvd.optimizer import DistributedOptimizer
        return DistributedOptimizer
    # The front ends on first use: ``import gravac`` then ``gravac.torch.DistributedOptimizer``
    # works as after ``import gravac.torch``.
    if name in ("torch", "hvd"):
        import importlib
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'gravac' has no attribute {name!r}")


__all__ = ["DistributedOptimizer", "comm", "compressors", "controllers", "engine", "memory",
           "__version__"]
