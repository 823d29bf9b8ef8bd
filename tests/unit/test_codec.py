"""SparseCodec: pack every sparse layer into one buffer, unpack all ranks', aggregate."""
import pytest
import torch

from gravac.engine.codec import SparseCodec, SparseLayer


def _layers(dtype=torch.float32):
    return [SparseLayer("a", 10, dtype), SparseLayer("b", 3, dtype), SparseLayer("c", 1000, dtype)]


def _dense(layers, selections):
    out = []
    for layer, (vals, idx) in zip(layers, selections):
        d = torch.zeros(layer.numel, dtype=torch.float32)
        d.index_add_(0, idx, vals.float())
        out.append(d)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_roundtrip_two_ranks_with_duplicates_and_empty_layers(dtype):
    layers = _layers(dtype)
    codec = SparseCodec(layers)
    rank0 = [(torch.tensor([1.0, -2.0], dtype=dtype), torch.tensor([3, 7])),
             (torch.tensor([], dtype=dtype), torch.tensor([], dtype=torch.int64)),
             (torch.tensor([0.5], dtype=dtype), torch.tensor([999]))]
    rank1 = [(torch.tensor([4.0], dtype=dtype), torch.tensor([3])),          # same index as rank 0
             (torch.tensor([1.0, 2.0, 3.0], dtype=dtype), torch.tensor([0, 1, 2])),
             (torch.tensor([], dtype=dtype), torch.tensor([], dtype=torch.int64))]
    b0, ctx = codec.pack(rank0)
    b1, _ = codec.pack(rank1)
    assert b0.dtype == torch.uint8 and b0.numel() % 8 == 0
    gathered = torch.cat([b0, b1])          # what hvd.allgather returns
    flat = codec.aggregate(gathered, ctx, world_size=2)
    parts = codec.split(flat, ctx)
    expected = [(x + y) / 2 for x, y in zip(_dense(layers, rank0), _dense(layers, rank1))]
    for got, want in zip(parts, expected):
        assert torch.equal(got, want)
    assert float(parts[0][3]) == pytest.approx((1.0 + 4.0) / 2)


def test_rank_with_nothing_to_send_and_chunk_count_check():
    layers = _layers()
    codec = SparseCodec(layers)
    empty = [(torch.tensor([]), torch.tensor([], dtype=torch.int64))] * 3
    full = [(torch.ones(2), torch.tensor([0, 1])), (torch.ones(1), torch.tensor([2])),
            (torch.ones(1), torch.tensor([5]))]
    b0, ctx = codec.pack(empty)
    b1, _ = codec.pack(full)
    flat = codec.aggregate(torch.cat([b0, b1]), ctx, world_size=2)
    assert float(flat.sum()) == pytest.approx(2.0)
    with pytest.raises(RuntimeError, match="2 chunks for 3 ranks"):
        codec.aggregate(torch.cat([b0, b1]), ctx, world_size=3)


def test_mismatched_layer_sets_are_detected():
    a = SparseCodec(_layers())
    b = SparseCodec(_layers()[:2])
    buf_b, _ = b.pack([(torch.ones(1), torch.tensor([0]))] * 2)
    buf_a, ctx = a.pack([(torch.ones(1), torch.tensor([0]))] * 3)
    with pytest.raises(RuntimeError, match="different layer sets"):
        a.aggregate(torch.cat([buf_a, buf_b]), ctx, world_size=2)


def test_mixed_dtypes_travel_as_float32_and_large_indices():
    layers = [SparseLayer("h", 100, torch.float16), SparseLayer("f", 100, torch.float32)]
    codec = SparseCodec(layers)
    assert codec.wire_dtype == torch.float32 and codec.index_dtype == torch.int32
    buf, ctx = codec.pack([(torch.tensor([1.5], dtype=torch.float16), torch.tensor([99])),
                               (torch.tensor([2.5]), torch.tensor([0]))])
    flat = codec.aggregate(buf, ctx, world_size=1)
    assert float(flat[99]) == 1.5 and float(flat[100]) == 2.5
    big = SparseCodec([SparseLayer("e", 2**31, torch.float32)], device="meta")
    assert big.index_dtype == torch.int64


def test_wrong_number_of_selections():
    codec = SparseCodec(_layers())
    with pytest.raises(ValueError, match="expected 3"):
        codec.pack([(torch.ones(1), torch.tensor([0]))])


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_aggregate_into_writes_the_exact_average_into_the_outputs(out_dtype, ranks):
    """What the engine uses: each layer's average written straight into its gradient
    (stale contents overwritten), equal to summing every rank's dense scatter in the
    accumulation dtype and dividing once."""
    wire = torch.float32 if out_dtype in (torch.float16, torch.bfloat16) else out_dtype
    layers = [SparseLayer("a", 1000, wire), SparseLayer("b", 37, wire)]
    codec = SparseCodec(layers)
    g = torch.Generator().manual_seed(ranks)
    buffers, sums = [], [torch.zeros(l.numel, dtype=wire) for l in layers]
    for _ in range(ranks):
        selections = []
        for layer, total in zip(layers, sums):
            # Ranks overlap on half their picks (duplicates across ranks are summed).
            idx = torch.cat([torch.arange(0, layer.numel, 7)[:20],
                             torch.randperm(layer.numel, generator=g)[:20]]).unique()
            vals = torch.randn(idx.numel(), generator=g, dtype=torch.float64).to(wire)
            total.index_add_(0, idx, vals)
            selections.append((vals, idx))
        buffer, ctx = codec.pack(selections)
        buffers.append(buffer)
    outs = [torch.full((l.numel,), 123.0, dtype=out_dtype) for l in layers]   # stale grads
    codec.aggregate_into(torch.cat(buffers), ctx, ranks, outs)
    for got, total in zip(outs, sums):
        assert torch.equal(got, (total / ranks).to(out_dtype))
    with pytest.raises(ValueError, match="expected 2 output tensors"):
        codec.aggregate_into(torch.cat(buffers), ctx, ranks, outs[:1])
