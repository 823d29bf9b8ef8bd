"""repeat_by_counts: torch.repeat_interleave's result, by a cumsum over the output."""
import pytest
import torch

from gravac.util.segments import repeat_by_counts, repeat_by_cumsum


@pytest.mark.parametrize("counts", [[2, 0, 3], [0, 0, 4], [4, 0, 0], [1] * 7, [0],
                                    [5], [3, 0, 0, 2, 0]])
def test_the_gpu_path_equals_repeat_interleave(counts):
    counts_t = torch.tensor(counts, dtype=torch.int64)
    values = torch.arange(10, 10 + len(counts), dtype=torch.int64)
    want = values.repeat_interleave(counts_t)
    got = repeat_by_cumsum(values, counts_t, int(sum(counts)))
    assert got.dtype == want.dtype and torch.equal(got, want)
    assert torch.equal(repeat_by_counts(values, counts_t, int(sum(counts))), want)


def test_long_runs_and_float_values():
    g = torch.Generator().manual_seed(0)
    counts = torch.randint(0, 50_000, (12,), generator=g)
    counts[3] = 0
    values = torch.randn(12, generator=g)
    got = repeat_by_cumsum(values, counts, int(counts.sum()))
    assert torch.equal(got, values.repeat_interleave(counts))
