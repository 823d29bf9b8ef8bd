"""The compressors on a GPU: the accelerator paths against the CPU paths.

Two parts. The first runs everywhere: the accelerator paths are plain torch, so with
``base.device_path`` forced on they run on CPU tensors, where they must give what the CPU
paths give (DGC, RedSync and Random-k the very same indices for the same sample; Top-k the
same magnitudes), and the CUDA benchmark's own code runs dry. The second needs a CUDA GPU
(skipped otherwise): every compressor on fresh random CUDA tensors against the CPU
results and the invariants of test_compressors.py, the host syncs per call, and PowerSGD's
factors on the device. Fast: a few seconds on a GPU.
"""
from __future__ import annotations

import warnings

import pytest
import torch

from gravac import compressors
from gravac.compressors import SelectContext, base, num_kept, triton_candidates
from gravac.compressors.blockscan import at_least, count_true, passing_indices, scan_all, true_indices
from gravac.compressors.powersgd import PowerSGD, orthogonalize_
from gravac.compressors.topk import TopK

from bench_module import load_benchmark
from cuda_sync import is_sync_warning

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(
    not CUDA, reason="needs a CUDA GPU: the compressors' accelerator paths on real device "
                     "tensors (their CPU-runnable logic is tested above in this file)")
SPARSE = ["topk", "dgc", "redsync", "randomk"]


def _embedding_gradient(rows_touched, n_rows=20_000, dim=128, seed=0):
    """An embedding's error-fed gradient: a few rows nonzero, every other entry zero."""
    g = torch.Generator().manual_seed(seed)
    x = torch.zeros(n_rows, dim)
    x[torch.randperm(n_rows, generator=g)[:rows_touched]] = torch.randn(rows_touched, dim,
                                                                          generator=g)
    return x.view(-1)


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "small": torch.randn(5_000, generator=g),                       # < direct_below
        "dense": torch.randn(300_000, generator=g),
        "laplace": torch.empty(300_000).exponential_(generator=g)
        * torch.sign(torch.randn(300_000, generator=g)),
        "heavy": torch.randn(200_000, generator=g) ** 5,
        "ties": torch.randint(-3, 4, (200_000,), generator=g).float(),
        "fp16": torch.randn(200_000, generator=g).half(),
        "bf16": torch.randn(200_000, generator=g).bfloat16(),
        "fp64": torch.randn(100_000, generator=g).double(),
        "embedding": _embedding_gradient(100, n_rows=2_000),
        "embedding residual": _embedding_gradient(300, n_rows=2_000, seed=1) * 0.01
        + _embedding_gradient(20, n_rows=2_000, seed=2),
        "zeros": torch.zeros(100_000),
    }


def _check(idx, n, comp, k, device):
    assert idx.device.type == device and idx.dtype == torch.int64 and idx.dim() == 1
    assert idx.unique().numel() == idx.numel(), "indices must be distinct"
    if idx.numel():
        assert int(idx.min()) >= 0 and int(idx.max()) < n
    low, high = comp.count_bounds(k, n)
    assert low <= idx.numel() <= high, (idx.numel(), (low, high))


# -- everywhere: the accelerator paths' logic on CPU tensors ---------------------------------

def test_device_path_is_taken_off_the_cpu_only():
    assert base.device_path(torch.zeros(3)) is False
    assert base.device_path(torch.zeros(3, device="meta")) is True
    assert compressors.get("topk")._on_device(torch.zeros(3)) is False


def test_cpu_sampling_draws_what_it_drew_before():
    """The CPU sample is unchanged: a CPU generator seeded as before, indices drawn on the
    CPU (the old code: randint on the CPU, then index_select)."""
    x = torch.randn(50_000, generator=torch.Generator().manual_seed(3))
    ctx = SelectContext(step=7, layer=2, rank=1, level=1)
    g = base.sample_generator(5, ctx)
    assert g.device.type == "cpu"
    got = base.sample_magnitudes(x, 1000, g)
    old = torch.Generator().manual_seed(base.mix_seed(5, 7, 2, 1, 1))
    want = x.index_select(0, torch.randint(0, x.numel(), (1000,), generator=old, device="cpu"))
    assert torch.equal(got, want)
    g_cpu = base.sample_generator(5, ctx, torch.device("cpu"))
    assert torch.equal(base.sample_magnitudes(x, 1000, g_cpu), want)


@pytest.mark.parametrize("name", SPARSE)
def test_forced_device_path_gives_the_cpu_paths_result(name, monkeypatch):
    """On CPU tensors the accelerator paths draw the same samples as the CPU paths: DGC,
    RedSync (its search from two order statistics instead of counts) and Random-k must
    return the very same indices; Top-k (another sample, another candidate test) the same
    magnitudes, i.e. the exact top-k."""
    inputs = _inputs()
    expected = {}
    for key, x in inputs.items():
        for cf in (1.5, 4, 10, 100, 1000):
            k = num_kept(x.numel(), cf)
            expected[key, cf] = compressors.get(name).select(x, k, SelectContext(step=3, layer=1))
    monkeypatch.setattr(base, "device_path", lambda t: True)
    # Top-k: the sampled accelerator path (its default takes torch.topk below 16M entries)
    options = {"device_direct_below": 65_536} if name == "topk" else {}
    for key, x in inputs.items():
        for cf in (1.5, 4, 10, 100, 1000):
            k = num_kept(x.numel(), cf)
            comp = compressors.get(name, **options)
            idx = comp.select(x, k, SelectContext(step=3, layer=1))
            _check(idx, x.numel(), comp, k, "cpu")
            if name != "topk":
                assert torch.equal(idx, expected[key, cf]), (key, cf)
                continue
            mags = x.abs().float()
            top = torch.topk(mags, k).values
            assert torch.equal(mags[idx].sort(descending=True).values, top), (key, cf)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_device_candidates_are_upward_closed_in_magnitude(dtype):
    """The accelerator path's candidate test, trunc(x / t) != 0 in 2-byte floats, must pass
    every entry at least as large as a passing one (what makes the top-k among the
    candidates exact), and pass about the entries with |x| >= t."""
    g = torch.Generator().manual_seed(9)
    x = (torch.randn(200_000, generator=g, dtype=torch.float64)
         * torch.exp(4 * torch.randn(200_000, generator=g, dtype=torch.float64))).to(dtype)
    x[:100] = 0.0
    mags = x.abs().double()
    ranked = mags.sort().values                 # fp16 overflows to inf at the top: fine
    for q in (0.5, 0.9, 0.99, 0.999):
        t = float(ranked[int(q * x.numel())].to(dtype))        # a value of x's dtype
        cand = TopK._device_candidates(x, t)
        passed = torch.zeros(x.numel(), dtype=torch.bool)
        passed[cand] = True
        assert torch.equal(cand, passed.nonzero().view(-1)), "ascending and distinct"
        assert float(mags[passed].min()) >= float(mags[~passed].max())
        plain = int((x.abs() >= t).sum())
        assert abs(cand.numel() - plain) <= 0.001 * x.numel() + 2


def test_topk_device_zero_fill_and_fallback(monkeypatch):
    """Mostly zeros: the device threshold is raised to the smallest normal number (the
    candidates are the nonzeros); with fewer nonzeros than k, zeros fill the rest (the
    sync-free fill of _topk_of_all)."""
    monkeypatch.setattr(base, "device_path", lambda t: True)
    x = _embedding_gradient(30, n_rows=5_000)                 # 3840 nonzeros of 640k
    nnz = int(torch.count_nonzero(x))
    comp = compressors.get("topk")
    for k in (100, nnz, nnz + 1, 20_000, 79_000):
        idx = comp.select(x, k)
        _check(idx, x.numel(), comp, k, "cpu")
        assert int(torch.count_nonzero(x[idx])) == min(k, nnz)
        mags = x.abs()
        assert torch.equal(mags[idx].sort(descending=True).values, torch.topk(mags, k).values)


def test_the_cuda_benchmark_runs_dry_on_cpu(monkeypatch, capsys):
    """benchmarks/compressors.py --device cuda, minus the GPU: its rows, its Top-k phases
    and its table, with a host timer on CPU tensors."""
    bench = load_benchmark("compressors")
    monkeypatch.setattr(base, "device_path", lambda t: True)
    monkeypatch.setattr(bench, "CUDA_TARGETS", {("topk", 100_000, 100): 3.0})
    from timing import host_times

    rows, phases = bench.run_cuda([100_000], [10, 100], SPARSE + [bench.TORCH_TOPK], 2,
                                  device=torch.device("cpu"), timer=host_times)
    assert len(rows) == 10 and not [r for r in rows if "error" in r]
    assert all(r["median_ms"] > 0 and r["per_pass"] > 0 for r in rows)
    # (the Triton phases come after these where the kernels can run: tests/triton)
    assert [p["phase"] for p in phases][:5] == bench.PHASES[:5]
    assert len(phases) in (5, 7) and not [p for p in phases if "error" in p]
    header = {"device": "cpu (dry run)", "torch": torch.__version__, "cuda": None,
              "multiprocessors": 0, "l2_mb": None, "repeats": 2}
    bench.print_cuda(header, rows, phases)
    out = capsys.readouterr().out
    assert "| topk | 100,000 | 100 |" in out and "TARGET topk n=100,000 CF 100" in out
    assert ("met" in out.split("TARGET")[-1]) or ("MISSED" in out.split("TARGET")[-1])


# -- on a CUDA GPU ------------------------------------------------------------------------------

def _cuda_inputs():
    g = torch.Generator().manual_seed(21)
    return {
        "small": torch.randn(5_000, generator=g),                        # < direct_below
        "1M": torch.randn(1_000_000, generator=g),
        "embedding": _embedding_gradient(100),                          # 2.56M, mostly zeros
    }


@needs_cuda
@pytest.mark.parametrize("direct_below", [None, 65_536])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cuda_topk_keeps_the_cpu_topk_magnitudes(dtype, direct_below):
    """Both GPU paths: torch.topk (the default below 16M entries) and the sampled one."""
    comp_gpu = compressors.get("topk", device_direct_below=direct_below)
    comp_cpu = compressors.get("topk")
    for key, x in _cuda_inputs().items():
        x = x.to(dtype)
        xc = x.cuda()
        for cf in (1.5, 10, 100, 1000):
            k = num_kept(x.numel(), cf)
            idx = comp_gpu.select(xc, k, SelectContext(step=1, layer=2))
            _check(idx, x.numel(), comp_gpu, k, "cuda")
            mags = x.abs().float()
            want = mags[comp_cpu.select(x, k, SelectContext(step=1, layer=2))]
            got = mags[idx.cpu()]
            assert torch.equal(got.sort().values, want.sort().values), (key, dtype, cf)


@needs_cuda
def test_cuda_topk_float64_and_multilevel():
    comp = compressors.get("topk", device_direct_below=65_536)
    x = torch.randn(1_000_000, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    xc = x.cuda()
    k = num_kept(x.numel(), 100)
    idx = comp.select(xc, k)
    _check(idx, x.numel(), comp, k, "cuda")
    assert torch.equal(x.abs()[idx.cpu()].sort().values, torch.topk(x.abs(), k).values.sort().values)
    # Second level over the kept values = direct Top-k at the candidate CF.
    x32 = xc.float()
    first = comp.select(x32, num_kept(x.numel(), 10))
    sub = comp.select(x32.index_select(0, first), num_kept(x.numel(), 1000))
    direct = comp.select(x32, num_kept(x.numel(), 1000))
    mags = x32.abs()
    assert torch.equal(mags[first.index_select(0, sub)].sort().values, mags[direct].sort().values)


@needs_cuda
@pytest.mark.parametrize("name", ["dgc", "redsync"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cuda_threshold_methods_keep_their_promises(name, dtype):
    """Count bounds, distinct in-range int64 indices on the GPU, never an entry dropped that
    is larger than one kept, and every nonzero kept when they fit in k."""
    comp = compressors.get(name)
    for key, x in _cuda_inputs().items():
        x = x.to(dtype)
        xc = x.cuda()
        n, nnz = x.numel(), int(torch.count_nonzero(x))
        for cf in (1.5, 10, 100, 1000):
            k = num_kept(n, cf)
            idx = comp.select(xc, k, SelectContext(step=2, layer=5))
            _check(idx, n, comp, k, "cuda")
            mags = xc.abs().float()
            dropped = torch.ones(n, dtype=torch.bool, device="cuda")
            dropped[idx] = False
            if bool(dropped.any()):
                assert float(mags[idx].min()) >= float(mags[dropped].max()), (key, cf)
            if k >= nnz:
                assert int(torch.count_nonzero(xc[idx])) == nnz, (key, cf)


@needs_cuda
@pytest.mark.parametrize("n", [5_000, 1_000_000])
@pytest.mark.parametrize("cf", [1.5, 10, 1000])
def test_cuda_randomk_ranks_agree_and_draws_stay_on_the_gpu(n, cf):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)).cuda()
    k = num_kept(n, cf)
    shared = compressors.get("randomk", seed=3)
    torch.cuda.manual_seed(11)
    before = torch.cuda.get_rng_state()
    a = shared.select(x, k, SelectContext(step=4, layer=1, rank=0))
    assert torch.equal(torch.cuda.get_rng_state(), before), "Random-k touched the global RNG"
    b = shared.select(x, k, SelectContext(step=4, layer=1, rank=1))
    _check(a, n, shared, k, "cuda")
    assert a.numel() == k and torch.equal(a, b), "same_across_ranks: the same indices"
    assert torch.equal(a, a.sort().values)
    c = shared.select(x, k, SelectContext(step=5, layer=1, rank=0))
    if k < n:
        assert not torch.equal(a, c), "a new step draws new indices"
    per_rank = compressors.get("randomk", seed=3, same_across_ranks=False)
    d0 = per_rank.select(x, k, SelectContext(step=4, layer=1, rank=0))
    d1 = per_rank.select(x, k, SelectContext(step=4, layer=1, rank=1))
    _check(d0, n, per_rank, k, "cuda")
    if k < n:
        assert not torch.equal(d0, d1)
    assert torch.equal(d0, per_rank.select(x, k, SelectContext(step=4, layer=1, rank=0)))
    if n >= 1_000_000:   # roughly uniform: each tenth of the range holds ~k/10 (5 sd)
        share = torch.bincount(a * 10 // n, minlength=10).float() / k
        assert float((share - 0.1).abs().max()) < 5 * (0.09 / k) ** 0.5


@needs_cuda
def test_cuda_blockscan_helpers_run_on_the_device():
    x = torch.randn(100_001, generator=torch.Generator().manual_seed(2))
    x[::7] = 0.0
    xc = x.cuda()
    assert passing_indices(xc, 0) is None                  # no block screening on a GPU
    for t in (0, 0.5):
        assert torch.equal(scan_all(xc, t).cpu(), scan_all(x, t))
    mask = at_least(xc.abs(), 0.5, torch.empty(x.numel(), dtype=torch.bool, device="cuda"))
    assert count_true(mask) == int((x.abs() >= 0.5).sum())
    assert torch.equal(true_indices(mask).cpu(), (x.abs() >= 0.5).nonzero().view(-1))


def _syncs(fn):
    """How many synchronising CUDA calls ``fn()`` made (torch's sync debug mode)."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum(is_sync_warning(w) for w in caught)


@needs_cuda
def test_cuda_selections_sync_with_the_host_only_a_few_times():
    """Per call on a dense 1M-entry layer at CF 100: Top-k's sampled path waits for the
    device twice (its threshold, the count of nonzero), its default there (torch.topk)
    never, DGC once (twice if its count needs a retry), RedSync
    twice (mean, max and two order statistics, then the count), Random-k once or twice
    (unique); an index list drawn on the CPU and copied over would show up here too."""
    x = torch.randn(1_000_000, generator=torch.Generator().manual_seed(6)).cuda()
    k = num_kept(x.numel(), 100)
    limits = {"topk": 2, "dgc": 2, "redsync": 2, "randomk": 2, "topk_direct": 0}
    counts = {}
    for name in limits:
        comp = (compressors.get("topk", device_direct_below=65_536) if name == "topk" else
                compressors.get("topk") if name == "topk_direct" else compressors.get(name))
        comp.select(x, k, SelectContext(step=0))               # warm-up
        counts[name] = _syncs(lambda: comp.select(x, k, SelectContext(step=1)))
    assert all(counts[n] <= limits[n] for n in limits), counts


needs_triton = pytest.mark.skipif(
    not triton_candidates.available() or triton_candidates.interpreting(),
    reason="needs Triton compiling for the GPU (installed, TRITON_INTERPRET unset); its "
           "kernels' logic runs in the interpreter in tests/triton")


@needs_cuda
@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_cuda_triton_candidates_and_topk_through_them(dtype):
    """The compiled kernels on the GPU: the very candidates of the reference (|x| >= t or
    NaN, ascending) with their magnitudes; Top-k through them keeps the CPU's magnitudes
    and syncs with the host once a call (the count)."""
    wide = triton_candidates.threshold_dtype(dtype)
    comp = compressors.get("topk", device_candidates="triton", device_direct_below=65_536)
    comp_cpu = compressors.get("topk")
    for key, x in _cuda_inputs().items():
        x = x.to(dtype)
        x[:3] = torch.tensor([float("nan"), float("inf"), -0.0]).to(dtype)
        xc = x.cuda()
        for q in (0.5, 0.99):
            t = x.abs().to(wide).nan_to_num(0.0).quantile(q)
            idx, mags = triton_candidates.candidates_at_or_above(xc, t.cuda())
            ref = ((x.to(wide).abs() >= t) | x.isnan()).nonzero().view(-1)
            assert torch.equal(idx.cpu(), ref), (key, dtype, q)
            assert torch.equal(mags.cpu().nan_to_num(), x.to(wide).abs()[ref].nan_to_num())
        x[:3] = 0.0
        xc = x.cuda()
        for cf in (10, 100, 1000):
            k = num_kept(x.numel(), cf)
            idx = comp.select(xc, k, SelectContext(step=1, layer=2))
            _check(idx, x.numel(), comp, k, "cuda")
            mags = x.abs().float()
            want = mags[comp_cpu.select(x, k, SelectContext(step=1, layer=2))]
            assert torch.equal(mags[idx.cpu()].sort().values, want.sort().values), (key, cf)
    x = torch.randn(1_000_000, generator=torch.Generator().manual_seed(6)).cuda()
    comp.select(x, 10_000, SelectContext(step=0))                 # warm-up (compiles)
    assert _syncs(lambda: comp.select(x, 10_000, SelectContext(step=1))) <= 1


@needs_cuda
def test_cuda_powersgd_factors_live_on_the_gradient_device():
    """warm_start's Q lands on the gradient's GPU equal to the CPU draws (so CPU and GPU
    ranks agree), and one power iteration there matches the CPU's."""
    cols, rows, r = 300, 64, 4
    grad = torch.randn(rows, cols, generator=torch.Generator().manual_seed(8))
    cpu, gpu = PowerSGD(seed=5), PowerSGD(seed=5)
    q_cpu = cpu.warm_start("fc.weight", cols, r, like=grad)
    q_gpu = gpu.warm_start("fc.weight", cols, r, like=grad.cuda())
    assert q_gpu.device.type == "cuda" and q_gpu.dtype == torch.float32
    assert torch.equal(q_gpu.cpu(), q_cpu)
    half = gpu.warm_start("emb", cols, 2, like=torch.zeros(1, dtype=torch.bfloat16, device="cuda"))
    assert half.device.type == "cuda" and half.dtype == torch.float32
    results = []
    for comp, m in ((cpu, grad), (gpu, grad.cuda())):
        p = orthogonalize_(m @ comp.warm_start("fc.weight", cols, r, like=m))
        q_new = m.t() @ p
        comp.adopt("fc.weight", q_new)
        results.append((p @ q_new.t()).cpu())
        assert comp.warm_start("fc.weight", cols, r, like=m).device == m.device
    assert torch.allclose(results[0], results[1], rtol=1e-4, atol=1e-4)
    state = gpu.state_dict()
    assert state["q"]["fc.weight"].device.type == "cuda"
    restored = PowerSGD(seed=5)
    restored.load_state_dict({"seed": 5, "q": {k: v.cpu() for k, v in state["q"].items()}})
    assert restored.warm_start("fc.weight", cols, r, like=grad.cuda()).device.type == "cuda"


@needs_cuda
def test_cuda_topk_select_many_batches_many_layers_exactly():
    """Thirty layers of a model's sizes on the GPU: selected together (segmented_topk,
    DEVICE_BATCH_MIN_LAYERS and more), each layer's exact top-k, as on the CPU."""
    from gravac.compressors import topk as topk_module

    g = torch.Generator().manual_seed(8)
    sizes = [1_024 * (1 + (i * 37) % 200) for i in range(30)]
    xs = [torch.randn(n, generator=g) for n in sizes]
    ks = [num_kept(n, 10) for n in sizes]
    assert len(xs) >= topk_module.DEVICE_BATCH_MIN_LAYERS
    comp = compressors.get("topk")
    picked = comp.select_many([x.cuda() for x in xs], ks,
                              [SelectContext(step=1, layer=i) for i in range(len(xs))])
    for x, k, idx in zip(xs, ks, picked):
        _check(idx, x.numel(), comp, k, "cuda")
        mags = x.abs()
        assert torch.equal(mags[idx.cpu()].sort().values, torch.topk(mags, k).values.sort().values)
