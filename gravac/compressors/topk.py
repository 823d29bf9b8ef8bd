"""Exact Top-k: the k entries of largest magnitude.

``torch.topk`` over millions of entries is slow on CPU (a partial sort of the whole
tensor). Instead we estimate a magnitude threshold from a small random sample that keeps
slightly more than k candidates, then run the exact top-k over the candidates only. The
result is still exact: every entry outside the candidates is smaller than the threshold,
and the threshold is at most the k-th largest magnitude whenever at least k candidates
pass it. When fewer than k pass (an unlucky sample, heavy ties), we fall back to a full topk.
When the sampled threshold is 0 (mostly zeros, as in an embedding's gradient), the
candidates are the nonzero entries (``Compressor._topk_of_all``). Candidates that
cluster in a few blocks of the tensor (an embedding's rows) are found without comparing
every entry (``blockscan.py``).

On a GPU (``base.device_path``) the same plan runs with device-sized pieces: the sample is
drawn on the device and kept small (``DEVICE_MAX_SAMPLE``: a one-block top-k, where a
larger sample buys a few percent fewer candidates and costs more launches), and the
candidates come from one elementwise pass and ``nonzero``, without block screening,
NumPy or |x| written out. Two host syncs: the threshold (so that the pass takes it as a
host scalar: a 0-d device tensor would be broadcast by torch's slower strided kernel)
and the candidate count. The candidate test there is ``trunc(x / t) != 0`` written as
2-byte floats: it reads x once and writes 2 bytes an entry (|x| >= t as abs then compare
writes 4 + 1). Exactness does not depend on which test is used, only on its shape: a
test that passes every entry whose magnitude is at least that of some passing entry
(upward closed in |x|) picks the top-m entries for some m, so when m >= k the exact
top-k is among them. ``trunc(fl(|x| · fl(1/t))) >= 1`` (torch divides by a host scalar
as a product with its reciprocal) is upward closed because a correctly rounded product
with a positive constant is monotone and symmetric in x (NaN passes, as a NaN magnitude
is largest to ``torch.topk``).
"""
from __future__ import annotations

import math
import warnings

import torch

from .base import (Compressor, SelectContext, exact_topk, kth_largest, mix_seed,
                   sample_generator, sample_magnitudes)
from .blockscan import passing_indices, scan_all
from . import triton_candidates
from .segmented import sample_rank, segmented_topk

#: Calls a layer whose candidates filled most blocks is scanned without block screening.
BLOCK_RETRY = 32
#: Largest threshold sample on the accelerator path (``min_sample`` still a floor). Below
#: 20,000 entries CUDA's top-k of the sample is one single-block kernel (above: a dozen
#: multi-block launches). The candidate margin (``_sample_rank``) adapts to the sample:
#: about 1.32k candidates at CF 100 instead of 1.04k with a 1% sample of 100M, which
#: costs ~2 MB more nonzero output and a top-k over 1.3M candidates instead of 1.04M,
#: launch-bound either way.
DEVICE_MAX_SAMPLE = 16_384
#: On a GPU, layers up to this many entries take ``torch.topk`` of |x| directly: two
#: launches and no host sync, where the sampled path costs ~10 launches and two syncs
#: (~0.3 ms a layer, whatever its size). Measured on an H200 (docs/notes/2026-11-benchmarks.md §7):
#: torch.topk 0.26 ms against the sampled path's 0.34 at 10M entries, 0.71 against 0.48
#: at 30M; and ResNet-101's 161 compressed layers spent 33 ms a step selecting on the
#: sampled path.
DEVICE_DIRECT_BELOW = 1 << 24
#: On a GPU, ``select_many`` batches the layers of up to this many entries
#: (``segmented_topk``); larger ones take one ``torch.topk`` each. The batch pays for a
#: sort of all its candidates (~1.3 k per layer, int64 keys): on an H200 (docs/notes/2026-11-benchmarks.md
#: §7) ResNet-101's 161 layers selected in 8.9 ms batched against 21.4 one by one, but the
#: LSTM's five layers of 9-15M entries in 11.3 ms batched against 1.75 one by one.
DEVICE_BATCH_MAX = 1 << 20
#: ... and only groups of at least this many layers: the batch costs ~1.5-2 ms whatever
#: its size (two host syncs, ~25 launches), a small layer's torch.topk ~0.1 ms. On an H200
#: the LSTM's 5 bias vectors took 1.4 ms longer batched; ResNet-101's ~155 small layers
#: 12 ms shorter.
DEVICE_BATCH_MIN_LAYERS = 24
#: How the accelerator path finds a large layer's candidates (``device_candidates``).
#: "auto" (the default): Triton's kernels on a CUDA GPU where Triton is installed, else
#: torch's pass. On an H200 (docs/notes/2026-11-benchmarks.md §7b) the whole selection took 0.357 ms
#: against 0.418 at 30M entries and 0.640 against 0.771 at 100M (CF 100; 12-20% less at
#: CF 10 and 1000 too); below ``DEVICE_DIRECT_BELOW`` neither runs (torch.topk is faster).
DEVICE_CANDIDATES = ("auto", "torch", "triton")


class TopK(Compressor):
    """Exact Top-k by magnitude.

    Args:
        sample_fraction: fraction of entries sampled to estimate the threshold (on a
            GPU at most ``DEVICE_MAX_SAMPLE`` entries).
        min_sample: the sample never has fewer entries than this (capped at n).
        direct_below: tensors with at most this many entries use ``torch.topk`` directly.
        device_direct_below: the same on a GPU (``DEVICE_DIRECT_BELOW``).
        batch_layers: on a GPU, ``select_many`` selects every layer of up to
            ``DEVICE_BATCH_MAX`` entries in the same few kernels
            (``segmented.segmented_topk``) instead of a ``torch.topk`` each; the same
            indices up to ties. False: one call per layer.
        seed: seed of the private generator used for sampling (results do not depend
            on it: only the speed does).
        device_candidates: how a GPU finds the candidates of a layer above
            ``device_direct_below``: ``"torch"`` (a pass of torch's and ``nonzero``; two
            host syncs), ``"triton"`` (``triton_candidates``: two fused passes of one
            kernel that also return the magnitudes; one host sync) or ``"auto"``: Triton
            on a CUDA GPU where it is installed, torch's pass if its kernels fail to
            build there (one warning). The same selection either way.

    Example::

        idx = TopK().select(torch.tensor([0.1, -3.0, 2.0, 0.5]), 2)   # {1, 2}
    """

    name = "topk"

    def __init__(self, sample_fraction: float = 0.01, min_sample: int = 10_000,
                 direct_below: int = 65_536, seed: int = 0,
                 device_direct_below: int | None = None, batch_layers: bool = True,
                 device_candidates: str = "auto"):
        if not 0 < sample_fraction <= 1:
            raise ValueError(f"topk: sample_fraction must be in (0, 1], got {sample_fraction}")
        if device_candidates not in DEVICE_CANDIDATES:
            raise ValueError(f"topk: device_candidates must be one of {DEVICE_CANDIDATES}, "
                             f"got {device_candidates!r}")
        if device_candidates == "triton" and not triton_candidates.available():
            raise ValueError("topk: device_candidates='triton' needs Triton, which is not "
                             "installed (a CUDA build of torch brings it; or pip install triton)")
        self.device_candidates = device_candidates
        # "auto": decided per tensor (a CUDA one), and given up once if Triton fails there
        self._auto_triton = device_candidates == "auto" and triton_candidates.available()
        self.sample_fraction = sample_fraction
        self.min_sample = int(min_sample)
        self.direct_below = int(direct_below)
        self.device_direct_below = int(DEVICE_DIRECT_BELOW if device_direct_below is None
                                       else device_direct_below)
        self.batch_layers = bool(batch_layers)
        self._seed = int(seed)

    def _select(self, x: torch.Tensor, k: int, ctx: SelectContext) -> torch.Tensor:
        n = x.numel()
        on_device = self._on_device(x)
        if n <= (self.device_direct_below if on_device else self.direct_below):
            return exact_topk(self._magnitudes(x), k)
        # k so large that candidates would not be much fewer than n.
        if 8 * k >= n:
            return self._topk_of_all(x, k)
        if on_device:
            return self._select_on_device(x, k, ctx)
        s = min(n, max(self.min_sample, math.ceil(n * self.sample_fraction)))
        # The sample's magnitudes only: |x| of the whole tensor is needed only when the
        # threshold is above zero.
        sample = sample_magnitudes(x, s, sample_generator(self._seed, ctx)).abs()
        threshold = kth_largest(sample, self._sample_rank(n, k, s))
        if not threshold > 0:
            # Mostly zeros (an embedding's gradient): every entry would be a candidate.
            return self._topk_of_all(x, k)
        candidates = self._candidates(x, threshold, (ctx.layer, ctx.level, n))
        if candidates.numel() < k:
            return self._topk_of_all(x, k)
        if candidates.numel() == k:
            return candidates
        # index_select, not candidates[...]: advanced indexing costs ~10x more on CPU.
        return candidates.index_select(
            0, exact_topk(x.index_select(0, candidates).abs(), k))

    def select_many(self, xs: list[torch.Tensor], ks: list[int],
                    ctxs: list[SelectContext] | None = None) -> list[torch.Tensor]:
        """``select`` of each tensor with its own k. On a GPU (``batch_layers``) the
        tensors of one device and dtype with at most ``DEVICE_BATCH_MAX`` entries
        (and 1 <= k < n), when there are at least ``DEVICE_BATCH_MIN_LAYERS`` of them,
        are selected together by ``segmented_topk``: two host syncs and
        ~25 launches for the whole group instead of ~3 launches per layer (ResNet-101:
        161 layers). Exact either way; a group whose sample fell short, and every other
        tensor, is selected one call each."""
        ctxs = ctxs or [SelectContext()] * len(xs)
        out: list[torch.Tensor | None] = [None] * len(xs)
        if self.batch_layers:
            groups: dict[tuple, list[int]] = {}
            for i, (x, k) in enumerate(zip(xs, ks)):
                if x.dim() == 1 and self._on_device(x) and 1 <= int(k) < x.numel() \
                        <= min(self.device_direct_below, DEVICE_BATCH_MAX) \
                        and x.dtype in (torch.float32, torch.float16, torch.bfloat16):
                    groups.setdefault((x.device, x.dtype), []).append(i)
            for members in groups.values():
                if len(members) < DEVICE_BATCH_MIN_LAYERS:
                    continue
                c = ctxs[members[0]]
                picked = segmented_topk([xs[i] for i in members], [int(ks[i]) for i in members],
                                        seed=mix_seed(self._seed, c.rank, c.level),
                                        step=c.step)
                if picked is not None:
                    for i, idx in zip(members, picked):
                        out[i] = idx
        return [idx if idx is not None else self.select(x, k, c)
                for idx, x, k, c in zip(out, xs, ks, ctxs)]

    @staticmethod
    def _sample_rank(n: int, k: int, s: int) -> int:
        """The rank in a sample of s entries (of n) taken as the threshold
        (``segmented.sample_rank``: shared with the batched selection)."""
        return sample_rank(n, k, s)

    # -- the accelerator path ---------------------------------------------------------
    def _select_on_device(self, x: torch.Tensor, k: int, ctx: SelectContext) -> torch.Tensor:
        """Sampled threshold -> candidates (one pass + nonzero) -> top-k among them.
        Two host syncs (the threshold, the candidate count) unless the fallback runs;
        with ``device_candidates="triton"`` one (the count), and the candidates'
        magnitudes come with them instead of a gather from x."""
        threshold = self._device_threshold(x, k, ctx)
        found = None
        if self.device_candidates == "triton":
            found = triton_candidates.candidates_at_or_above(x, threshold)
        elif self._auto_triton and x.device.type == "cuda":
            found = self._auto_candidates(x, threshold)
        if found is not None:
            candidates, magnitudes = found
        else:
            candidates, magnitudes = self._device_candidates(x, threshold.item()), None
        if candidates.numel() < k:
            # An unlucky sample, heavy ties, or a zero threshold (mostly zeros: the
            # threshold was raised to the smallest normal number, so the candidates were
            # the nonzeros, fewer than k). Exact either way.
            return self._topk_of_all(x, k)
        return self._top_of_candidates(x, candidates, k, magnitudes)

    def _device_sample_size(self, n: int) -> int:
        return min(n, max(self.min_sample,
                          min(math.ceil(n * self.sample_fraction), DEVICE_MAX_SAMPLE)))

    def _device_threshold(self, x: torch.Tensor, k: int, ctx: SelectContext) -> torch.Tensor:
        """The candidate threshold as a 0-d tensor on x's device, a value of x's dtype
        (held as float32 for fp16/bf16), with no host sync. A zero sample threshold
        (mostly zeros) becomes the dtype's smallest normal number, so that the candidates
        are the nonzero entries: any positive threshold keeps the selection exact (see
        the module docstring). NaN stays NaN (every entry passes: slow, still exact)."""
        n = x.numel()
        s = self._device_sample_size(n)
        sample = sample_magnitudes(x, s, sample_generator(self._seed, ctx, x.device)).abs()
        threshold = kth_largest(sample, self._sample_rank(n, k, s))
        # clamp_min keeps NaN, as max(NaN, tiny) did on the host.
        return threshold.clamp_min(torch.finfo(x.dtype).tiny)

    def _auto_candidates(self, x: torch.Tensor, threshold: torch.Tensor):
        """Triton's candidates for ``device_candidates="auto"``, or None (torch's pass)
        from the first time its kernels fail to build or run here: a missing C compiler or
        an unsupported GPU costs speed, not the run. Which pass runs changes nothing else:
        the selection is the same, so ranks may differ in it."""
        try:
            return triton_candidates.candidates_at_or_above(x, threshold)
        except Exception as exc:  # noqa: BLE001 (any build or launch error of Triton's)
            self._auto_triton = False
            warnings.warn(f"topk: Triton's candidate kernels failed on {x.device} "
                          f"({type(exc).__name__}: {exc}); Top-k takes torch's pass from "
                          "now on (device_candidates='torch' silences this)", RuntimeWarning,
                          stacklevel=2)
            return None

    @staticmethod
    def _device_candidates(x: torch.Tensor, threshold: float) -> torch.Tensor:
        """Ascending indices of the entries with trunc(x / threshold) != 0, i.e. |x| at or
        above ~threshold (exactly: an upward-closed set in |x|, see the module docstring),
        and NaN. One contiguous elementwise pass that reads x and writes 2 bytes an entry
        (the threshold a host scalar), then ``nonzero`` (which reads those twice and syncs
        once for the count)."""
        half = x.dtype if x.dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
        quotient = torch.empty(x.numel(), dtype=half, device=x.device)
        torch.div(x, threshold, rounding_mode="trunc", out=quotient)
        return quotient.nonzero().view(-1)

    @staticmethod
    def _top_of_candidates(x: torch.Tensor, candidates: torch.Tensor, k: int,
                           magnitudes: torch.Tensor | None = None) -> torch.Tensor:
        """The exact top-k of x, given candidates that hold it (at least k of them) and,
        if known, their magnitudes (else gathered from x)."""
        if candidates.numel() == k:
            return candidates
        if magnitudes is None:
            magnitudes = x.index_select(0, candidates).abs_()
        return candidates.index_select(0, exact_topk(magnitudes, k))

    # -- the CPU path -------------------------------------------------------------------
    def _candidates(self, x: torch.Tensor, threshold, site: tuple) -> torch.Tensor:
        """Ascending indices of |x| >= threshold. Block by block (``blockscan``) where the
        candidates cluster (an embedding's rows); a layer whose candidates were spread
        over most blocks last time (a dense layer) is scanned entry by entry for the next
        ``BLOCK_RETRY`` calls without screening blocks first. Either way the same indices."""
        skips = self.__dict__.setdefault("_skip_block_scan", {})
        if skips.get(site, 0) > 0:
            skips[site] -= 1
        else:
            found = passing_indices(x, threshold)
            if found is not None:
                return found
            skips[site] = BLOCK_RETRY
        n = x.numel()
        return scan_all(x, threshold, self._scratch("magnitudes", n, x.dtype, x.device),
                        self._scratch("mask", n, torch.bool, x.device))
