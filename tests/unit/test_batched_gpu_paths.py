"""The engine's batched GPU paths, run on CPU tensors (they are plain torch): the same
results as the per-layer paths the CPU takes. On a GPU tests/unit/test_cuda_engine.py
compares whole steps against the CPU's."""
import torch

from gravac.engine.codec import SparseCodec, SparseLayer, _flat_ok
from gravac.memory import ResidualMemory, SparseSent


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
    assert memory_module._views_of_one([many._spares[n] for n in names]) is not None


def test_one_flat_sum_equals_the_per_layer_sums():
    """Two ranks' chunks with overlapping picks: summed, divided, written per layer."""
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
    collected = [([], []) for _ in layers]
    for counts, values, indices in codec.unpack(gathered, ctx):
        for (vals, idxs), v, i in zip(collected, values.split(counts), indices.split(counts)):
            vals.append(v)
            idxs.append(i)
    codec._aggregate_flat(flat_outs, collected, 2)
    assert all(torch.equal(a, b) for a, b in zip(per_layer, flat_outs))


def test_the_flat_path_is_for_many_layers_on_one_gpu_only():
    from gravac.engine import codec as codec_module

    cpu = [torch.zeros(3)] * codec_module.FLAT_MIN_LAYERS
    assert not _flat_ok(cpu)                       # the CPU keeps its per-layer path
