"""index_bitmap: an index set as int32 words of a bitmap. Exact round trips on both code
paths (NumPy on CPU, torch's own ops for other devices, called here on CPU tensors), the
two paths' words identical bit for bit, and the bit layout written out by hand."""
import pytest
import torch

from gravac.engine import index_bitmap as ib


def _random_set(numel: int, fraction: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(numel * 7 + int(fraction * 100))
    return torch.randperm(numel, generator=g)[:int(numel * fraction)]


@pytest.mark.parametrize("numel", [1, 5, 31, 32, 33, 100, 1000, 4097, 100_003])
@pytest.mark.parametrize("fraction", [0.0, 0.01, 0.1, 0.5, 1.0])
def test_both_paths_round_trip_to_the_ascending_set_with_the_same_words(numel, fraction):
    idx = _random_set(numel, fraction)
    words = torch.zeros(ib.bitmap_words(numel), dtype=torch.int32)
    ib.encode_into(words, idx, numel)                     # CPU: NumPy
    device_words = torch.zeros_like(words)
    ib._encode_torch(device_words, idx, numel)             # what a GPU runs
    assert torch.equal(words, device_words)
    expected = idx.sort().values
    for back in (ib.decode(words, numel), ib._decode_torch(words, numel)):
        assert back.dtype == torch.int64
        assert torch.equal(back, expected)


def test_bit_j_of_word_w_is_index_32w_plus_j():
    words = torch.zeros(ib.bitmap_words(70), dtype=torch.int32)
    ib.encode_into(words, torch.tensor([0, 31, 32, 63, 69]), 70)
    # bit 31 set makes an int32 negative: the same bits in two's complement
    assert words.tolist() == [1 - 2**31, 1 - 2**31, 1 << 5]
    # a sum with zeros (the other ranks' share of shared_index's allreduce) keeps them
    assert torch.equal(ib.decode(words + torch.zeros_like(words), 70),
                       torch.tensor([0, 31, 32, 63, 69]))


def test_a_bitmap_is_chosen_only_where_it_takes_fewer_words_than_the_list():
    assert ib.bitmap_words(1000) == 32
    assert ib.cheaper_than_list(1000, 33) and not ib.cheaper_than_list(1000, 32)
    assert ib.cheaper_than_list(3200, 320)          # CF 10: 100 words against 320
    assert not ib.cheaper_than_list(3200, 32)       # CF 100: 100 words against 32


def test_wrong_word_counts_are_refused_with_the_sizes():
    with pytest.raises(ValueError, match="70 entries takes 3 int32 words, got 2"):
        ib.encode_into(torch.zeros(2, dtype=torch.int32), torch.tensor([1]), 70)
    with pytest.raises(ValueError, match="takes 3 int32 words"):
        ib.decode(torch.zeros(4, dtype=torch.int32), 70)
