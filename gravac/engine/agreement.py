"""Start-up agreement: every rank must run the same compression set-up.

Ranks that disagree on the compressor, the controller, ``min_compress_numel`` or the
parameters (names, shapes, dtypes) would issue different collectives and hang, or silently
mix unrelated tensors. So when the optimizer is created, the ranks compare a hash of their
set-up (one small allgather); on a mismatch they exchange the full descriptions and every
rank raises the same ``ValueError`` naming the differing fields and ranks, before the
first step.

Example::

    check_agreement({"controller": {"cf": 100.0}, ...}, comm)
    # ValueError: ranks disagree on the gravac set-up: controller.cf: rank 0 has 100.0,
    #             rank 1 has 10.0 ...
"""
from __future__ import annotations

import hashlib
import json

import torch

from ..comm import Comm
from ..comm.base import _one_hot


def _encode(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, default=str).encode("utf-8")


def _gather_bytes(data: bytes, comm: Comm, name: str) -> list[bytes]:
    """Every rank's ``data`` (the byte allgather with per-rank sizes)."""
    mine = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)
    sizes = [int(n) for n in comm.allreduce(_one_hot(len(data), comm), op="sum",
                                            name=f"{name}.sizes").tolist()]
    flat = comm.allgather_bytes(mine, name=f"{name}.data")
    out, pos = [], 0
    for size in sizes:
        out.append(bytes(flat[pos:pos + size].tolist()))
        pos += size
    return out


def _flatten(obj, prefix: str = "") -> dict[str, str]:
    """Nested dicts/lists as {"a.b[2]": value} for field-by-field comparison."""
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(obj, list):
        out = {}
        for i, value in enumerate(obj):
            out.update(_flatten(value, f"{prefix}[{i}]"))
        out[f"{prefix}.length"] = str(len(obj))
        return out
    return {prefix: json.dumps(obj, default=str)}


def describe_differences(descriptions: list[dict], limit: int = 8) -> list[str]:
    """Fields where some rank differs from rank 0, as readable lines."""
    flat = [_flatten(d) for d in descriptions]

    def order(key: str):
        # A differing name explains its options' differences: list it first.
        parent, _, leaf = key.rpartition(".")
        return parent, leaf != "name", key

    keys = sorted(set().union(*flat), key=order)
    lines = []
    for key in keys:
        values = [f.get(key, "<missing>") for f in flat]
        if len(set(values)) == 1:
            continue
        groups: dict[str, list[int]] = {}
        for rank, value in enumerate(values):
            groups.setdefault(value, []).append(rank)
        parts = [f"rank{'s' if len(r) > 1 else ''} {','.join(map(str, r))} "
                 f"{'have' if len(r) > 1 else 'has'} {v}" for v, r in groups.items()]
        lines.append(f"{key}: " + "; ".join(parts))
        if len(lines) == limit:
            lines.append("...")
            break
    return lines


def check_agreement(description: dict, comm: Comm, name: str = "gravac.agree") -> None:
    """Collective: raise ValueError on every rank unless all ranks' descriptions match."""
    if comm.size == 1:
        return
    payload = _encode(description)
    digest = torch.frombuffer(bytearray(hashlib.sha256(payload).digest()), dtype=torch.uint8)
    digests = comm.allgather_bytes(digest, name=f"{name}.hash")
    if bool((digests.view(-1, 32) == digest).all()):
        return
    everyone = [json.loads(b) for b in _gather_bytes(payload, comm, name)]
    lines = describe_differences(everyone)
    raise ValueError("ranks disagree on the gravac set-up (every rank must build the same model, "
                     "compressor and controller):\n  " + "\n  ".join(lines))
