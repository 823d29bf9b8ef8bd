"""The Horovod front end: ``DistributedOptimizer`` over ``gravac.comm.horovod.HorovodComm``
and ``Compression``, Horovod's namespace with gravac's methods."""
from .compression import Compression, GravacCompression
from .optimizer import DistributedOptimizer

__all__ = ["Compression", "DistributedOptimizer", "GravacCompression"]
