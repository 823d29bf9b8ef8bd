"""The torch.distributed front end (torchrun): ``gravac.torch.DistributedOptimizer``."""
from ..engine.optimizer import broadcast_optimizer_state
from .optimizer import DistributedOptimizer

__all__ = ["DistributedOptimizer", "broadcast_optimizer_state"]
