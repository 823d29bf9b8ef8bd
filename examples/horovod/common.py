"""What the Horovod examples share: their synthetic data (no downloads) and what they print
at the end, for people and for the test suite: one JSON line from rank 0 with the run's
numbers and whether every rank holds rank 0's parameters."""
import json

import horovod.torch as hvd
import torch
import torch.utils.data


def synthetic_classes(samples: int, shape: tuple[int, ...], seed: int,
                      classes: int = 10) -> torch.utils.data.TensorDataset:
    """Inputs of ``shape``: one fixed random pattern per class (the same in every split),
    plus noise drawn from ``seed``; learnable, with no files."""
    patterns = torch.randn(classes, *shape, generator=torch.Generator().manual_seed(1234))
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (samples,), generator=g)
    return torch.utils.data.TensorDataset(
        patterns[labels] + torch.randn(samples, *shape, generator=g), labels)


def ranks_agree(model: torch.nn.Module) -> list[bool]:
    """For every rank: are its parameters bit for bit rank 0's?"""
    flat = torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])
    rows = hvd.allgather(flat.unsqueeze(0), name="example.params")
    return [bool(torch.equal(rows[0], row)) for row in rows]


def print_result(example: str, model: torch.nn.Module, **numbers) -> None:
    """Rank 0 prints ``{"example": ..., "world_size": ..., "params_equal_rank0": [...], ...}``
    (collective: call it on every rank)."""
    agree = ranks_agree(model)
    if hvd.rank() == 0:
        print(json.dumps({"example": example, "world_size": hvd.size(),
                          "params_equal_rank0": agree, **numbers}), flush=True)
