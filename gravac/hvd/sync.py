"""The small agreement helper given to controllers: Horovod's broadcast_object."""
from __future__ import annotations

from typing import Any

import horovod.torch as hvd


class HorovodSync:
    """``Sync`` over Horovod (see ``gravac.controllers.base.Sync``)."""

    def __init__(self, process_set=None):
        self.process_set = process_set or hvd.global_process_set
        self.rank = self.process_set.rank()
        self.size = self.process_set.size()

    def broadcast_object(self, obj: Any, name: str) -> Any:
        return hvd.broadcast_object(obj, root_rank=0, name=name, process_set=self.process_set)
