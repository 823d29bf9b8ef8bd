"""blockscan.passing_indices against the entry-by-entry scan, and the selections built on
it (Top-k, DGC) against an independent exact top-k, on clustered and spread data.

With gravac's native kernel built, ``passing_indices`` steps aside (the kernel's one scan is
cheaper): these tests turn the kernel off to test the block screening and NumPy's scans
that run where it cannot be built. The kernel itself: test_native.py; the selections
with it: test_compressors.py."""
import pytest
import torch

from gravac import compressors
from gravac.compressors import SelectContext
from gravac.compressors.blockscan import (BLOCK, at_least, count_true, passing_indices,
                                          scan_all, true_indices)
from gravac.engine.codec import _divide_sent


@pytest.fixture(autouse=True)
def _without_native_kernel(monkeypatch):
    monkeypatch.setenv("GRAVAC_NATIVE", "0")


def _entrywise(x, threshold):
    mask = x != 0 if threshold == 0 else x.abs() >= threshold
    return mask.nonzero().view(-1)


def _rows(n, rows, width, seed, scale=1.0):
    """An embedding-like gradient: zeros except ``rows`` random rows of ``width``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.zeros(n)
    for r in torch.randperm(n // width, generator=g)[:rows].tolist():
        x[r * width:(r + 1) * width] = scale * torch.randn(width, generator=g)
    return x


@pytest.mark.parametrize("n", [BLOCK * 1000, BLOCK * 1000 + 37, 100 * BLOCK - 1])
@pytest.mark.parametrize("threshold", [0, 0.5, 2.0])
def test_clustered_entries_are_found_exactly_and_in_order(n, threshold):
    x = _rows(n, rows=3, width=128, seed=n)
    x[-1] = -3.0                               # the tail beyond the last whole block
    x[5] = -0.0                                # negative zero is zero
    x[7] = 1e-38                               # tiny, and not lost in a block reduction
    got = passing_indices(x, threshold)
    assert got is not None and got.dtype == torch.int64
    assert torch.equal(got, _entrywise(x, threshold))


def test_threshold_may_be_a_tensor_and_nan_is_treated_like_the_full_scan():
    x = _rows(BLOCK * 200, rows=2, width=64, seed=3)
    x[BLOCK * 50 + 3] = float("nan")           # a NaN in an otherwise empty block
    x[BLOCK * 51 + 1] = float("nan")
    x[BLOCK * 51 + 2] = 4.0                    # ... and beside a passing entry
    for threshold in (0, torch.tensor(0.7)):
        assert torch.equal(passing_indices(x, threshold), _entrywise(x, threshold))


def test_spread_entries_say_none_so_that_the_caller_scans_everything():
    x = torch.zeros(BLOCK * 100)
    x[::BLOCK // 2] = 1.0                      # one or two in every block
    assert passing_indices(x, 0) is None
    assert passing_indices(torch.randn(BLOCK * 100), 0.1) is None
    assert passing_indices(torch.ones(BLOCK - 1), 0) is None   # shorter than a block


@pytest.mark.parametrize("name", ["topk", "dgc"])
@pytest.mark.parametrize("cf", [4, 40, 400])
def test_selection_on_embedding_like_gradients_matches_an_exact_top_k(name, cf):
    """Error-fed embedding gradients: a few rows nonzero (sampled threshold 0) or many
    rows with small residuals and a few large (threshold > 0, clustered). Repeated calls
    at the same site (the block-scan memory) give the same answer."""
    comp = compressors.get(name)
    n = 128 * 4000
    sparse = _rows(n, rows=40, width=128, seed=1)
    residual = _rows(n, rows=600, width=128, seed=2, scale=0.01) + sparse
    dense = torch.randn(n, generator=torch.Generator().manual_seed(4))
    for x in (sparse, residual, dense):
        k = n // cf
        for _ in range(3):
            idx = comp.select(x, k, SelectContext(step=1, layer=2))
            low, high = comp.count_bounds(k, n)
            assert low <= idx.numel() <= high and idx.unique().numel() == idx.numel()
            kept = x.abs()[idx]
            if name == "topk":
                kth = torch.topk(x.abs(), k).values.min()
                assert kept.min() >= kth               # exact up to ties at the k-th value
                assert int((x.abs() > kth).sum()) <= k
            else:                                      # DGC: the largest `count` entries
                outside = torch.ones(n, dtype=torch.bool)
                outside[idx] = False
                assert kept.min() >= x.abs()[outside].max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dividing_the_whole_layer_or_only_the_sent_entries_gives_the_same_bits(dtype):
    g = torch.Generator().manual_seed(0)
    for sent in (5, 600):                      # sparse path, whole-layer path
        index = torch.randint(0, 1000, (sent,), generator=g).to(torch.int32)
        acc = torch.zeros(1000, dtype=dtype)
        acc.index_add_(0, index, torch.randn(sent, generator=g, dtype=torch.float64).to(dtype))
        whole, sparse = acc.clone().div_(3), acc.clone()
        sparse.index_copy_(0, index.long(), sparse[index.long()] / 3)
        _divide_sent(acc, index, 3)
        assert torch.equal(acc, whole) and torch.equal(acc, sparse)


@pytest.mark.parametrize("threads", [1, 4])         # NumPy's path, torch's path
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_entrywise_helpers_equal_torch_on_every_dtype(dtype, threads, monkeypatch):
    """scan_all / at_least / count_true / true_indices (NumPy on CPU float32/64) against
    torch's own ops: NaN, -0.0, a threshold given as a float32 tensor or a Python float
    that float32 cannot hold exactly (both compared in x's dtype, as torch does)."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(10_001, generator=g).to(dtype)
    x[::97] = 0.0
    x[3], x[4], x[5] = float("nan"), -0.0, float("inf")
    x[6] = 1.3          # float32(1.3) < 1.3: passes 1.3 only if compared in x's dtype
    threshold_tensor = x.abs()[17].clone()
    for threshold in (0, threshold_tensor, 0.1, 1.3):
        assert torch.equal(scan_all(x, threshold), _entrywise(x, threshold))
        mask = torch.empty(x.numel(), dtype=torch.bool)
        ax = torch.empty_like(x)
        assert torch.equal(scan_all(x, threshold, ax, mask), _entrywise(x, threshold))
        if threshold != 0:
            want = x.abs() >= threshold
            got = at_least(x.abs(), threshold, torch.empty(x.numel(), dtype=torch.bool))
            assert torch.equal(got, want)
            assert count_true(got) == int(want.sum())
            assert torch.equal(true_indices(got), want.nonzero().view(-1))
    strided = x[::2]                                    # not contiguous: torch's path
    assert torch.equal(scan_all(strided, 0.5), _entrywise(strided, 0.5))
