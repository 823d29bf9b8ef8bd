"""What the Horovod examples print at the end, for people and for the test suite: one JSON
line from rank 0 with the run's numbers and whether every rank holds rank 0's parameters."""
import json

import horovod.torch as hvd
import torch


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
