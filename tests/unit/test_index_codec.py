"""index_codec: shared_index's index sets in fewer bytes, rebuilt exactly on every rank."""
import pytest
import torch

from gravac.engine import index_codec
from gravac.engine.index_codec import IndexField, ascending, decode, encode, plan


def _field(numel: int, capacity: int, low_bits: int) -> IndexField:
    """A field of the given kind, sized as plan sizes it (to test every kind directly)."""
    if low_bits == 0:
        return IndexField(numel, capacity, 0, index_codec._pad8(4 * capacity))
    counts, low = index_codec._PARTS[low_bits]
    blocks = -(-numel // (1 << low_bits))
    return IndexField(numel, capacity, low_bits, index_codec._pad8(blocks * counts.itemsize)
                      + index_codec._pad8(capacity * low.itemsize))


def _round_trip(field: IndexField, idx: torch.Tensor) -> torch.Tensor:
    data = torch.zeros(field.nbytes, dtype=torch.uint8)
    encode(field, idx, data)
    return decode(field, data, idx.numel())


EDGES = [0, 1, 255, 256, 257, 32767, 32768, 65535, 65536, 65537, 131071, 199_998, 199_999]


@pytest.mark.parametrize("low_bits", [0, 8, 16])
def test_every_kind_rebuilds_the_indices_exactly(low_bits):
    numel = 200_000
    g = torch.Generator().manual_seed(low_bits)
    rand = torch.randperm(numel, generator=g)[:5000]
    idx = ascending(torch.cat([rand, torch.tensor(EDGES)]).unique())
    field = _field(numel, idx.numel() + 7, low_bits)          # spare slots stay unused
    assert torch.equal(_round_trip(field, idx), idx)
    assert torch.equal(_round_trip(field, idx[:0]), idx[:0])   # an empty set
    # decode into a slice of a larger int32 / int64 tensor (the allgather's chunks)
    data = torch.zeros(field.nbytes, dtype=torch.uint8)
    encode(field, idx, data)
    for dtype in (torch.int32, torch.int64):
        whole = torch.full((idx.numel() + 4,), -1, dtype=dtype)
        got = decode(field, data, idx.numel(), out=whole[2:-2])
        assert got.data_ptr() == whole[2:].data_ptr() and got.dtype == dtype
        assert torch.equal(whole[2:-2].long(), idx) and whole[:2].eq(-1).all() \
            and whole[-2:].eq(-1).all()


@pytest.mark.parametrize("numel,capacity", [(2_560_000, 256_000), (2_560_000, 2_560),
                                            (1536, 154), (100, 100), (1000, 1000)])
def test_plan_takes_the_smallest_field_and_it_round_trips(numel, capacity):
    field = plan(numel, capacity)
    sizes = {bits: _field(numel, capacity, bits).nbytes for bits in (0, 8, 16)}
    assert field.nbytes == min(sizes.values()) and field.nbytes % 8 == 0
    assert sizes[field.low_bits] == field.nbytes
    idx = ascending(torch.randperm(numel, generator=torch.Generator().manual_seed(1))[:capacity])
    assert torch.equal(_round_trip(field, idx), idx)


def test_sizes_of_the_lstm_output_layer_at_cf_10_and_1000():
    # 2.56M entries: at CF 10, 10,000 int16 block counts + 256k low bytes (1.08 B/index
    # against int32's 4); at CF 1000, 40 int32 counts + 2,560 int16 low halves.
    assert plan(2_560_000, 256_000) == IndexField(2_560_000, 256_000, 8, 20_000 + 256_000)
    assert plan(2_560_000, 2_560) == IndexField(2_560_000, 2_560, 16, 160 + 5_120)
    assert plan(10, 0).nbytes == 0


def test_fields_written_by_different_ranks_survive_an_int32_sum():
    # What the allreduce does: each leader writes its own fields, zeros elsewhere.
    a, b = plan(70_000, 7_000), plan(3_000_000, 30_000)
    g = torch.Generator().manual_seed(2)
    idx_a = ascending(torch.randperm(a.numel, generator=g)[:6_999])
    idx_b = ascending(torch.randperm(b.numel, generator=g)[:30_000])
    bufs = [torch.zeros(a.nbytes + b.nbytes, dtype=torch.uint8) for _ in range(3)]
    encode(a, idx_a, bufs[0][:a.nbytes])
    encode(b, idx_b, bufs[2][a.nbytes:])
    total = torch.stack([x.view(torch.int32) for x in bufs]).sum(0, dtype=torch.int32)
    summed = total.view(torch.uint8)
    assert torch.equal(decode(a, summed[:a.nbytes], idx_a.numel()), idx_a)
    assert torch.equal(decode(b, summed[a.nbytes:], idx_b.numel()), idx_b)


def test_bad_input_is_refused():
    field = plan(1000, 10)
    with pytest.raises(ValueError, match="do not fit"):
        encode(field, torch.arange(11), torch.zeros(field.nbytes, dtype=torch.uint8))
    eight = _field(1000, 10, 8)
    data = torch.zeros(eight.nbytes, dtype=torch.uint8)
    encode(eight, torch.arange(5), data)
    with pytest.raises(ValueError, match="add up to 5, not 6"):
        decode(eight, data, 6)
    with pytest.raises(ValueError, match="numel and capacity"):
        plan(-1, 3)


def test_ascending_sorts_like_torch():
    idx = torch.randperm(100_000, generator=torch.Generator().manual_seed(3))[:9_000]
    assert torch.equal(ascending(idx), torch.sort(idx).values)
    assert torch.equal(ascending(idx.to(torch.int32)), torch.sort(idx).values)
    done = torch.sort(idx).values                       # ascending already: kept as is
    assert ascending(done).data_ptr() == done.data_ptr()
    twice = torch.tensor([1, 4, 4, 9])                  # not strictly: sorted (a no-op)
    assert torch.equal(ascending(twice), twice)


def test_decode_refuses_an_output_that_does_not_fit():
    field = plan(1000, 10)
    data = torch.zeros(field.nbytes, dtype=torch.uint8)
    with pytest.raises(ValueError, match="out must hold 10 int32 or int64"):
        decode(field, data, 10, out=torch.empty(9, dtype=torch.int32))
    with pytest.raises(ValueError, match="out must hold 10 int32 or int64"):
        decode(field, data, 10, out=torch.empty(10, dtype=torch.int16))
