"""The per-step pipeline, independent of the transport (see ``step.py``).

``wrap_optimizer`` (what the front ends return), ``GravacOptions`` (its options, once),
``StepEngine`` (the pipeline), ``EXCHANGES`` (how values travel: ``exchanges/``),
``StepStats`` and the metrics field names (``record.py``: the one definition of a step
record), ``SparseCodec`` (the byte format). Imports torch only: never horovod or
torch.distributed.
"""
from .codec import SparseCodec, SparseLayer
from .exchanges import EXCHANGES
from .layers import Layer, build_layers
from .optimizer import STATE_KEY, DistributedOptimizerMixin, broadcast_optimizer_state, wrap_optimizer
from .options import DENSE_WIRES, EXCHANGE_KINDS, GravacOptions
from .record import METRICS_FILE, SENT_SKIPPED, SENT_VALUES, STEP_FIELDS, StepStats
from .step import StepEngine

__all__ = ["DENSE_WIRES", "DistributedOptimizerMixin", "EXCHANGES", "EXCHANGE_KINDS",
           "GravacOptions", "Layer", "METRICS_FILE", "SENT_SKIPPED", "SENT_VALUES", "STATE_KEY",
           "STEP_FIELDS", "SparseCodec", "SparseLayer", "StepEngine", "StepStats",
           "broadcast_optimizer_state", "build_layers", "wrap_optimizer"]
