"""SIGTERM / SIGINT stop a run cleanly: every rank agrees at a step boundary,
a checkpoint is written at that step, the line says where, the job exits non-zero and
--resume continues from there. Launches its own 2-rank jobs, under horovodrun and torchrun."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs import LAUNCHERS, REPO, launch_train, rank_pid, read_records


def _train(launcher: str, out: Path, name: str, steps: int, *extra: str) -> list[str]:
    # checkpoint_interval 0: only the end of the run checkpoints, so any earlier
    # checkpoint was written because of the signal
    return [*launch_train(launcher), "--config", "configs/demo.yaml", "--set", f"run.output_dir={out}",
            "--set", f"run.name={name}", "--set", f"run.steps={steps}",
            "--set", "run.checkpoint_interval=0", "--set", "run.eval_interval=0",
            "--set", "run.log_interval=1", "--set", "run.progress=never",
            "--set", "run.report=false", *extra]


def _last_step(run_dir: Path) -> int:
    steps = [r["step"] for r in read_records(run_dir / "metrics.jsonl") if r["kind"] == "step"]
    return max(steps, default=0)


def _wait_for_step(job: subprocess.Popen, run_dir: Path, step: int) -> None:
    """Until the running job logged ``step`` (300 s: a guard against a broken set-up, not a
    speed limit)."""
    deadline = time.time() + 300
    while _last_step(run_dir) < step and time.time() < deadline and job.poll() is None:
        time.sleep(0.2)
    assert job.poll() is None, job.stdout.read()


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_sigterm_to_one_rank_checkpoints_on_every_rank_and_resume_continues(tmp_path, launcher):
    """A scheduler's SIGTERM reaching one rank only (rank 1): both ranks stop at the same
    step boundary and write the checkpoint together."""
    name = f"stopped_{launcher}"    # unique: the pid lookups go by run.name
    run_dir = tmp_path / name
    job = subprocess.Popen(_train(launcher, tmp_path, name, 1_000_000), cwd=REPO,
                           start_new_session=True, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for_step(job, run_dir, 10)
        pid = rank_pid(f"run.name={name}", 1)
        assert pid is not None, "rank 1 not found"
        os.kill(pid, signal.SIGTERM)
        code = job.wait(timeout=300)
        output = job.stdout.read()
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert code != 0, output[-3000:]
    latest = json.loads((run_dir / "checkpoints/latest.json").read_text())
    step = latest["step"]
    assert step >= 10 and latest["world_size"] == 2
    assert sorted(p.name for p in (run_dir / "checkpoints" / latest["dir"]).iterdir()) == [
        "common.pt", "rank_00000.pt", "rank_00001.pt"]
    assert (f"interrupted by SIGTERM at step {step}: checkpoint saved to "
            f"{run_dir / 'checkpoints' / latest['dir']}; continue with --resume") in output
    assert "SIGTERM: stopping after the step in flight" in output
    resumed = subprocess.run(_train(launcher, tmp_path, name, step + 10) + ["--resume"], cwd=REPO,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"resuming from step {step}" in resumed.stdout
    assert json.loads((run_dir / "checkpoints/latest.json").read_text())["step"] == step + 10


def test_ctrl_c_to_horovodrun_with_slow_steps_still_leaves_a_checkpoint(tmp_path):
    """A terminal's Ctrl-C reaches horovodrun alone (its ranks run in sessions of their
    own); horovodrun signals the ranks with SIGTERM and kills them 5 s later. With steps of
    about a second the ranks check for a signal at every step, so they stop after the step
    in flight and write the checkpoint in time (checking every 10 steps, they were killed
    first: no checkpoint)."""
    name = "slow_steps"
    run_dir = tmp_path / name
    job = subprocess.Popen(_train("horovodrun", tmp_path, name, 1_000_000,
                                  "--set", "model.name=resnet18", "--set", "data.batch_size=64"),
                           cwd=REPO, start_new_session=True, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for_step(job, run_dir, 3)
        os.kill(job.pid, signal.SIGINT)                  # horovodrun itself
        job.wait(timeout=300)
        output = job.stdout.read()
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    latest = json.loads((run_dir / "checkpoints/latest.json").read_text())
    assert latest["step"] >= 3 and latest["world_size"] == 2
    assert f"interrupted by SIGTERM at step {latest['step']}: checkpoint saved" in output, \
        output[-3000:]


def _local_job_past(tmp_path: Path, name: str, step: int) -> subprocess.Popen:
    """A one-process train.py (run.backend=local) of endless steps, once it has logged
    ``step`` (or ended, or 300 s passed: a guard against a broken set-up)."""
    run_dir = tmp_path / name
    job = subprocess.Popen([sys.executable, "train.py", "--config", "configs/demo.yaml",
                            "--set", f"run.output_dir={tmp_path}", "--set", f"run.name={name}",
                            "--set", "run.steps=1000000", "--set", "run.backend=local",
                            "--set", "run.log_interval=1", "--set", "run.progress=never",
                            "--set", "run.report=false", "--set", "run.eval_interval=0"],
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    while _last_step(run_dir) < step and time.time() < deadline and job.poll() is None:
        time.sleep(0.1)
    return job


def test_sigint_exits_130_with_a_checkpoint(tmp_path):
    """One process (run.backend=local), Ctrl-C: a checkpoint and exit code 130."""
    run_dir = tmp_path / "ctrlc"
    job = _local_job_past(tmp_path, "ctrlc", 10)
    job.send_signal(signal.SIGINT)
    code = job.wait(timeout=300)
    output = job.stdout.read()
    assert code == 130, output[-3000:]
    step = json.loads((run_dir / "checkpoints/latest.json").read_text())["step"]
    assert f"interrupted by SIGINT at step {step}" in output and step >= 10


def test_a_second_signal_exits_at_once():
    """The first signal is only noted; the second ends the process with 128 + its number."""
    code = ("import os, signal, time\n"
            "from gravac.train.signals import StopSignal\n"
            "stop = StopSignal(rank=3).install()\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "time.sleep(0.2)\n"
            "print('noted', stop.signum, flush=True)\n"
            "os.kill(os.getpid(), signal.SIGINT)\n"
            "time.sleep(30)\n"
            "print('still running', flush=True)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 130
    assert proc.stdout == f"noted {int(signal.SIGTERM)}\n"
    assert "[rank 3] SIGTERM: stopping after the step in flight" in proc.stderr
    assert "[rank 3] second SIGINT: exiting now, without a checkpoint" in proc.stderr


def test_a_rank_that_dies_in_native_code_prints_its_python_stacks(tmp_path):
    """SIGABRT (what a C++ abort raises) to a running train.py: faulthandler prints where
    every thread was before the process dies of the signal."""
    for attempt in range(3):
        job = _local_job_past(tmp_path, f"abort{attempt}", 3)
        job.send_signal(signal.SIGABRT)
        code = job.wait(timeout=300)
        output = job.stdout.read()
        # faulthandler reads the other threads' frames while they run (TensorBoard's
        # writer threads): now and then that read itself crashes, mid-dump. CPython's
        # limit, not the handler's: try again.
        if not (code == -signal.SIGSEGV and "Fatal Python error: Aborted" in output):
            break
    assert code == -signal.SIGABRT, output[-3000:]
    assert "Fatal Python error: Aborted" in output, output[-3000:]
    assert "train.py" in output.split("Fatal Python error: Aborted", 1)[1]
