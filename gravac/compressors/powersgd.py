"""PowerSGD (Vogels et al., NeurIPS 2019): low-rank compression, the math only.

A layer's gradient is viewed as a matrix M (rows = the first dimension, cols = the rest)
and approximated by P Qᵀ of rank r: P = M Q, P orthogonalised, Q = Mᵀ P, M̂ = P Qᵀ. Q is
kept between steps (warm start) and starts from draws that are the same on every rank.
How P and Q travel (two grouped allreduces per step, all layers together) and error
feedback are the engine's business (``gravac/engine/exchanges/lowrank.py``); this module is pure
tensor code: no communication, no residuals, never the global RNG.

CF of a rank-r layer: rows·cols / (r·(rows + cols)). A CF asked by a controller maps to
the largest rank whose CF is at least the one asked, and at least 1 (``rank_for_cf``).

Example::

    comp = gravac.compressors.get("powersgd")
    rows, cols = matrix_shape(grad.shape)
    r = rank_for_cf(rows, cols, cf=100)
    q = comp.warm_start("fc.weight", cols, r, like=grad)      # cols x r, same on all ranks
    m = grad.reshape(rows, cols).float()
    p = orthogonalize_(m @ q)                                  # (allreduce P first)
    q_new = m.t() @ p                                          # (allreduce Q)
    m_hat = p @ q_new.t()
    comp.adopt("fc.weight", q_new)                             # next step's warm start
"""
from __future__ import annotations

import math
import zlib

import torch

# The matrix view, the CF of a rank and the rank of a CF: gravac/util/sizes.py, the cost
# model's too.
from ..util.sizes import compression_factor, matrix_shape, rank_for_cf  # noqa: F401
from .base import Compressor, SelectContext, mix_seed


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype factors are computed and sent in: fp16/bf16 gradients in fp32 (a
    Gram-Schmidt in 8-11 mantissa bits loses orthogonality), fp64 stays fp64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def orthogonalize_(p: torch.Tensor) -> torch.Tensor:
    """Orthonormalise the columns of ``p`` (rows x r) in place, in order (Gram-Schmidt,
    each projection done twice), and return it.

    Column j depends only on columns 0..j, so the first c columns of the result are the
    orthogonalisation of the first c columns of the input: the rank-c PowerSGD result is a
    prefix of the rank-r one (GraVAC's multi-level compression uses this). A column that is
    (numerically) in the span of the ones before it becomes zero instead of noise.
    """
    if p.dim() != 2:
        raise ValueError(f"orthogonalize_ expects a matrix, got shape {tuple(p.shape)}")
    if p.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"orthogonalize_ needs float32 or float64 (compute fp16/bf16 factors in "
                         f"float32: compute_dtype), got {p.dtype}")
    r = p.shape[1]
    tiny = torch.finfo(p.dtype).tiny
    # A column whose norm shrank below this fraction of its norm before the projections
    # was numerically dependent: its direction is rounding noise.
    rel = 64 * torch.finfo(p.dtype).eps
    for j in range(r):
        col = p[:, j]
        if j:
            # Subtract the projections on the columns already orthonormalised (twice:
            # "twice is enough" keeps the result orthogonal to working precision).
            before = torch.linalg.vector_norm(col)
            for _ in range(2):
                col -= p[:, :j] @ (p[:, :j].t() @ col)
            norm = torch.linalg.vector_norm(col)
            keep = norm > rel * before
        else:
            norm = torch.linalg.vector_norm(col)
            keep = norm > 0
        # No host sync: the zero column is chosen on the device.
        col.mul_(torch.where(keep, 1.0 / norm.clamp_min(tiny), torch.zeros_like(norm)))
    return p


#: From this many matrices of one rank (and dtype, device) on a GPU, ``orthogonalize_all_``
#: runs the Gram-Schmidt of them together. Why: column by column each matrix costs ~10
#: launches per column; ResNet-101's 161 layers at rank 4 made ~7,000 launches a step and
#: PowerSGD's step took 100 ms on an H200 whose kernels were busy for 6 of them.
BATCH_MIN_MATRICES = 2


def orthogonalize_all_(ps: list[torch.Tensor], batched: bool | None = None) -> None:
    """``orthogonalize_`` of each matrix in ``ps`` (rows x r each), in place. On a GPU
    (``batched`` None; True forces it), matrices of one rank, dtype and device go through
    one batched Gram-Schmidt: stacked into a zero-padded (count, most rows, r) tensor, the
    same projections (twice), norms and zero-column rule per matrix as ``orthogonalize_``,
    the padding rows staying zero, then copied back. The same math in another summation
    order: equal to ``orthogonalize_`` to float rounding, and column j still depends on
    columns 0..j only (the prefix property GraVAC's levels use)."""
    if batched is None:
        batched = bool(ps) and ps[0].device.type != "cpu"
    groups: dict[tuple, list[torch.Tensor]] = {}
    for p in ps:
        if p.dim() != 2:
            raise ValueError(f"orthogonalize_ expects a matrix, got shape {tuple(p.shape)}")
        groups.setdefault((p.shape[1], p.dtype, p.device), []).append(p)
    for group in groups.values():
        if not batched or len(group) < BATCH_MIN_MATRICES or not all(
                p.is_contiguous() for p in group):
            for p in group:
                orthogonalize_(p)
            continue
        _orthogonalize_batch_(group)


def _orthogonalize_batch_(group: list[torch.Tensor]) -> None:
    p0 = group[0]
    if p0.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"orthogonalize_ needs float32 or float64 (compute fp16/bf16 factors in "
                         f"float32: compute_dtype), got {p0.dtype}")
    r = p0.shape[1]
    batch = torch.zeros(len(group), max(p.shape[0] for p in group), r, dtype=p0.dtype,
                        device=p0.device)
    slots = [batch[i, :p.shape[0]] for i, p in enumerate(group)]   # contiguous views
    torch._foreach_copy_(slots, group)
    tiny = torch.finfo(p0.dtype).tiny
    rel = 64 * torch.finfo(p0.dtype).eps
    for j in range(r):
        col = batch[:, :, j:j + 1]                                   # (count, rows, 1)
        if j:
            before = torch.linalg.vector_norm(col, dim=1, keepdim=True)
            done = batch[:, :, :j]
            for _ in range(2):
                col -= torch.bmm(done, torch.bmm(done.transpose(1, 2), col))
            norm = torch.linalg.vector_norm(col, dim=1, keepdim=True)
            keep = norm > rel * before
        else:
            norm = torch.linalg.vector_norm(col, dim=1, keepdim=True)
            keep = norm > 0
        col.mul_(torch.where(keep, 1.0 / norm.clamp_min(tiny), torch.zeros_like(norm)))
    torch._foreach_copy_(group, slots)


class PowerSGD(Compressor):
    """Low-rank compressor kind: keeps each layer's warm-start Q and the rank rules.

    Not a sparsifier: ``select`` is not available; ``gravac.engine`` runs it through its
    low-rank path (P and Q in one grouped allreduce each, all layers together). Any
    controller drives it: a CF maps to a rank per layer (``rank_for_cf``); Static and
    Accordion can also be configured in ranks (``compression.rank``,
    ``compression.accordion.low_rank``/``high_rank``).

    Args:
        seed: seeds the initial Q of every layer, the same on every rank (a private
            generator per layer and column, never the global RNG).
        min_cf: a layer goes low-rank only when its CF at the rank used is above this;
            otherwise it is sent dense. The default 1 sends a layer dense when its rank-r
            form is not smaller than the dense gradient; 0 always sends low-rank (tests, or
            to see rank = min(rows, cols) reproduce the dense average).

    Example::

        opt = gravac.DistributedOptimizer(opt, model.named_parameters(),
                                          compressor="powersgd",
                                          controller=Static(cf=100, rank=4))
    """

    name = "powersgd"
    is_lowrank = True

    def __init__(self, seed: int = 0, min_cf: float = 1.0):
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"PowerSGD(seed={seed!r}): seed must be an int")
        if isinstance(min_cf, bool) or not isinstance(min_cf, (int, float)) \
                or math.isnan(min_cf) or min_cf < 0:
            raise ValueError(f"PowerSGD(min_cf={min_cf!r}): min_cf must be a number >= 0 "
                             "(1: layers whose rank-r form is not smaller go dense)")
        self.seed = seed
        self.min_cf = float(min_cf)
        self._q: dict[str, torch.Tensor] = {}

    # -- rank rules -------------------------------------------------------------------------
    def rank_of(self, shape, cf: float) -> int:
        """The rank of a layer of ``shape`` at CF ``cf`` (``rank_for_cf`` of its matrix)."""
        return rank_for_cf(*matrix_shape(shape), cf)

    def sends_low_rank(self, shape, rank: int) -> bool:
        """Whether a layer of ``shape`` at ``rank`` goes low-rank (its CF above ``min_cf``)."""
        return compression_factor(*matrix_shape(shape), rank) > self.min_cf

    # -- warm-start Q ---------------------------------------------------------------------
    def _column_seed(self, name: str, j: int) -> int:
        # crc32, not hash(): Python salts str hashes per process, ranks must agree.
        return mix_seed(self.seed, zlib.crc32(name.encode("utf-8")), j)

    def warm_start(self, name: str, cols: int, rank: int, like: torch.Tensor) -> torch.Tensor:
        """Layer ``name``'s Q (cols x rank, ``compute_dtype`` on ``like``'s device), a view
        of the state kept between steps. Columns never used before are drawn now: column j
        from a generator seeded by (seed, name, j), so the same on every rank and the same
        whichever rank a layer first ran at. They are drawn on the CPU and moved to
        ``like``'s device once, when a layer's Q is created or grows (not each step), so
        CPU and GPU ranks start from the same Q; the steps never leave the device."""
        dtype = compute_dtype(like.dtype)
        q = self._q.get(name)
        if q is not None and q.shape[0] != cols:
            raise ValueError(f"PowerSGD state of {name!r} has {q.shape[0]} rows, the layer's "
                             f"matrix has {cols} columns; parameter shapes must not change")
        if q is not None and (q.device != like.device or q.dtype != dtype):
            q = q.to(device=like.device, dtype=dtype)      # e.g. loaded with map_location="cpu"
            self._q[name] = q
        have = 0 if q is None else q.shape[1]
        if have < rank:
            new = torch.empty(cols, rank - have, dtype=torch.float32)
            for j in range(have, rank):
                g = torch.Generator().manual_seed(self._column_seed(name, j))
                new[:, j - have] = torch.randn(cols, generator=g)
            new = new.to(device=like.device, dtype=dtype)
            q = new if q is None else torch.cat([q, new], dim=1)
            self._q[name] = q
        return q[:, :rank]

    def adopt(self, name: str, q: torch.Tensor) -> None:
        """Next step's warm start: the first ``q.shape[1]`` columns of ``name``'s Q become
        ``q`` (the averaged Q that was sent; columns not sent keep their previous values,
        which every rank shares)."""
        state = self._q.get(name)
        if state is None or state.shape[0] != q.shape[0] or state.shape[1] < q.shape[1]:
            raise ValueError(f"adopt({name!r}) needs warm_start({name!r}) with at least "
                             f"{q.shape[1]} columns first")
        state[:, :q.shape[1]].copy_(q)

    def reset(self) -> None:
        """Forget every Q (the next step draws them again)."""
        self._q.clear()

    # -- not a sparsifier -------------------------------------------------------------------
    def select(self, x: torch.Tensor, k: int, ctx: SelectContext | None = None) -> torch.Tensor:
        raise TypeError("powersgd is a low-rank compressor: it has no select(); the step "
                        "engine runs it through gravac/engine/exchanges/lowrank.py")

    def _select(self, x, k, ctx):  # pragma: no cover - select() above never calls it
        raise TypeError("powersgd has no select()")

    def count_bounds(self, k: int, n: int) -> tuple[int, int]:
        raise TypeError("powersgd is a low-rank compressor: it sends factors, not k values")

    # -- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Every layer's Q (the warm start), to resume exactly."""
        return {"seed": self.seed, "q": {name: q.detach().clone() for name, q in self._q.items()}}

    def load_state_dict(self, state: dict) -> None:
        if not state:
            self._q.clear()            # a checkpoint without PowerSGD state: start afresh
            return
        if not isinstance(state, dict) or not isinstance(state.get("q"), dict):
            raise ValueError("not a PowerSGD state dict: expected a dict with key 'q'")
        if state.get("seed", self.seed) != self.seed:
            raise ValueError(f"PowerSGD state was saved with seed {state['seed']}, this "
                             f"compressor has seed {self.seed}")
        self._q = {name: q.detach().clone() for name, q in state["q"].items()}

    def describe(self) -> dict:
        return {"name": self.name, "seed": self.seed, "min_cf": self.min_cf}

    def __repr__(self) -> str:
        return f"PowerSGD(seed={self.seed}, min_cf={self.min_cf:g})"
