"""The per-step pipeline, independent of the transport (see ``step.py``).

``wrap_optimizer`` (what the front ends return), ``StepEngine`` (the pipeline),
``StepStats`` and the metrics field names (``record.py``: the one definition of a step
record), ``SparseCodec`` (the byte format), ``AllgatherExchange`` (how values travel).
Imports torch only: never horovod or torch.distributed.
"""
from .codec import SparseCodec, SparseLayer
from .exchange import DENSE_WIRE, AllgatherExchange
from .layers import Layer, build_layers
from .optimizer import STATE_KEY, DistributedOptimizerMixin, broadcast_optimizer_state, wrap_optimizer
from .record import METRICS_FILE, SENT_SKIPPED, SENT_VALUES, STEP_FIELDS, StepStats
from .step import StepEngine

__all__ = ["AllgatherExchange", "DENSE_WIRE", "DistributedOptimizerMixin", "Layer",
           "METRICS_FILE", "SENT_SKIPPED", "SENT_VALUES", "STATE_KEY", "STEP_FIELDS",
           "SparseCodec", "SparseLayer", "StepEngine", "StepStats", "broadcast_optimizer_state", "build_layers",
           "wrap_optimizer"]
