"""Everything that touches Horovod: the transport format, the sync helper, the optimizer."""
from .compression import SparseCompression, SparseLayer
from .optimizer import DistributedOptimizer
from .sync import HorovodSync

__all__ = ["DistributedOptimizer", "SparseCompression", "SparseLayer", "HorovodSync"]
