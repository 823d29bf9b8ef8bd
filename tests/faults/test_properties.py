"""Property-based tests (hypothesis): compressors and the sparse transport format over
random sizes, dtypes, CFs, values (ties, zeros, huge and tiny magnitudes) and rank counts."""
import math

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gravac import compressors
from gravac.compressors import SelectContext, num_kept
from gravac.engine.codec import SparseCodec, SparseLayer

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@st.composite
def tensors(draw):
    n = draw(st.integers(1, 3000))
    dtype = draw(st.sampled_from(DTYPES))
    kind = draw(st.sampled_from(["normal", "ties", "zeros", "sparse", "wide"]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    if kind == "normal":
        x = torch.randn(n, generator=g)
    elif kind == "ties":
        x = torch.randint(-2, 3, (n,), generator=g).float()
    elif kind == "zeros":
        x = torch.zeros(n)
    elif kind == "sparse":
        x = torch.randn(n, generator=g) * (torch.rand(n, generator=g) < 0.05)
    else:
        x = torch.randn(n, generator=g) * 10.0 ** torch.randint(-4, 4, (n,), generator=g).float()
    return x.to(dtype)


@SETTINGS
@given(x=tensors(), cf=st.floats(1.0, 5000.0), name=st.sampled_from(["topk", "dgc", "redsync", "randomk"]),
       step=st.integers(0, 10**6), layer=st.integers(0, 500))
def test_select_contract(x, cf, name, step, layer):
    comp = compressors.get(name)
    k = num_kept(x.numel(), cf)
    idx = comp.select(x, k, SelectContext(step=step, layer=layer))
    assert idx.dtype == torch.int64 and idx.dim() == 1
    assert idx.unique().numel() == idx.numel()
    assert idx.numel() == 0 or (int(idx.min()) >= 0 and int(idx.max()) < x.numel())
    low, high = comp.count_bounds(k, x.numel())
    assert low <= idx.numel() <= high
    if name == "topk":
        mags = x.abs().float()
        assert torch.equal(mags[idx].sort(descending=True).values, torch.topk(mags, k).values)


@SETTINGS
@given(x=tensors(), theta_min=st.floats(1.0, 50.0), factor=st.floats(1.0, 200.0))
def test_multilevel_topk_equals_direct(x, theta_min, factor):
    comp = compressors.get("topk")
    n = x.numel()
    theta_c = theta_min * factor
    idx_min = comp.select(x, num_kept(n, theta_min))
    two_level = idx_min[comp.select(x[idx_min], num_kept(n, theta_c))]
    mags = x.abs().float()
    # Same magnitudes as direct Top-k (ties may pick different indices of equal magnitude).
    assert torch.equal(mags[two_level].sort(descending=True).values,
                       torch.topk(mags, num_kept(n, theta_c)).values)


@SETTINGS
@given(data=st.data(), ranks=st.integers(1, 5), n_layers=st.integers(1, 6),
       dtype=st.sampled_from(DTYPES))
def test_pack_unpack_aggregates_like_a_dense_sum(data, ranks, n_layers, dtype):
    sizes = data.draw(st.lists(st.integers(1, 400), min_size=n_layers, max_size=n_layers))
    layers = [SparseLayer(f"l{i}", n, dtype) for i, n in enumerate(sizes)]
    codec = SparseCodec(layers)
    buffers, expected = [], [torch.zeros(n) for n in sizes]
    ctx = None
    for r in range(ranks):
        selections = []
        for i, n in enumerate(sizes):
            count = data.draw(st.integers(0, n))
            g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
            idx = torch.randperm(n, generator=g)[:count]
            vals = torch.randn(count, generator=g).to(dtype)
            selections.append((vals, idx))
            expected[i].index_add_(0, idx, vals.float())
        buf, ctx = codec.pack(selections)
        assert buf.dtype == torch.uint8 and buf.numel() % 8 == 0
        buffers.append(buf)
    flat = codec.aggregate(torch.cat(buffers), ctx, world_size=ranks)
    for got, want in zip(codec.split(flat, ctx), expected):
        assert torch.allclose(got, want / ranks, rtol=1e-6, atol=1e-6)
    assert math.isclose(float(flat.sum()), float(sum(e.sum() for e in expected)) / ranks,
                        rel_tol=1e-4, abs_tol=1e-4)
