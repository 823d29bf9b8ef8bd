"""gravac.native: the C scan against NumPy's three passes, entry for entry, and its build."""
import numpy as np
import pytest
import torch

from gravac import native
from gravac.compressors import blockscan

needs_kernel = pytest.mark.skipif(native.load() is None,
                                  reason=f"native kernel unavailable: {native.why_not()}")


def _numpy_reference(x: torch.Tensor, threshold: float) -> np.ndarray:
    xn = x.numpy()
    if threshold == 0:
        return np.flatnonzero(xn != 0)
    return np.flatnonzero(np.abs(xn) >= xn.dtype.type(threshold))


def _awkward(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=dtype)
    if n >= 40:
        x[3] = float("nan")
        x[5] = -0.0
        x[7] = float("inf")
        x[11] = -float("inf")
        x[13] = 0.0
        x[17] = -1.5          # exactly at the threshold 1.5 below
        x[19] = 1.5
        x[-1] = -2.5          # the tail after the last full mask of 64
    return x


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [0, 1, 15, 40, 63, 64, 65, 1000, 65_537])
@pytest.mark.parametrize("threshold", [0.0, 1e-3, 1.5, 2.9, 1e30])
def test_scan_matches_numpy(dtype, n, threshold):
    x = _awkward(n, dtype, seed=n)
    got = native.scan(x, threshold)
    assert got.dtype == torch.int64
    np.testing.assert_array_equal(got.numpy(), _numpy_reference(x, threshold))


@needs_kernel
def test_scan_takes_the_threshold_in_the_tensors_dtype():
    # 0.1 is not a float32: the comparison must use float32(0.1), as NumPy and torch do
    x = torch.tensor([np.float32(0.1), np.nextafter(np.float32(0.1), np.float32(0))] * 20)
    got = native.scan(x, 0.1)
    assert got.tolist() == list(range(0, 40, 2))
    assert got.tolist() == torch.nonzero(x.abs() >= torch.tensor(0.1)).view(-1).tolist()


@needs_kernel
def test_scan_reuses_a_scratch_and_returns_its_own_tensor():
    x = _awkward(1000, torch.float32, seed=1)
    scratch = torch.full((2000,), -7, dtype=torch.int64)
    first = native.scan(x, 1.0, out=scratch)
    second = native.scan(x * 0, 1.0, out=scratch)        # overwrites the scratch
    np.testing.assert_array_equal(first.numpy(), _numpy_reference(x, 1.0))
    assert second.numel() == 0


def test_scan_declines_what_it_does_not_take():
    x = torch.randn(64)
    assert native.scan(x.view(8, 8), 1.0) is None                 # not 1-D
    assert native.scan(x[::2], 1.0) is None                       # not contiguous
    assert native.scan(x.half(), 1.0) is None                     # not float32/64


def test_blockscan_gives_the_same_indices_with_and_without_the_kernel(monkeypatch):
    x = _awkward(10_000, torch.float32, seed=2)
    x[2000:9000] = 0.0                                            # blocks of zeros
    with_kernel = [blockscan.scan_all(x, t) for t in (0.0, 1.0)]
    monkeypatch.setenv("GRAVAC_NATIVE", "0")
    assert native.scan(x, 1.0) is None
    without = [blockscan.scan_all(x, t) for t in (0.0, 1.0)]
    found = blockscan.passing_indices(x, 1.0)                     # screening is back
    assert found is not None
    for a, b in zip(with_kernel, without):
        assert torch.equal(a, b)
    assert torch.equal(found, without[1])


def test_build_failure_names_the_compiler(monkeypatch, tmp_path):
    monkeypatch.setenv("GRAVAC_NATIVE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "false")
    with pytest.raises(RuntimeError, match="false"):
        native.build()
    assert list(tmp_path.iterdir()) == []                         # nothing half-written


def test_build_is_keyed_by_compiler_and_reused(monkeypatch, tmp_path):
    monkeypatch.setenv("GRAVAC_NATIVE_DIR", str(tmp_path))
    default = native.library_path()
    monkeypatch.setenv("CC", "cc -g")
    assert native.library_path() != default
    monkeypatch.delenv("CC")
    if native.load() is None:
        pytest.skip(f"native kernel unavailable: {native.why_not()}")
    path = native.build()
    stamp = path.stat().st_mtime_ns
    assert native.build() == path and path.stat().st_mtime_ns == stamp


@needs_kernel
@pytest.mark.parametrize("name", ["topk", "dgc"])
def test_selections_are_the_same_with_and_without_the_kernel(name, monkeypatch):
    from gravac import compressors
    from gravac.compressors import SelectContext

    def picks():
        out = []
        for seed in range(5):
            x = _awkward(100_000 + 7 * seed, torch.float32, seed)
            if seed == 3:
                x[:80_000] = 0.0                      # mostly zeros: the exact fallback
            if seed == 4:                             # ties: DGC's retries reach 0
                x = torch.randint(-3, 4, (x.numel(),), generator=torch.Generator()
                                  .manual_seed(seed)).float()
            for cf in (10, 100, 1000):
                ctx = SelectContext(step=seed, layer=cf)
                idx = compressors.get(name).select(x, x.numel() // cf, ctx)
                out.append(idx.sort().values)
        return out

    with_kernel = picks()
    monkeypatch.setenv("GRAVAC_NATIVE", "0")
    without = picks()
    assert all(torch.equal(a, b) for a, b in zip(with_kernel, without))
