"""What a model's step communicates: its parameters' shapes, which are compressed, how many
entries a CF keeps and the bytes they take, and PowerSGD's P and Q (docs/SCALING.md §1.3).

Every count comes from ``gravac/util/sizes.py``, the arithmetic the engine packs its
buffers with: the model has no size rule of its own.

Example::

    m = ModelShapes.from_params([("conv", (64, 3, 3, 3)), ("bias", (64,))])
    m.n_total, m.n_comp, m.kept_total(10)        # 1792, 1728, 173
    m.chunk_bytes(10), m.chunk_bytes(10, coded=True)    # one rank's sparse buffer
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from gravac.util import sizes


@dataclass(frozen=True)
class LowRank:
    """What PowerSGD sends at one (r_min, r_sent): floats of P and Q, the elements that go
    low-rank, the elements that go dense, and the low-rank layers' Σ n·r_min."""

    p_floats: int
    q_floats: int
    lowrank_numel: int
    dense_numel: int
    layers: int
    n_times_rank: int
    rank_sum: int           # Σ r_min over the low-rank layers (Gram-Schmidt's columns)


class ModelShapes:
    """The parameters a step communicates: names and shapes, which are compressed.

    Example::

        m = ModelShapes.from_params([("conv", (64, 3, 3, 3)), ("bias", (64,))])
        m.n_total, m.n_comp, m.kept_total(10)        # 1792, 1728, 173
    """

    def __init__(self, params: Sequence[tuple[str, tuple]], min_compress_numel: int = 1024,
                 name: str = "model", lowrank_min_cf: float = 1.0):
        self.name = name
        self.params = [(str(n), tuple(int(s) for s in shape)) for n, shape in params]
        self.min_compress_numel = int(min_compress_numel)
        self.lowrank_min_cf = float(lowrank_min_cf)
        numels = [math.prod(shape) if shape else 1 for _, shape in self.params]
        self.numels = numels
        self.comp = [n for n in numels if n >= self.min_compress_numel]
        self.comp_shapes = [s for (_, s), n in zip(self.params, numels)
                            if n >= self.min_compress_numel]
        self.n_total = sum(numels)
        self.n_comp = sum(self.comp)
        self.n_dense = self.n_total - self.n_comp
        self.layers_comp = len(self.comp)
        # Caches: a projection prices the same CFs for every N and link.
        self._kept: dict[float, list[int]] = {}
        self._chunk: dict[tuple[float, bool], int] = {}
        self._fields: dict[float, int] = {}
        self._lowrank: dict = {}

    @classmethod
    def from_params(cls, params, min_compress_numel: int = 1024, name: str = "model"):
        return cls(params, min_compress_numel, name)

    @classmethod
    def from_module(cls, module, min_compress_numel: int = 1024, name: str = "model"):
        """Shapes of ``module``'s trainable parameters, in ``named_parameters`` order (tied
        weights once, as the optimizer sees them)."""
        return cls([(n, tuple(p.shape)) for n, p in module.named_parameters() if p.requires_grad],
                   min_compress_numel, name)

    # -- sparse --------------------------------------------------------------------------
    def kept(self, theta: float) -> list[int]:
        """k of each compressed layer at CF θ (``sizes.num_kept``: Top-k's exact count)."""
        if theta not in self._kept:
            self._kept[theta] = [sizes.num_kept(n, theta) for n in self.comp]
        return self._kept[theta]

    def kept_total(self, theta: float) -> int:
        """Σ k over the compressed layers at CF θ."""
        return sum(self.kept(theta))

    def chunk_bytes(self, theta: float, coded: bool = False) -> int:
        """One rank's sparse buffer with every compressed layer at CF θ, fp32 values
        (``sizes.sparse_chunk_bytes``, what ``SparseCodec.pack`` returns); ``coded``: the
        indices in index fields (the ``allgather_coded`` exchange)."""
        key = (theta, coded)
        if key not in self._chunk:
            self._chunk[key] = sizes.sparse_chunk_bytes(self.comp, self.kept(theta),
                                                        coded=coded)
        return self._chunk[key]

    def index_fields_bytes(self, theta: float) -> int:
        """Σ over the compressed layers of the index field of Top-k's k at CF θ
        (``sizes.index_field_bytes``, as shared_index's leaders and the coded chunk size
        them)."""
        if theta not in self._fields:
            self._fields[theta] = sum(sizes.index_field_bytes(n, k)
                                      for n, k in zip(self.comp, self.kept(theta)))
        return self._fields[theta]

    # -- low rank ------------------------------------------------------------------------
    def lowrank(self, r_min: tuple, r_sent: tuple) -> LowRank:
        """PowerSGD's traffic with per-layer ranks given by ``r_min``/``r_sent`` specs:
        ``("rank", r)`` (a rank for every layer, capped at min(rows, cols)) or ``("cf", θ)``
        (``rank_for_cf`` per layer); r_sent is capped by r_min (the candidate's columns
        are a prefix). A layer goes low-rank when its CF at r_min is above ``min_cf``."""
        key = (r_min, r_sent)
        if key not in self._lowrank:
            p = q = numel = layers = nr = rs_sum = 0
            for shape, n in zip(self.comp_shapes, self.comp):
                rows, cols = sizes.matrix_shape(shape)
                rm = self._rank(r_min, rows, cols)
                if sizes.compression_factor(rows, cols, rm) <= self.lowrank_min_cf:
                    continue
                rs = min(self._rank(r_sent, rows, cols), rm)
                p += rows * rm
                q += cols * rs
                numel += n
                layers += 1
                nr += n * rm
                rs_sum += rm
            self._lowrank[key] = LowRank(p, q, numel, self.n_total - numel, layers, nr, rs_sum)
        return self._lowrank[key]

    @staticmethod
    def _rank(spec: tuple, rows: int, cols: int) -> int:
        kind, value = spec
        if kind == "rank":
            return max(1, min(int(value), rows, cols))
        return sizes.rank_for_cf(rows, cols, float(value))

    # -- files ---------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"name": self.name, "min_compress_numel": self.min_compress_numel,
                "params": [[n, list(s)] for n, s in self.params]}

    @classmethod
    def from_json(cls, data: dict) -> "ModelShapes":
        return cls([(n, tuple(s)) for n, s in data["params"]],
                   data.get("min_compress_numel", 1024), data.get("name", "model"))
