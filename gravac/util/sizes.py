"""The size arithmetic of a step, written once: how many entries a CF keeps, how many bytes
a sparse chunk and a coded index field take, PowerSGD's matrix view and ranks.

The engine packs and sizes its buffers with these functions (``codec.py``,
``index_codec.py``, the compressors re-export them), and the cost model
(``benchmarks/scaling/``) prices a step with the same ones, so the two cannot drift. Only
the standard library: no torch, no NumPy (the cost model's arithmetic needs neither).

Example::

    from gravac.util import sizes
    k = [sizes.num_kept(n, 100) for n in (2000, 3000)]              # [20, 30]
    sizes.sparse_chunk_bytes((2000, 3000), k)                       # 8·6 + 200 + 200 = 448
    sizes.sparse_chunk_bytes((2000, 3000), k, coded=True)           # the coded fields instead
    sizes.rank_for_cf(*sizes.matrix_shape((100, 300)), cf=18.75)    # 4
"""
from __future__ import annotations

import math
from typing import NamedTuple, Sequence


# -- kept entries ----------------------------------------------------------------------------
def num_kept(n: int, cf: float) -> int:
    """Elements kept from ``n`` at compression factor ``cf``: ``max(1, ceil(n / cf))``,
    at most ``n``.

    >>> num_kept(1000, 10), num_kept(5, 1000), num_kept(7, 1.5)
    (100, 1, 5)
    """
    if cf < 1:
        raise ValueError(f"compression factor must be >= 1 (1 = dense), got {cf}")
    return min(n, max(1, math.ceil(n / cf)))


def pad8(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of 8: every section of a wire buffer starts
    aligned, so that it can be viewed as int64 or float64 in place.

    >>> pad8(0), pad8(1), pad8(8), pad8(20)
    (0, 8, 8, 24)
    """
    return -(-nbytes // 8) * 8


# -- the sparse chunk (codec.py) -------------------------------------------------------------
#: int64 fields of a chunk's header before the per-layer counts: magic, chunk bytes, wire
#: dtype code, number of layers.
CHUNK_HEADER_FIELDS = 4
#: A layer this large or larger takes int64 indices in a plain chunk. (Inclusive, where a
#: raw index field's rule, ``raw_index_bytes``, is not: a layer of exactly 2**31 entries
#: gets int64 in a plain chunk and int32 in a raw field. Both are wire formats: kept.)
INT64_INDEX_NUMEL = 2**31


def chunk_header_bytes(layers: int) -> int:
    """Bytes of a chunk's header: ``CHUNK_HEADER_FIELDS`` int64 fields and a count per
    layer.

    >>> chunk_header_bytes(2)
    48
    """
    return 8 * (CHUNK_HEADER_FIELDS + layers)


def plain_index_bytes(numels: Sequence[int]) -> int:
    """Bytes of an index in a plain chunk of layers of ``numels`` entries: int32, int64
    as soon as one layer has 2**31 entries or more.

    >>> plain_index_bytes([10, 2**31 - 1]), plain_index_bytes([10, 2**31])
    (4, 8)
    """
    return 8 if any(n >= INT64_INDEX_NUMEL for n in numels) else 4


class ChunkLayout(NamedTuple):
    """The sections of one rank's sparse chunk, in bytes, each a multiple of 8."""

    header: int
    values: int
    indices: int

    @property
    def total(self) -> int:
        return self.header + self.values + self.indices


def chunk_layout(numels: Sequence[int], counts: Sequence[int], value_bytes: int = 4,
                 coded: bool = False) -> ChunkLayout:
    """The chunk ``SparseCodec.pack`` makes of ``counts[l]`` entries of each layer of
    ``numels[l]``: the header, the values (``value_bytes`` each, the wire dtype's), then the
    indices, plain (``plain_index_bytes``) or, ``coded``, one index field per layer
    (``index_field_bytes(numel, count)``, the ``allgather_coded`` exchange).

    >>> chunk_layout([2000, 3000], [200, 300]).total            # 48 + 2000 + 2000
    4048
    >>> chunk_layout([2000, 3000], [200, 300], coded=True)
    ChunkLayout(header=48, values=2000, indices=544)
    """
    if len(numels) != len(counts):
        raise ValueError(f"{len(numels)} layers but {len(counts)} counts")
    total = sum(counts)
    if coded:
        indices = sum(index_field_bytes(n, c) for n, c in zip(numels, counts))
    else:
        indices = pad8(total * plain_index_bytes(numels))
    return ChunkLayout(chunk_header_bytes(len(numels)), pad8(total * value_bytes), indices)


def sparse_chunk_bytes(numels: Sequence[int], counts: Sequence[int], value_bytes: int = 4,
                       coded: bool = False) -> int:
    """Bytes of one rank's sparse chunk (``chunk_layout(...).total``).

    >>> sparse_chunk_bytes([2000, 3000], [20, 30])                # 48 + pad8(200) + pad8(200)
    448
    """
    return chunk_layout(numels, counts, value_bytes, coded).total


# -- coded index fields (index_codec.py) -----------------------------------------------------
#: low_bits -> (bytes of a block count, bytes of a low part): with L = 8 an int16 count per
#: block of 256 entries and a uint8 low byte per index; with L = 16 an int32 count per
#: block of 65,536 and an int16 low half. Tried in this order after raw, strictly smaller
#: wins (raw on a tie: the cheapest to decode).
INDEX_FIELD_PARTS = {16: (4, 2), 8: (2, 1)}


def raw_index_bytes(numel: int) -> int:
    """Bytes of an index in a raw field of a layer of ``numel`` entries: int32, int64 for
    layers of more than 2**31 entries.

    >>> raw_index_bytes(2**31), raw_index_bytes(2**31 + 1)
    (4, 8)
    """
    return 8 if numel > INT64_INDEX_NUMEL else 4


def index_field_blocks(numel: int, low_bits: int) -> int:
    """Blocks of 2**low_bits entries covering a layer of ``numel`` (0 for a raw field).

    >>> index_field_blocks(70_000, 16), index_field_blocks(70_000, 8), index_field_blocks(9, 0)
    (2, 274, 0)
    """
    return -(-numel // (1 << low_bits)) if low_bits else 0


def index_field_layout(numel: int, capacity: int) -> tuple[int, int]:
    """(low_bits, bytes) of the smallest index field for up to ``capacity`` ascending
    indices of a layer of ``numel`` entries: raw (low_bits 0), L = 16 or L = 8, each part
    padded to 8 bytes. Depends on nothing else, so every rank finds the same layout.

    >>> index_field_layout(2_560_000, 256_000), index_field_layout(2_560_000, 2_560)
    ((8, 276000), (16, 5280))
    >>> index_field_layout(10, 0)
    (0, 0)
    """
    if capacity < 0 or numel < 0:
        raise ValueError(f"numel and capacity must be >= 0, got {numel} and {capacity}")
    best = (0, pad8(capacity * raw_index_bytes(numel)))
    for bits, (count_bytes, low_bytes) in INDEX_FIELD_PARTS.items():
        nbytes = pad8(index_field_blocks(numel, bits) * count_bytes) + pad8(capacity * low_bytes)
        if nbytes < best[1]:
            best = (bits, nbytes)
    return best


def index_field_bytes(numel: int, capacity: int) -> int:
    """Bytes of the smallest index field for up to ``capacity`` indices of a layer of
    ``numel`` (``index_field_layout``'s).

    >>> index_field_bytes(2000, 200), index_field_bytes(3000, 300)    # L = 8: 16 + 200, 24 + 304
    (216, 328)
    """
    return index_field_layout(numel, capacity)[1]


# -- PowerSGD (compressors/powersgd.py) ------------------------------------------------------
def matrix_shape(shape) -> tuple[int, int]:
    """The matrix view of a tensor of ``shape``: (first dimension, product of the rest).

    >>> matrix_shape((64, 3, 3, 3)), matrix_shape((10,)), matrix_shape(())
    ((64, 27), (10, 1), (1, 1))
    """
    shape = tuple(int(s) for s in shape)
    if not shape:
        return 1, 1
    return shape[0], math.prod(shape[1:])


def compression_factor(rows: int, cols: int, rank: int) -> float:
    """CF of the rank-``rank`` form of a rows x cols matrix: rows·cols / (rank·(rows+cols)).

    >>> compression_factor(100, 300, 1), compression_factor(100, 300, 4)
    (75.0, 18.75)
    """
    if rank < 1:
        raise ValueError(f"PowerSGD rank must be >= 1, got {rank}")
    return rows * cols / (rank * (rows + cols))


def rank_for_cf(rows: int, cols: int, cf: float) -> int:
    """The largest rank whose CF is at least ``cf``; 1 when even rank 1 is below it.

    >>> rank_for_cf(100, 300, 75), rank_for_cf(100, 300, 74.9), rank_for_cf(100, 300, 18.75)
    (1, 1, 4)
    >>> rank_for_cf(100, 300, 18.76), rank_for_cf(100, 300, 1000)
    (3, 1)
    """
    if isinstance(cf, bool) or not isinstance(cf, (int, float)) or math.isnan(cf) or cf < 1:
        raise ValueError(f"compression factor must be a number >= 1 (1 = dense), got {cf!r}")
    # The closed form, then exact checks with compression_factor itself: the answer must
    # agree with the CF the step record reports, whatever floating point did on the way.
    rank = max(1, int(rows * cols // (cf * (rows + cols))))
    while compression_factor(rows, cols, rank + 1) >= cf:
        rank += 1
    while rank > 1 and compression_factor(rows, cols, rank) < cf:
        rank -= 1
    return rank


# -- collectives ------------------------------------------------------------------------------
#: "allreduce_fp16": an allreduce of float16 values (Horovod's fp16 compression), priced
#: as a ring allreduce on a link of its own: Gloo sums fp16 on the CPU element by element,
#: slower per byte than fp32 (calibrated where measured, else the allreduce's link).
COLLECTIVES = ("allreduce", "allgather", "broadcast", "allreduce_fp16")


def collective_terms(kind: str, nbytes: float, n: int) -> tuple[float, float]:
    """(latency count, bytes through the slowest link) of one collective over ``n``
    ranks; its time is α·first + β·second. ``nbytes``: the buffer (allreduce, broadcast)
    or each rank's contribution (allgather). One rank or no bytes: nothing is sent.

    * ring allreduce (Gloo's): 2(n−1) steps of B/n bytes: 2(n−1)α + 2(n−1)/n·B·β;
    * ring allgather: n−1 steps of B: (n−1)α + (n−1)·B·β;
    * broadcast, Gloo's binomial tree: ⌈log2 n⌉ rounds of B: ⌈log2 n⌉·(α + B·β).

    >>> collective_terms("allreduce", 100, 4), collective_terms("allgather", 100, 4)
    ((6, 150.0), (3, 300))
    >>> collective_terms("broadcast", 100, 5)
    (3, 300)
    """
    if n <= 1 or nbytes <= 0:
        return (0, 0)
    if kind in ("allreduce", "allreduce_fp16"):
        return (2 * (n - 1), 2 * (n - 1) / n * nbytes)
    if kind == "allgather":
        return (n - 1, (n - 1) * nbytes)
    if kind == "broadcast":
        rounds = math.ceil(math.log2(n))
        return (rounds, rounds * nbytes)
    raise ValueError(f"collective must be one of {', '.join(COLLECTIVES)}, got {kind!r}")
