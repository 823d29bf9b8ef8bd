"""Atomic writes: a failure mid-write leaves the previous file and no temporary behind."""
import os

import pytest
import torch

from gravac.util.atomic import atomic_torch_save, atomic_write_text


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("cannot pickle this")


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "ckpt.pt"
    atomic_torch_save({"step": 1, "w": torch.ones(3)}, target)
    with pytest.raises(RuntimeError, match="cannot pickle"):
        atomic_torch_save({"step": 2, "w": torch.zeros(1000), "bad": Unpicklable()}, target)
    assert torch.load(target, weights_only=False)["step"] == 1
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt"]


def test_text_is_replaced_whole_with_a_normal_file_mode(tmp_path):
    target = tmp_path / "sub" / "report.md"
    atomic_write_text(target, "old")
    atomic_write_text(target, "new text")
    assert target.read_text() == "new text"
    mask = os.umask(0)
    os.umask(mask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~mask
