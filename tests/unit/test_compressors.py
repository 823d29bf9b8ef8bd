"""The select(x, k) contract of every compressor, and each one's own promise."""
import math

import pytest
import torch

from gravac import compressors
from gravac.compressors import SelectContext, num_kept

NAMES = ["topk", "dgc", "redsync", "randomk", "none"]
SPARSE = ["topk", "dgc", "redsync", "randomk"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _check_indices(idx, n):
    assert idx.dtype == torch.int64 and idx.dim() == 1
    assert idx.unique().numel() == idx.numel(), "indices must be distinct"
    if idx.numel():
        assert int(idx.min()) >= 0 and int(idx.max()) < n


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 7, 1000, 70_000, 300_000])
@pytest.mark.parametrize("cf", [1, 1.5, 10, 100, 1000])
def test_contract_and_count_bounds(name, dtype, n, cf):
    comp = compressors.get(name)
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(dtype)
    k = num_kept(n, cf)
    idx = comp.select(x, k, SelectContext(step=3, layer=1))
    _check_indices(idx, n)
    low, high = comp.count_bounds(k, n)
    assert low <= idx.numel() <= high, (name, n, cf, idx.numel(), (low, high))


@pytest.mark.parametrize("name", NAMES)
def test_exact_count_is_a_promise_the_selection_keeps(name):
    """``exact_count`` lets the sparse allgather skip its size round (torch.distributed):
    a compressor that claims it must return exactly min(k, n) indices, also on zeros,
    ties and half precision; DGC and RedSync (about k) must not claim it."""
    comp = compressors.get(name)
    assert comp.exact_count == (name not in ("dgc", "redsync"))
    if not comp.exact_count or comp.is_dense:
        return
    g = torch.Generator().manual_seed(5)
    inputs = [torch.randn(200_000, generator=g), torch.zeros(100_000),
              torch.ones(70_000), torch.randn(300_000, generator=g).round(),
              torch.randn(90_000, generator=g).to(torch.float16)]
    for x in inputs:
        for cf in (1, 1.5, 10, 1000):
            k = num_kept(x.numel(), cf)
            for level in (0, 1):
                idx = comp.select(x, k, SelectContext(step=2, layer=3, level=level))
                assert idx.numel() == k, (name, x.numel(), cf)
                assert comp.count_bounds(k, x.numel()) == (k, k)


@pytest.mark.parametrize("n", [1, 5, 1000, 65_536, 65_537, 200_000, 1_000_000])
@pytest.mark.parametrize("cf", [1, 2, 10, 100, 1000, 10**7])
@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_is_exact(n, cf, dtype):
    x = torch.randn(n, generator=torch.Generator().manual_seed(7 + n)).to(dtype)
    k = num_kept(n, cf)
    idx = compressors.get("topk").select(x, k)
    assert idx.numel() == k
    mags = x.abs().float()
    # The kept magnitudes are exactly the k largest (ties in low precision may swap which
    # index is kept, never which magnitude).
    expected = torch.topk(mags, k).values
    assert torch.equal(mags[idx].sort(descending=True).values, expected)
    # On CPU in index order (base.exact_topk): every path here, direct, sampled, all.
    assert bool((idx[1:] > idx[:-1]).all())


@pytest.mark.parametrize("m, k", [(10, 10), (1000, 1), (1000, 124), (1000, 125), (50_000, 9_000)])
def test_ascending_positions_both_ways(m, k):
    """A mask where k >= m / 8, a sort below: the same ascending int64 positions."""
    import numpy as np
    from gravac.compressors.base import ascending_positions
    picked = np.random.default_rng(m + k).choice(m, k, replace=False).astype(np.int32)
    out = ascending_positions(picked, m)
    assert out.dtype == np.int64 and out.tolist() == sorted(picked.tolist())


def test_topk_falls_back_when_sample_misleads():
    # A few huge values hidden among zeros: any threshold from a small sample is 0 or
    # too high; the result must still be exact.
    x = torch.zeros(500_000)
    hot = torch.randperm(500_000, generator=torch.Generator().manual_seed(0))[:50]
    x[hot] = torch.arange(1, 51, dtype=torch.float32)
    idx = compressors.get("topk").select(x, 50)
    assert set(idx.tolist()) == set(hot.tolist())
    idx = compressors.get("topk").select(x, 5000)  # more than the nonzeros: zeros fill in
    assert idx.numel() == 5000 and set(hot.tolist()) <= set(idx.tolist())


@pytest.mark.parametrize("name", SPARSE)
def test_selects_large_entries(name):
    """Threshold methods keep big entries; Random-k keeps a magnitude-blind sample."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(200_000, generator=g)
    k = 2000
    idx = compressors.get(name).select(x, k)
    if name == "randomk":
        # Uniform draws: the kept magnitudes look like the population's (mean |N(0,1)| =
        # sqrt(2/pi) ~ 0.80, standard error ~0.013 for 2000 draws), far below the top-k's.
        kept = x.abs()[idx]
        assert idx.numel() == k and abs(float(kept.mean()) - float(x.abs().mean())) < 0.06
        assert float(kept.mean()) < 0.5 * float(torch.topk(x.abs(), k).values.mean())
        return
    kth = torch.topk(x.abs(), k).values[-1]
    # DGC and RedSync approximate the threshold: what they keep is from the top ~4k.
    loose = torch.topk(x.abs(), 4 * k).values[-1]
    assert float(x.abs()[idx].min()) >= float(loose)
    assert float(x.abs()[idx].max()) >= float(kth)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_edge_cases(name, dtype):
    comp = compressors.get(name)
    one = torch.tensor([3.0], dtype=dtype)
    assert comp.select(one, 1).tolist() == [0]
    x = torch.randn(10).to(dtype)
    assert sorted(comp.select(x, 10).tolist()) == list(range(10))      # k == n
    assert sorted(comp.select(x, 1000).tolist()) == list(range(10))    # k > n
    zeros = torch.zeros(100_000, dtype=dtype)
    idx = comp.select(zeros, 100)
    _check_indices(idx, zeros.numel())
    low, high = comp.count_bounds(100, zeros.numel())
    assert low <= idx.numel() <= high


@pytest.mark.parametrize("name", SPARSE)
def test_bad_arguments(name):
    comp = compressors.get(name)
    with pytest.raises(ValueError, match="k >= 1"):
        comp.select(torch.randn(10), 0)
    with pytest.raises(ValueError, match="1-D"):
        comp.select(torch.randn(3, 3), 2)


def test_registry_errors():
    with pytest.raises(ValueError, match="known compressors: topk, dgc, redsync, randomk, none"):
        compressors.get("top_k")
    with pytest.raises(ValueError, match="unknown option.*'ratio'.*allowed"):
        compressors.get("dgc", ratio=0.1)
    with pytest.raises(ValueError, match="sample_fraction"):
        compressors.get("dgc", sample_fraction=0)
    # An option of the wrong kind is named (before: "'<' not supported between ...").
    with pytest.raises(ValueError, match=r"dgc: option sample_fraction='x' must be a number"):
        compressors.get("dgc", sample_fraction="x")
    with pytest.raises(ValueError, match=r"randomk: option seed='a' must be a whole number"):
        compressors.get("randomk", seed="a")
    with pytest.raises(ValueError, match=r"randomk: option same_across_ranks=1 must be true"):
        compressors.get("randomk", same_across_ranks=1)
    assert compressors.get("topk", sample_fraction=1).sample_fraction == 1
    comp = compressors.get("topk")
    assert compressors.get(comp) is comp


def test_num_kept():
    assert num_kept(1000, 10) == 100
    assert num_kept(1001, 10) == 101
    assert num_kept(5, 1000) == 1
    assert num_kept(7, 1.5) == 5
    assert num_kept(10, 1) == 10
    with pytest.raises(ValueError, match=">= 1"):
        num_kept(10, 0.5)


def test_randomk_private_generator_and_rank_agreement():
    comp = compressors.get("randomk", seed=5)
    x = torch.randn(100_000)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a = comp.select(x, 1000, SelectContext(step=4, layer=2, rank=0))
    assert torch.equal(torch.get_rng_state(), before), "Random-k touched the global RNG"
    b = comp.select(x, 1000, SelectContext(step=4, layer=2, rank=1))
    assert torch.equal(a, b), "same_across_ranks draws the same indices on every rank"
    c = comp.select(x, 1000, SelectContext(step=5, layer=2, rank=0))
    assert not torch.equal(a, c), "a new step draws new indices"
    per_rank = compressors.get("randomk", seed=5, same_across_ranks=False)
    d0 = per_rank.select(x, 1000, SelectContext(step=4, layer=2, rank=0))
    d1 = per_rank.select(x, 1000, SelectContext(step=4, layer=2, rank=1))
    assert not torch.equal(d0, d1)
    assert torch.equal(d0, per_rank.select(x, 1000, SelectContext(step=4, layer=2, rank=0)))


def test_randomk_is_uniform():
    """Each index is kept with probability k/n: chi-square over many draws."""
    comp = compressors.get("randomk")
    n, k, draws = 200, 20, 2000
    counts = torch.zeros(n)
    x = torch.zeros(n)
    for step in range(draws):
        counts[comp.select(x, k, SelectContext(step=step))] += 1
    expected = draws * k / n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    # 199 degrees of freedom: mean 199, sd ~20; 300 is > 5 sd out.
    assert chi2 < 300, chi2
    # the "drop n - k" bitmap path (k > n/2, e.g. CF 1.5)
    counts = torch.zeros(n)
    for step in range(400):
        counts[comp.select(torch.zeros(200), 150, SelectContext(step=step))] += 1
    expected = 400 * 150 / 200
    assert float(((counts - expected) ** 2 / expected).sum()) < 300
    # the sparse path (draw with replacement, deduplicate) too
    n, k = 100_000, 500
    hits = torch.zeros(10)
    for step in range(200):
        idx = comp.select(torch.zeros(n), k, SelectContext(step=step))
        assert idx.numel() == k
        hits += torch.bincount(idx * 10 // n, minlength=10)
    share = hits / hits.sum()
    assert float((share - 0.1).abs().max()) < 0.01


def test_dgc_and_redsync_bounds_are_documented():
    dgc, red = compressors.get("dgc"), compressors.get("redsync")
    assert dgc.count_bounds(1000, 10**6) == (700, 1000)
    assert red.count_bounds(1000, 10**6) == (500, 2000)


@pytest.mark.parametrize("name", ["dgc", "redsync"])
@pytest.mark.parametrize("dist", ["normal", "laplace", "heavy", "ties"])
def test_threshold_methods_on_skewed_data(name, dist):
    g = torch.Generator().manual_seed(3)
    n = 400_000
    if dist == "normal":
        x = torch.randn(n, generator=g)
    elif dist == "laplace":
        x = torch.empty(n).exponential_(generator=g) * torch.sign(torch.randn(n, generator=g))
    elif dist == "heavy":
        x = torch.randn(n, generator=g) ** 5
    else:
        x = torch.randint(-3, 4, (n,), generator=g).float()
    comp = compressors.get(name)
    for cf in (10, 100, 1000):
        k = num_kept(n, cf)
        idx = comp.select(x, k)
        _check_indices(idx, n)
        low, high = comp.count_bounds(k, n)
        assert low <= idx.numel() <= high, (dist, cf, idx.numel())


def test_multilevel_topk_equals_direct_topk():
    """Second level over the kept values gives exactly direct Top-k at the candidate CF."""
    comp = compressors.get("topk")
    g = torch.Generator().manual_seed(11)
    for n in [1, 3, 10, 999, 1024, 4097, 70_000, 250_000]:
        x = torch.randn(n, generator=g)
        for theta_min, theta_c in [(10, 20), (10, 1000), (1.5, 1000), (10, 10**6)]:
            idx_min = comp.select(x, num_kept(n, theta_min))
            sub = comp.select(x[idx_min], num_kept(n, theta_c))
            two_level = idx_min[sub]
            direct = comp.select(x, num_kept(n, theta_c))
            assert set(two_level.tolist()) == set(direct.tolist()), (n, theta_min, theta_c)
            assert math.ceil(n / theta_c) <= 1 or two_level.numel() == math.ceil(n / theta_c)


def _embedding_gradient(rows_touched, n_rows=20_000, dim=128, dtype=torch.float32):
    """Like an embedding's error-fed gradient: a few rows nonzero, all others exact zeros."""
    g = torch.Generator().manual_seed(rows_touched)
    x = torch.zeros(n_rows, dim, dtype=dtype)
    rows = torch.randperm(n_rows, generator=g)[:rows_touched]
    x[rows] = torch.randn(rows_touched, dim, generator=g).to(dtype)
    return x.view(-1)


@pytest.mark.parametrize("name", ["topk", "dgc", "redsync"])
@pytest.mark.parametrize("rows_touched", [100, 1000])
@pytest.mark.parametrize("cf", [4, 40, 400])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mostly_zero_gradients_keep_the_largest_entries(name, rows_touched, cf, dtype):
    """Most entries zero, so a sampled threshold is 0 (the fast path over the nonzeros):
    Top-k keeps exactly the k largest magnitudes; DGC and RedSync keep a count within
    their bounds and never drop an entry larger than one they keep; when the nonzeros fit
    in k every one of them is kept (zeros fill Top-k's rest)."""
    x = _embedding_gradient(rows_touched, dtype=dtype)
    n, nnz = x.numel(), int(torch.count_nonzero(x))
    k = num_kept(n, cf)
    comp = compressors.get(name)
    idx = comp.select(x, k)
    _check_indices(idx, n)
    low, high = comp.count_bounds(k, n)
    assert low <= idx.numel() <= high
    mags = x.abs().float()
    if name == "topk":
        assert torch.equal(mags[idx].sort(descending=True).values, torch.topk(mags, k).values)
    dropped = torch.ones(n, dtype=torch.bool)
    dropped[idx] = False
    assert float(mags[idx].min()) >= float(mags[dropped].max())
    if k >= nnz:
        assert int(torch.count_nonzero(x[idx])) == nnz


def test_mostly_zero_gradient_second_level_equals_direct_topk():
    """Multi-level over a mostly-zero layer: the second pass over the first level's values
    (nonzeros plus zero padding) keeps the same magnitudes as a direct top-k at theta_c."""
    comp = compressors.get("topk")
    x = _embedding_gradient(300)
    n = x.numel()
    idx_min = comp.select(x, num_kept(n, 10))
    sub = comp.select(x[idx_min], num_kept(n, 1000))
    direct = torch.topk(x.abs(), num_kept(n, 1000)).values
    assert torch.equal(x[idx_min][sub].abs().sort(descending=True).values, direct)


def test_topk_auto_candidates_fall_back_to_torch_once_when_triton_fails(monkeypatch):
    """device_candidates="auto" (the default): a Triton that fails to build or run on the
    GPU costs one warning and speed, not the run; torch's pass from then on."""
    from gravac.compressors import topk as topk_module

    comp = compressors.get("topk")
    assert comp.device_candidates == "auto"
    comp._auto_triton = True
    calls = []

    def broken(x, threshold):
        calls.append(1)
        raise RuntimeError("no C compiler")
    monkeypatch.setattr(topk_module.triton_candidates, "candidates_at_or_above", broken)
    x = torch.randn(1000)
    with pytest.warns(RuntimeWarning, match="Triton's candidate kernels failed"):
        assert comp._auto_candidates(x, torch.tensor(0.5)) is None
    assert comp._auto_triton is False and calls == [1]
