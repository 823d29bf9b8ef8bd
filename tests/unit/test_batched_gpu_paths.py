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
