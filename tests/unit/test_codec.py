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


# -- coded index fields (index_coding, the allgather_coded exchange) ----------------------------
def _coded_case(dtype, seed):
    """Three ranks' selections over layers that take each field kind: raw int32 (5 of
    100k), low bits 8 (CF 10 of 100k) and low bits 16 (CF 1000 of 3M); indices in random
    order with their values, an empty layer on one rank, and entries picked by several."""
    layers = [SparseLayer("few", 100_000, dtype), SparseLayer("cf10", 100_000, dtype),
              SparseLayer("cf1000", 3_000_000, dtype)]
    g = torch.Generator().manual_seed(seed)
    perms = [torch.randperm(layer.numel, generator=g) for layer in layers]
    ranks = []
    for r in range(3):
        sel = []
        for layer, perm, k in zip(layers, perms, (5, 10_000, 3_000)):
            k = 0 if (r, layer.name) == (1, "few") else k
            # distinct within a rank; rank 2 shares a quarter of rank 0's, in another order
            own = perm[r * k:(r + 1) * k] if r < 2 else torch.cat([perm[:k // 4],
                                                                  perm[2 * k:3 * k - k // 4]])
            idx = own[torch.randperm(k, generator=g)]
            sel.append((torch.randn(k, generator=g).to(dtype), idx))
        ranks.append(sel)
    return layers, ranks


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_coded_indices_aggregate_exactly_as_int32_indices(dtype):
    layers, ranks = _coded_case(dtype, seed=5)
    plain, coded = SparseCodec(layers), SparseCodec(layers, index_coding=True)
    bufs = [coded.pack(sel)[0] for sel in ranks]
    ctx = coded.context()
    assert ctx.index_coding and all(b.numel() % 8 == 0 for b in bufs)
    want = plain.aggregate(torch.cat([plain.pack(sel)[0] for sel in ranks]), plain.context(), 3)
    got = coded.aggregate(torch.cat(bufs), ctx, 3)
    assert torch.equal(got, want)
    # Each rank's own pairs come back, ascending, with their own values.
    for sel, (counts, values, indices) in zip(ranks, coded.unpack(torch.cat(bufs), ctx)):
        for (v, i), vals, idx in zip(sel, values.split(counts), indices.split(counts)):
            order = i.argsort()
            assert torch.equal(idx, i[order]) and torch.equal(vals, v[order].to(vals.dtype))


def test_coded_chunks_are_the_header_values_and_each_layers_planned_field():
    from gravac.engine import index_codec
    layers, ranks = _coded_case(torch.float32, seed=6)
    coded, plain = SparseCodec(layers, index_coding=True), SparseCodec(layers)
    buf, _ = coded.pack(ranks[0])
    counts = [i.numel() for _, i in ranks[0]]
    fields = [index_codec.plan(l.numel, c) for l, c in zip(layers, counts)]
    assert [f.low_bits for f in fields] == [0, 8, 16]
    values = -(-4 * sum(counts) // 8) * 8
    assert buf.numel() == 8 * (4 + len(layers)) + values + sum(f.nbytes for f in fields)
    # The index section: 5 raw, 10,000 of 100k at ~1.08 bytes, 3,000 of 3M at ~2.06,
    # against int32's 4 bytes each (the values and the header are the same size).
    assert sum(f.nbytes for f in fields) < 0.35 * 4 * sum(counts)
    assert plain.pack(ranks[0])[0].numel() - buf.numel() \
        == -(-4 * sum(counts) // 8) * 8 - sum(f.nbytes for f in fields)
    # Equal counts on every rank (an exact-count compressor): equal chunks, so the
    # headers are read in one copy (same_size) and the sums are the same.
    again, _ = coded.pack([(v * 2, i) for v, i in ranks[0]])
    assert again.numel() == buf.numel()
    assert torch.equal(coded.aggregate(torch.cat([buf, again]), coded.context(), 2, same_size=True),
                       coded.aggregate(torch.cat([buf, again]), coded.context(), 2))


def test_a_coded_and_a_plain_chunk_do_not_mix():
    layers, ranks = _coded_case(torch.float32, seed=7)
    coded, plain = SparseCodec(layers, index_coding=True), SparseCodec(layers)
    mixed = torch.cat([coded.pack(ranks[0])[0], plain.pack(ranks[1])[0]])
    with pytest.raises(RuntimeError, match="formats"):
        coded.aggregate(mixed, coded.context(), 2)
    with pytest.raises(RuntimeError, match="formats"):
        plain.aggregate(mixed, plain.context(), 2)
