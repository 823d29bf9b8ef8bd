"""An index set as a bitmap of its layer, packed into int32 words.

shared_index's leader tells every rank its index sets through one integer allreduce (the
other ranks add zeros). As a list, a set of k indices takes k int32 words; as a bitmap of
its layer (bit i set when index i is in the set) it takes ⌈n/32⌉ words whatever k, so the
bitmap is the smaller message when k > n/32, i.e. below CF 32: at the paper's θmin of 10x
it sends 3.2x fewer index bytes. The words are ordinary int32 values, summed with zeros by
the allreduce, so they cross it unchanged.

Bit j of word w stands for index 32·w + j. The decoded indices are ascending, whatever
order the leader's selection had; every rank, the leader included, uses the decoded set,
so all ranks agree on the order of the values they send.

On CPU the bits are packed and unpacked with NumPy (``packbits``/``unpackbits``, then
``flatnonzero``: ~0.5 ns an entry); elsewhere (a GPU) with torch's own ops on the device.

Example::

    words = torch.zeros(bitmap_words(10), dtype=torch.int32)
    encode_into(words, torch.tensor([7, 2, 9]), 10)
    decode(words, 10)                                  # tensor([2, 7, 9])
"""
from __future__ import annotations

import numpy as np
import torch

_BITS = 32


def bitmap_words(numel: int) -> int:
    """int32 words of a bitmap over ``numel`` entries."""
    return (int(numel) + _BITS - 1) // _BITS


def cheaper_than_list(numel: int, slots: int) -> bool:
    """Whether a bitmap of a ``numel``-entry layer takes fewer words than ``slots``
    indices (a decision every rank takes alike from the plan, never from data)."""
    return bitmap_words(numel) < slots


def encode_into(words: torch.Tensor, indices: torch.Tensor, numel: int) -> None:
    """Write the bitmap of ``indices`` (distinct, each in [0, numel)) into the int32
    ``words`` (``bitmap_words(numel)`` of them, zeros on entry), in place."""
    n_words = bitmap_words(numel)
    if words.numel() != n_words or words.dtype != torch.int32:
        raise ValueError(f"a bitmap of {numel} entries takes {n_words} int32 words, got "
                         f"{words.numel()} of {words.dtype}")
    if indices.numel() == 0:
        return
    if words.device.type == "cpu" and indices.device.type == "cpu":
        mask = np.zeros(n_words * _BITS, dtype=np.bool_)
        mask[indices.numpy()] = True
        packed = np.packbits(mask, bitorder="little").view(np.int32)
        words.numpy()[:] = packed
        return
    _encode_torch(words, indices, numel)


def decode(words: torch.Tensor, numel: int) -> torch.Tensor:
    """The ascending int64 indices whose bits are set in the int32 ``words``, on
    ``words``' device."""
    n_words = bitmap_words(numel)
    if words.numel() != n_words:
        raise ValueError(f"a bitmap of {numel} entries takes {n_words} int32 words, got "
                         f"{words.numel()}")
    if words.dtype != torch.int32:   # a transport that summed them wider (values fit)
        words = words.to(torch.int32)
    if words.device.type == "cpu":
        bits = np.unpackbits(words.contiguous().numpy().view(np.uint8), count=numel,
                             bitorder="little")
        return torch.from_numpy(np.flatnonzero(bits).astype(np.int64, copy=False))
    return _decode_torch(words, numel)


def _encode_torch(words: torch.Tensor, indices: torch.Tensor, numel: int) -> None:
    """``encode_into`` with torch's ops on ``words``' device (no host round trip)."""
    n_words = bitmap_words(numel)
    mask = torch.zeros(n_words * _BITS, dtype=torch.bool, device=words.device)
    mask[indices.to(words.device)] = True
    shifts = torch.arange(_BITS, dtype=torch.int64, device=words.device)
    value = (mask.view(n_words, _BITS).to(torch.int64) << shifts).sum(dim=1)
    # Words with bit 31 set are negative int32: the same bits, two's complement.
    words.copy_(torch.where(value >= 2**31, value - 2**32, value).to(torch.int32))


def _decode_torch(words: torch.Tensor, numel: int) -> torch.Tensor:
    """``decode`` with torch's ops on ``words``' device."""
    shifts = torch.arange(_BITS, dtype=torch.int64, device=words.device)
    value = words.to(torch.int64) & 0xFFFFFFFF
    bits = ((value.unsqueeze(1) >> shifts) & 1).view(-1)[:numel]
    return bits.nonzero().view(-1)
