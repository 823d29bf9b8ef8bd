"""The engine's batched GPU paths, run on CPU tensors (they are plain torch): the same
results as the per-layer paths the CPU takes. On a GPU tests/unit/test_cuda_engine.py
compares whole steps against the CPU's."""
import torch

from gravac.engine.codec import SparseCodec, SparseLayer, _flat_ok
from gravac.memory import ResidualMemory, SparseSent
from gravac.util.segments import gather_segments, views_of_one


def _layers():
    return [SparseLayer(f"l{i}", n, torch.float32) for i, n in enumerate((50, 7, 300))]


def test_feedback_of_all_layers_at_once_equals_one_by_one():
    g = torch.Generator().manual_seed(0)
    names = ["a", "b", "c"]
    grads = [torch.randn(4, 5, generator=g), torch.randn(7, generator=g), torch.randn(30, generator=g)]
    one, many = ResidualMemory(), ResidualMemory()
    for step in range(3):
        for mem, batched in ((one, False), (many, True)):
            mem.begin_step()
            g_efs = mem.compensate_all(names, grads, batched=batched)
            for name, g_ef in zip(names, g_efs):
                idx = torch.topk(g_ef.abs(), 3).indices
                mem.update(name, g_ef, SparseSent(idx, g_ef[idx]))
        assert all(torch.equal(one[n], many[n]) for n in names), step
        grads = [t * -0.5 for t in grads]


def test_the_residuals_of_all_layers_updated_at_once_equal_one_by_one(monkeypatch):
    """update_sparse over one flat buffer (the GPU's path, forced here with batched=True):
    the same residuals bit for bit as update() per layer, through rollbacks, a layer held
    (frozen), a layer flushed dense, a state dict loaded mid-way; and the path is taken."""
    from gravac import memory as memory_module

    g = torch.Generator().manual_seed(2)
    sizes = (40, 7, 300, 12, 64, 5, 90, 33, 18, 250) * (
        memory_module.FLAT_UPDATE_MIN_LAYERS // 10 + 1)          # enough for the flat path
    names = [f"l{i}" for i in range(len(sizes))]
    one, many = ResidualMemory(), ResidualMemory()
    index_adds = []
    real_index_add = torch.Tensor.index_add_
    monkeypatch.setattr(torch.Tensor, "index_add_", lambda self, *a, **k: (
        index_adds.append(self.numel()), real_index_add(self, *a, **k))[1])
    for step in range(8):
        grads = [torch.randn(n, generator=g) for n in sizes]
        held = {"l3"} if step in (4, 5) else set()
        flushed = "l6" if step == 2 else None
        picks = [torch.randperm(n, generator=g)[:max(1, n // 4)] for n in sizes]
        for mem, batched in ((one, False), (many, True)):
            mem.begin_step(held=held)
            index_adds.clear()
            live = [i for i, n in enumerate(names) if n != flushed]
            if flushed:
                mem.flush_into(flushed, grads[names.index(flushed)].clone())
            g_efs = mem.compensate_all([names[i] for i in live], [grads[i] for i in live],
                                       batched=batched)
            sents = [SparseSent(picks[i], g_ef[picks[i]]) for i, g_ef in zip(live, g_efs)]
            if batched:
                mem.update_sparse([names[i] for i in live], g_efs, sents)
                if step > 0 and not held:   # one launch over the flat buffer of them all
                    assert index_adds == [sum(sizes)], (step, index_adds)
            else:
                for i, g_ef, sent in zip(live, g_efs, sents):
                    mem.update(names[i], g_ef, sent)
            if step in (1, 5):
                mem.rollback_step()
        assert all(torch.equal(one[n], many[n]) for n in names), step
        if step == 3:     # a resume: separate tensors again, made flat at the next step
            state = one.state_dict()
            one.load_state_dict(state)
            many.load_state_dict(state)
    assert views_of_one([many._spares[n] for n in names]) is not None


def test_one_flat_sum_equals_the_per_layer_sums():
    """Two ranks' chunks with overlapping picks: summed, divided, written per layer; the
    one-buffer path reads the chunks as they came (not split per layer), the same bits."""
    g = torch.Generator().manual_seed(1)
    layers = _layers()
    codec = SparseCodec(layers)
    chunks = []
    for rank in range(2):
        picks = [torch.randperm(l.numel, generator=g)[:max(1, l.numel // 5)] for l in layers]
        buf, ctx = codec.pack([(torch.randn(len(i), generator=g), i) for i in picks])
        chunks.append(buf)
    gathered = torch.cat(chunks)
    per_layer = [torch.full((l.numel,), 7.0) for l in layers]
    codec.aggregate_into(gathered, ctx, 2, per_layer)
    flat_outs = [torch.full((l.numel,), 7.0) for l in layers]
    codec._aggregate_flat(flat_outs, list(codec.unpack(gathered, ctx)), 2)
    assert all(torch.equal(a, b) for a, b in zip(per_layer, flat_outs))


def test_the_flat_path_is_for_many_layers_on_one_gpu_only():
    from gravac.engine import codec as codec_module

    cpu = [torch.zeros(3)] * codec_module.FLAT_MIN_LAYERS
    assert not _flat_ok(cpu)                       # the CPU keeps its per-layer path


def test_one_gather_over_all_layers_equals_one_index_select_each():
    """gather_segments from views of one buffer (no copy) and from separate tensors (one
    concatenation): the values index_select gives layer by layer, bit for bit; the
    results are views of one tensor, which a second gather reads as they are."""
    g = torch.Generator().manual_seed(3)
    sizes = [5, 1, 300, 64, 17]
    flat = torch.randn(sum(sizes) + 9, generator=g)[9:]      # views at an offset of their base
    views = list(flat.split(sizes))
    separate = [torch.randn(n, generator=g) for n in sizes]
    picks = [torch.randperm(n, generator=g)[:max(0, n // 3)] for n in sizes]   # one empty
    for sources in (views, separate):
        got = gather_segments(sources, picks)
        assert [t.numel() for t in got] == [p.numel() for p in picks]
        assert all(torch.equal(v, s.index_select(0, p)) for v, s, p in zip(got, sources, picks))
        assert views_of_one(got) is not None
        sub = [torch.arange(t.numel() // 2) for t in got]
        assert all(torch.equal(a, t[:len(s)]) for a, t, s in zip(gather_segments(got, sub), got, sub))


def test_both_levels_gathered_at_once_equal_the_per_layer_gathers(monkeypatch):
    """select_levels on the accelerator path (forced onto CPU tensors) with enough layers
    for one gather per level: the same indices and values at both levels as the CPU's
    per-layer index_select, and the per-layer path is not taken."""
    from gravac.compressors import TopK, base
    from gravac.engine import selection as selection_module
    from gravac.engine.layers import Layer

    g = torch.Generator().manual_seed(4)
    sizes = [40 + 13 * i for i in range(selection_module.GATHER_MIN_LAYERS + 3)]
    params = [torch.nn.Parameter(torch.zeros(n)) for n in sizes]
    layers = [Layer(i, f"l{i}", p, p.numel(), True) for i, p in enumerate(params)]
    grads = list(torch.randn(sum(sizes), generator=g).split(sizes))   # views of one, as on a GPU
    fed = [(layer, g_ef, 10.0, 40.0 if i % 2 else None)
           for i, (layer, g_ef) in enumerate(zip(layers, grads))]
    reference = selection_module.select_levels(TopK(), fed, step=3, rank=0)
    monkeypatch.setattr(base, "device_path", lambda t: True)
    calls = []
    monkeypatch.setattr(torch.Tensor, "index_select", lambda self, *a, real=torch.Tensor.index_select:
                        (calls.append(self), real(self, *a))[1])
    monkeypatch.setattr(selection_module, "GATHER_MIN_LAYERS", 1 << 30)
    selection_module.select_levels(TopK(), fed, step=3, rank=0)    # one gather per layer
    one_each, calls[:] = len(calls), []
    second = sum(cf_c is not None for *_, cf_c in fed)
    monkeypatch.setattr(selection_module, "GATHER_MIN_LAYERS", second)    # both levels
    batched = selection_module.select_levels(TopK(), fed, step=3, rank=0)
    # one gather per level and kind instead of one per layer (two at the second level)
    assert one_each - len(calls) == len(fed) + 2 * second - 3, (one_each, len(calls))
    assert not any(c is g_ef for c in calls for g_ef in grads)
    for want, got in zip(reference, batched):
        order = torch.argsort(got.idx_min)
        assert torch.equal(want.idx_min.sort().values, got.idx_min[order])
        assert torch.equal(want.g_ef.index_select(0, want.idx_min.sort().values), got.val_min[order])
        assert (got.idx_c is None) == (want.idx_c is None)
        if got.idx_c is not None:
            assert torch.equal(got.val_c, got.g_ef.index_select(0, got.idx_c.long()))
            assert set(got.idx_c.tolist()) <= set(got.idx_min.tolist())
            assert torch.equal(want.val_c.abs().sort().values, got.val_c.abs().sort().values)
