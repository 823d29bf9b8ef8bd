"""Top-k's Triton candidate kernels (gravac/compressors/triton_candidates.py), run in
Triton's interpreter on CPU tensors (conftest.py sets ``TRITON_INTERPRET=1``): the same kernels, element for element, that a GPU
compiles. Each result is checked against an independent reference (``|x| >= t`` or NaN,
then ``nonzero``), and Top-k through them against ``torch.topk``'s magnitudes. Timing
and the compiled kernels are for a GPU (tests/unit/test_cuda_compressors.py,
benchmarks/compressors.py --device cuda).
"""
from __future__ import annotations

import pytest
import torch

from gravac import compressors
from gravac.compressors import base, triton_candidates
from gravac.compressors.triton_candidates import BLOCK, candidates_at_or_above

pytestmark = pytest.mark.skipif(
    not triton_candidates.available(),
    reason="needs Triton (hvd_scripts/install.sh installs it on Linux x86_64/aarch64) "
           "to run the GPU kernels in its CPU interpreter")

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def _reference(x: torch.Tensor, t: torch.Tensor):
    wide = x.to(triton_candidates.threshold_dtype(x.dtype))
    t = t.to(wide.dtype)
    idx = ((wide.abs() >= t) | wide.isnan()).nonzero().view(-1)
    return idx, wide.abs()[idx]


def _check(x, t):
    idx, mags = candidates_at_or_above(x, t)
    ref_idx, ref_mags = _reference(x, t)
    assert idx.dtype == torch.int64 and mags.dtype == ref_mags.dtype
    assert torch.equal(idx, ref_idx)
    assert torch.equal(mags.isnan(), ref_mags.isnan())
    assert torch.equal(mags.nan_to_num(), ref_mags.nan_to_num())
    return idx


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 17])
def test_matches_the_reference_at_block_edges(dtype, n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g).to(dtype)
    for q in (0.0, 0.5, 0.9, 0.999):
        t = x.abs().float().quantile(q) if n > 1 else x.abs().float()[0]
        _check(x, t.reshape(()))


@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_inf_signed_zero_and_subnormals(dtype):
    """NaN always passes (a NaN magnitude is the largest to torch.topk); ±inf pass; -0.0
    and +0.0 are equal and below any positive threshold; subnormals compare as values."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2 * BLOCK + 5, generator=g).to(dtype)
    tiny = torch.finfo(dtype).tiny
    x[[0, BLOCK - 1, BLOCK, 2 * BLOCK + 4]] = torch.tensor(
        [float("nan"), float("inf"), float("-inf"), -0.0]).to(dtype)
    x[7], x[8] = 0.0, tiny / 4
    idx = _check(x, torch.tensor(1.5))
    assert {0, BLOCK - 1, BLOCK} <= set(idx.tolist()) and 2 * BLOCK + 4 not in idx.tolist()
    small = _check(x, torch.tensor(tiny, dtype=torch.float64).to(
        triton_candidates.threshold_dtype(dtype)))
    assert 8 not in small.tolist() and 7 not in small.tolist()
    # A NaN threshold passes only the NaN entries.
    assert _check(x, torch.tensor(float("nan"))).tolist() == [0]


def test_none_and_all_passing():
    x = torch.randn(5 * BLOCK + 3, generator=torch.Generator().manual_seed(2))
    idx, mags = candidates_at_or_above(x, torch.tensor(1e9))
    assert idx.numel() == 0 and mags.numel() == 0
    idx = _check(x, torch.tensor(0.0))
    assert torch.equal(idx, torch.arange(x.numel()))


def test_bad_input_is_refused(monkeypatch):
    with pytest.raises(ValueError, match="1-D float"):
        candidates_at_or_above(torch.randn(4, 4), torch.tensor(1.0))
    with pytest.raises(ValueError, match="1-D float"):
        candidates_at_or_above(torch.arange(10), torch.tensor(1.0))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        candidates_at_or_above(torch.randn(10), torch.tensor(1.0))


@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_through_the_kernels_is_exact(monkeypatch, dtype):
    """TopK(device_candidates="triton") on its accelerator path (forced onto CPU tensors):
    the magnitudes of torch.topk, and the very indices of the torch path where every
    magnitude is distinct."""
    monkeypatch.setattr(base, "device_path", lambda t: True)
    triton_topk = compressors.get("topk", device_candidates="triton", device_direct_below=4096)
    torch_topk = compressors.get("topk", device_direct_below=4096)
    g = torch.Generator().manual_seed(3)
    wide = torch.randn(60_000, generator=g, dtype=torch.float64) * torch.exp(
        3 * torch.randn(60_000, generator=g, dtype=torch.float64))
    x = wide.to(dtype)
    for cf in (10, 100, 1000):
        k = x.numel() // cf
        idx = triton_topk.select(x, k)
        assert idx.numel() == k and idx.unique().numel() == k
        mags = x.abs().float() if dtype != torch.float64 else x.abs()
        assert torch.equal(mags[idx].sort(descending=True).values, torch.topk(mags, k).values)
        if mags.unique().numel() == mags.numel():
            assert torch.equal(idx.sort().values, torch_topk.select(x, k).sort().values)


def test_topk_falls_back_when_the_sample_falls_short(monkeypatch):
    """Fewer candidates than k (here: a sample rank of 1, so the threshold is the sample's
    largest magnitude): the full top-k, still exact."""
    from gravac.compressors import topk as topk_module
    monkeypatch.setattr(base, "device_path", lambda t: True)
    monkeypatch.setattr(topk_module, "sample_rank", lambda n, k, s: 1)
    comp = compressors.get("topk", device_candidates="triton", device_direct_below=4096)
    x = torch.randn(50_000, generator=torch.Generator().manual_seed(4))
    k = 5_000
    idx = comp.select(x, k)
    assert torch.equal(x.abs()[idx].sort(descending=True).values, torch.topk(x.abs(), k).values)


def test_the_option_is_checked(monkeypatch):
    with pytest.raises(ValueError, match="device_candidates must be one of"):
        compressors.get("topk", device_candidates="cuda")
    monkeypatch.setattr(triton_candidates, "available", lambda: False)
    with pytest.raises(ValueError, match="needs Triton"):
        compressors.get("topk", device_candidates="triton")


def test_the_cuda_benchmark_runs_the_kernels_dry(monkeypatch, capsys):
    """benchmarks/compressors.py --device cuda minus the GPU, with Triton: the topk[triton]
    rows and the two Triton phases are measured and printed (host clock, interpreter)."""
    from bench_module import load_benchmark
    bench = load_benchmark("compressors", "bench_compressors_triton")
    from timing import host_times
    monkeypatch.setattr(base, "device_path", lambda t: True)
    monkeypatch.setattr(bench, "CUDA_TARGETS", {(bench.TRITON_TOPK, 100_000, 100): 3.0})
    rows, phases = bench.run_cuda([100_000], [100], ["topk", bench.TRITON_TOPK], 2,
                                  device=torch.device("cpu"), timer=host_times)
    assert not [r for r in rows + phases if "error" in r]
    assert [p["phase"] for p in phases] == bench.PHASES
    header = {"device": "cpu (dry run)", "torch": torch.__version__, "cuda": None,
              "multiprocessors": 0, "l2_mb": None, "repeats": 2}
    bench.print_cuda(header, rows, phases)
    out = capsys.readouterr().out
    assert "| Triton candidates | top-k of them |" in out
    assert "| topk[triton] | 100,000 | 100 |" in out and "TARGET topk[triton] n=100,000" in out
