"""A real full disk: a small tmpfs, not a faked OSError. torch reports ENOSPC
as "RuntimeError: [enforce fail at inline_container.cc:...]"; checkpoints and metrics must
still end in one line, with no partial checkpoint folder and the earlier checkpoints kept.
Needs root (to mount); skipped with the reason otherwise."""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from gravac.comm.local import LocalComm
from gravac.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from gravac.train.cli import main

REPO = Path(__file__).resolve().parents[2]
COMM = LocalComm()


@pytest.fixture
def small_disk():
    """``small_disk(kib)``: the path of a fresh tmpfs of that size, unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mounts = []

    def mount(kib: int) -> Path:
        where = Path(tempfile.mkdtemp(prefix="gravac-full-disk-"))
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs",
                               str(where)], capture_output=True, text=True)
        if done.returncode != 0:
            where.rmdir()
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounts.append(where)
        return where

    yield mount
    for where in mounts:
        if subprocess.run(["umount", str(where)]).returncode != 0:
            subprocess.run(["umount", "-l", str(where)])     # a file still open: detach
        where.rmdir()


def _save(run_dir, step, numel):
    common = {"model": {"w": torch.zeros(numel)}, "scheduler": {}, "step": step}
    rank_state = {"optimizer": {}, "rng": {}, "task": {}}
    return save_checkpoint(run_dir, step, common, rank_state, COMM, keep=2)


def _folders(run_dir):
    return sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))


def test_a_checkpoint_larger_than_the_disk_leaves_no_folder_and_says_the_disk_is_full(small_disk):
    run_dir = small_disk(256) / "run"
    _save(run_dir, 100, numel=1000)                       # 4 KB: fits
    with pytest.raises(CheckpointError) as err:
        _save(run_dir, 200, numel=1_000_000)              # 4 MB on a 256 KiB disk
    assert str(err.value) == (
        f"no space left on the device while writing {run_dir}/checkpoints/step_00000200/"
        "common.pt: the checkpoint of step 200 was not written (the previous one is "
        "kept); free space, or lower run.keep_checkpoints")
    assert _folders(run_dir) == ["step_00000100"]           # no partial step_00000200
    assert json.loads((run_dir / "checkpoints/latest.json").read_text())["step"] == 100
    assert not list(run_dir.rglob("*.tmp"))
    common, _, _ = load_checkpoint(run_dir, COMM, log=lambda text: None)
    assert common["step"] == 100
    _save(run_dir, 300, numel=1000)                       # the disk has room again
    assert _folders(run_dir) == ["step_00000100", "step_00000300"]


def test_train_py_on_a_disk_too_small_for_its_checkpoint_ends_in_one_line(small_disk, capsys):
    disk = small_disk(64)          # config, metrics and events fit; the ~200 KB checkpoint not
    code = main(["--config", str(REPO / "configs/demo.yaml"), "--set", f"run.output_dir={disk}",
                 "--set", "run.steps=3", "--set", "run.backend=local", "--set",
                 "run.report=false", "--set", "run.progress=never"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert err.splitlines() == [
        f"checkpoint error: no space left on the device while writing {disk}/demo/checkpoints/"
        "step_00000003/rank_00000.pt: the checkpoint of step 3 was not written (the previous "
        "one is kept); free space, or lower run.keep_checkpoints"]
    assert not list((disk / "demo").rglob("step_*"))
    assert not list((disk / "demo").rglob("*.tmp"))


METRICS_ON_A_FULL_DISK = """
import sys
from pathlib import Path
import torch
from gravac.comm.local import LocalComm
from gravac.train.checkpoint import save_checkpoint
from gravac.train.monitor import MetricsError, RunLogger

run_dir = Path(sys.argv[1])
log = RunLogger(run_dir, enabled=True, total_steps=1000, progress="never")
log.record({"kind": "step", "step": 1, "loss": 2.0})
save_checkpoint(run_dir, 1, {"model": {"w": torch.zeros(1000)}, "scheduler": {}, "step": 1},
                {"optimizer": {}, "rng": {}, "task": {}}, LocalComm())
with open(run_dir.parent / "filler", "wb", buffering=0) as f:    # fill the disk
    try:
        while True:
            f.write(bytes(4096))
    except OSError:
        pass
try:            # the last page of metrics.jsonl may hold a few more lines: write until full
    for step in range(2, 100_000):
        log.record({"kind": "step", "step": step, "loss": 2.0, "pad": "x" * 200})
except MetricsError as exc:
    print(f"metrics error: {exc}")
log.close()                              # nothing more to say, no raise
log.record({"kind": "step", "step": 0})  # nor after it stopped
"""


def test_a_full_disk_while_writing_metrics_stops_in_one_line_and_keeps_the_checkpoints(
        small_disk):
    """In a process of its own: TensorBoard's writer thread and exit hook, which retry the
    write that failed, must not print tracebacks after the line either."""
    run_dir = small_disk(512) / "run"
    done = subprocess.run([sys.executable, "-c", METRICS_ON_A_FULL_DISK, str(run_dir)],
                          cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    *before, said = done.stdout.splitlines()
    step = int(said.split("the run stops at step ")[1].split()[0])
    assert said == (
        f"metrics error: no space left on the device while writing {run_dir}/metrics.jsonl: "
        f"the run stops at step {step} (its checkpoint of step 1 is kept: free space, then "
        "continue with --resume)")
    # TensorBoard's events are given up with one line when some were still unwritten
    assert all(line.startswith(f"TensorBoard events in {run_dir}/tensorboard may lack their "
                               "last steps") for line in before) and len(before) <= 1
    (run_dir.parent / "filler").unlink()
    common, _, info = load_checkpoint(run_dir, COMM, log=lambda text: None)
    assert common["step"] == 1 and info["dir"] == "step_00000001"
    assert json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])["step"] == 1
