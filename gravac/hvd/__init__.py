"""The Horovod front end: ``DistributedOptimizer`` over ``gravac.comm.horovod.HorovodComm``."""
from .optimizer import DistributedOptimizer

__all__ = ["DistributedOptimizer"]
