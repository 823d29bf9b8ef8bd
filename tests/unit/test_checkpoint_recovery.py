"""Checkpoint recovery edges: an unreadable latest.json, a save that fails on a
full disk, pruning after a fallback from a corrupt checkpoint. One process (LocalComm)."""
import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gravac.comm.local import LocalComm
from gravac.train import checkpoint as ckpt
from gravac.train.checkpoint import (CheckpointError, has_checkpoint, load_checkpoint,
                                     save_checkpoint)

REPO = Path(__file__).resolve().parents[2]
COMM = LocalComm()


def _save(run_dir, step, keep=2):
    common = {"model": {"w": torch.tensor([float(step)])}, "scheduler": {}, "step": step}
    rank_state = {"optimizer": {}, "rng": {}, "task": {}}
    return save_checkpoint(run_dir, step, common, rank_state, COMM, keep=keep)


def _folders(run_dir):
    return sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))


def test_unreadable_latest_json_falls_back_to_the_newest_step_folder(tmp_path):
    _save(tmp_path, 100)
    _save(tmp_path, 200)
    (tmp_path / "checkpoints/latest.json").write_text('{"step": 2')      # cut mid-write
    said = []
    assert has_checkpoint(tmp_path)
    common, _, info = load_checkpoint(tmp_path, COMM, log=said.append)
    assert common["step"] == 200 and info == {"step": 200, "dir": "step_00000200",
                                              "world_size": 1}
    assert said == [f"{tmp_path / 'checkpoints/latest.json'} is unreadable; trying the step "
                    "folders, newest first (step_00000200, step_00000100)"]
    # a corrupt newest folder too: the scan goes on to the older one
    (tmp_path / "checkpoints/step_00000200/common.pt").write_bytes(b"junk")
    common, _, _ = load_checkpoint(tmp_path, COMM, log=said.append)
    assert common["step"] == 100


def test_a_save_that_fails_on_a_full_disk_leaves_nothing_and_says_so(tmp_path, monkeypatch):
    _save(tmp_path, 100)
    real = ckpt.atomic_torch_save

    def full_disk(obj, path):
        if Path(path).name == "common.pt":         # the rank file was written already
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(obj, path)

    monkeypatch.setattr(ckpt, "atomic_torch_save", full_disk)
    with pytest.raises(CheckpointError) as err:
        _save(tmp_path, 200)
    assert str(err.value) == (
        f"no space left on the device while writing {tmp_path}/checkpoints/step_00000200/"
        "common.pt: the checkpoint of step 200 was not written (the previous one is kept); "
        "free space, or lower run.keep_checkpoints")
    assert _folders(tmp_path) == ["step_00000100"]            # no partial step_00000200
    assert json.loads((tmp_path / "checkpoints/latest.json").read_text())["step"] == 100
    assert not list((tmp_path / "checkpoints").rglob("*.tmp"))
    monkeypatch.setattr(ckpt, "atomic_torch_save", real)
    _save(tmp_path, 300)                                      # the next save works
    assert _folders(tmp_path) == ["step_00000100", "step_00000300"]


def test_pruning_after_a_fallback_keeps_the_good_checkpoint(tmp_path):
    for step in (100, 200, 300):
        _save(tmp_path, step)
    assert _folders(tmp_path) == ["step_00000200", "step_00000300"]
    (tmp_path / "checkpoints/step_00000300/common.pt").write_bytes(b"junk")
    common, _, _ = load_checkpoint(tmp_path, COMM, log=lambda text: None)
    assert common["step"] == 200                              # fell back
    _save(tmp_path, 250)                                      # the resumed run saves again
    # the corrupt 300 (from before the fallback) goes, the good 200 stays
    assert _folders(tmp_path) == ["step_00000200", "step_00000250"]


def test_no_readable_checkpoint_is_a_checkpoint_error_and_says_none_is_left(tmp_path):
    _save(tmp_path, 100, keep=1)
    (tmp_path / "checkpoints/step_00000100/common.pt").write_bytes(b"junk")
    said = []
    # Before: a RuntimeError (a traceback on every rank) after "trying an earlier one".
    with pytest.raises(CheckpointError, match=r"no readable checkpoint in .* \(tried "
                                              r"step_00000100\); start a new run"):
        load_checkpoint(tmp_path, COMM, log=said.append)
    assert said[-1].endswith("is unreadable on rank(s) [0]")


def test_a_scanned_folder_whose_save_stopped_short_of_a_rank_is_skipped(tmp_path):
    # 2 ranks saved step 450; at step 460 rank 1's file was never written, and latest.json
    # is cut: the scan saw one rank file and took 460 for a 1-rank job's checkpoint.
    rank_state = {"optimizer": {}, "rng": {}, "task": {}}
    for step, ranks in ((450, (0, 1)), (460, (0,))):
        folder = tmp_path / "checkpoints" / f"step_{step:08d}"
        folder.mkdir(parents=True)
        torch.save({"model": {}, "scheduler": {}, "step": step, "world_size": 2},
                   folder / "common.pt")
        for r in ranks:
            torch.save(rank_state, folder / f"rank_{r:05d}.pt")
    (tmp_path / "checkpoints/latest.json").write_text('{"step": 45')
    # Rank 1 of the 2-rank job resuming: its file at 460 is missing (the ranks then agree to
    # skip 460); before, the scan's world size of 1 made rank 1 a rank without a file.
    assert ckpt._read(tmp_path / "checkpoints/step_00000460", 1, 1)[1] == \
        "rank_00001.pt is missing"
    assert ckpt._read(tmp_path / "checkpoints/step_00000450", 1, 1)[1] is None
    # The world size a resume is checked against is common.pt's, not the scan's guess of 1
    # (which sent a 2-rank run to "run it with 1 ranks").
    _, _, info = load_checkpoint(tmp_path, COMM, log=lambda _: None)
    assert info == {"step": 460, "dir": "step_00000460", "world_size": 2}


def test_cli_full_disk_is_one_line(tmp_path):
    """A launched run whose checkpoint write fails with ENOSPC exits 1 with one line."""
    code = ("import errno, sys\n"
            "import gravac.train.checkpoint as c\n"
            "def full(obj, path):\n"
            "    raise OSError(errno.ENOSPC, 'No space left on device')\n"
            "c.atomic_torch_save = full\n"
            "from gravac.train.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    proc = subprocess.run([sys.executable, "-c", code, "--config", "configs/demo.yaml",
                           "--set", f"run.output_dir={tmp_path}", "--set", "run.steps=5",
                           "--set", "run.backend=local", "--set", "run.report=false",
                           "--set", "run.progress=never"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("checkpoint error: no space left on the "
                                                   "device while writing")
