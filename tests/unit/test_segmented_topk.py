"""Top-k of many layers in the same kernels (gravac/compressors/segmented.py): exact against
torch.topk layer by layer, on any device (these run on CPU tensors; the GPU is where it
pays, tests/unit/test_cuda_compressors.py and benchmarks/gpu_step.py)."""
import math

import pytest
import torch

from gravac import compressors
from gravac.compressors import SelectContext, base, segmented
from gravac.compressors.segmented import segmented_topk


def _layers(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(n, generator=g) for n in (7, 5_000, 300_000, 70_001)]
    embedding = torch.zeros(64_000)                          # a few rows nonzero
    embedding[1_280:1_920] = torch.randn(640, generator=g)
    ties = torch.randint(-3, 4, (200_000,), generator=g).float()
    heavy = torch.randn(100_000, generator=g) ** 5
    return [x.to(dtype) for x in (*xs, embedding, ties, heavy)]


def _assert_exact(xs, ks, picked):
    for x, k, idx in zip(xs, ks, picked):
        assert idx.dtype == torch.int64 and idx.numel() == k
        assert idx.unique().numel() == k and int(idx.min()) >= 0 and int(idx.max()) < x.numel()
        mags = x.abs().float()
        assert torch.equal(mags[idx].sort().values, torch.topk(mags, k).values.sort().values)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cf", [1.5, 10, 100, 1000])
def test_every_layer_gets_its_exact_top_k(dtype, cf):
    xs = _layers(dtype=dtype)
    ks = [min(x.numel() - 1, max(1, math.ceil(x.numel() / cf))) for x in xs]
    picked = segmented_topk(xs, ks, seed=3, step=5)
    assert picked is not None
    _assert_exact(xs, ks, picked)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_views_of_one_buffer_read_in_place_and_the_same_picks(dtype):
    """Layers that are adjacent views of one buffer (the error-fed gradients on a GPU)
    take |x| of that buffer in one pass, and pick exactly what copies of them pick; views
    out of order are concatenated instead. The buffer is left as it was."""
    xs = _layers(dtype=dtype)
    flat = torch.cat([torch.randn(5).to(dtype)] + xs)             # views at an offset
    views = list(flat[5:].split([x.numel() for x in xs]))
    before = flat.clone()
    ks = [max(1, x.numel() // 50) for x in xs]
    for layers, want_ks in ((views, ks), (views[::-1], ks[::-1])):
        picked = segmented_topk(layers, want_ks, seed=1, step=2)
        assert picked is not None
        _assert_exact(layers, want_ks, picked)
        copies = segmented_topk([v.clone() for v in layers], want_ks, seed=1, step=2)
        assert all(torch.equal(a, b) for a, b in zip(picked, copies))
    assert torch.equal(flat, before)


def test_k_of_one_and_of_all_but_one():
    xs = _layers()
    for ks in ([1] * len(xs), [x.numel() - 1 for x in xs]):
        picked = segmented_topk(xs, ks)
        assert picked is not None
        _assert_exact(xs, ks, picked)


def test_a_sample_that_falls_short_says_so(monkeypatch):
    """A threshold above the k-th largest (forced here) leaves fewer than k candidates:
    None, and TopK.select_many then selects layer by layer, still exact."""
    monkeypatch.setattr(segmented, "_sample_rank", lambda n, k, s: 1)
    xs = _layers()[2:4]
    ks = [x.numel() // 10 for x in xs]
    assert segmented_topk(xs, ks) is None
    monkeypatch.setattr(base, "device_path", lambda t: True)
    _assert_exact(xs, ks, compressors.get("topk").select_many(xs, ks))


def test_topk_select_many_batches_on_the_device_path_only(monkeypatch):
    """CPU tensors: one select per layer, the very indices of select. Forced onto the
    accelerator path (as on a GPU): the same magnitudes, through segmented_topk once per
    dtype group; tensors with k >= n, or above device_direct_below, one call each."""
    xs = _layers()[1:4] + [torch.randn(40, dtype=torch.float64)]
    ks = [x.numel() // 10 for x in xs[:-1]] + [40]
    ctxs = [SelectContext(step=2, layer=i) for i in range(len(xs))]
    comp = compressors.get("topk")
    want = [comp.select(x, k, c) for x, k, c in zip(xs, ks, ctxs)]
    got = comp.select_many(xs, ks, ctxs)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    calls = []
    real = segmented.segmented_topk
    monkeypatch.setattr("gravac.compressors.topk.segmented_topk",
                        lambda xs_, ks_, **kw: calls.append(len(xs_)) or real(xs_, ks_, **kw))
    monkeypatch.setattr(base, "device_path", lambda t: True)
    _assert_exact(xs, ks, comp.select_many(xs, ks, ctxs))
    assert calls == []          # 3 layers: fewer than DEVICE_BATCH_MIN_LAYERS, one call each
    monkeypatch.setattr("gravac.compressors.topk.DEVICE_BATCH_MIN_LAYERS", 2)
    got = comp.select_many(xs, ks, ctxs)
    assert calls == [3]
    _assert_exact(xs, ks, got)
    calls.clear()
    assert compressors.get("topk", batch_layers=False).select_many(xs, ks, ctxs) and calls == []
