"""One run at a time per run folder: a second run, with run.overwrite=true or
not, is refused in one line before it deletes anything; a killed run leaves no stale lock;
run.name may not leave run.output_dir."""
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gravac.train.config import ConfigError, load_config
from gravac.train.loop import train

REPO = Path(__file__).resolve().parents[2]
LOCAL = ["run.backend=local", "run.progress=never", "run.report=false", "run.threads=1"]


def _steps_logged(run_dir: Path) -> int:
    """Step records in the run's metrics.jsonl so far (a line being written is skipped)."""
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return 0
    count = 0
    for line in lines:
        try:
            count += json.loads(line)["kind"] == "step"
        except ValueError:
            pass
    return count


def test_a_second_run_on_a_folder_in_use_is_refused_before_it_deletes_anything(tmp_path):
    run_dir = tmp_path / "shared"
    sets = [f"run.output_dir={tmp_path}", "run.name=shared", *LOCAL]
    first = subprocess.Popen(
        [sys.executable, "train.py", "--config", "configs/demo.yaml", "--set",
         "run.steps=1000000", "--set", "run.log_interval=1", "--set",
         "run.checkpoint_interval=0", *[a for s in sets for a in ("--set", s)]],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while first.poll() is None and _steps_logged(run_dir) < 2:   # it trains
            time.sleep(0.2)
        assert first.poll() is None, first.stderr.read()
        second = load_config([str(REPO / "configs/demo.yaml")],
                             [*sets, "run.steps=5", "run.overwrite=true"])
        with pytest.raises(ConfigError) as err:
            train(second)
        assert str(err.value) == (
            f"{run_dir} is in use by another run (pid {first.pid} on {socket.gethostname()}); "
            "wait until it ends, or choose another run.name or run.output_dir")
        logged = _steps_logged(run_dir)
        while first.poll() is None and _steps_logged(run_dir) == logged:
            time.sleep(0.2)
        assert first.poll() is None and _steps_logged(run_dir) > logged   # untouched, going on
    finally:
        first.kill()                  # dies holding the lock: the kernel drops it
        first.wait()
    summary = train(second)           # so the next run may take the folder over
    assert summary["steps"] == 5
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "step"] == [1, 5]   # only its own


@pytest.mark.parametrize("name", ["..", "."])
def test_a_run_name_that_leaves_the_output_folder_is_refused(tmp_path, name):
    (tmp_path / "keep.txt").write_text("another project's file")
    with pytest.raises(ConfigError) as err:
        load_config([str(REPO / "configs/demo.yaml")],
                    [f"run.output_dir={tmp_path / 'runs'}", f"run.name={name}",
                     "run.overwrite=true", *LOCAL])
    assert str(err.value) == (
        f"run.name={name!r}: must be a folder name inside run.output_dir: non-empty, without "
        "'/', not '.' or '..'")
    assert (tmp_path / "keep.txt").exists()


def test_a_refused_resume_leaves_no_folder_and_check_sees_the_folder_first(tmp_path, capsys):
    """--resume of a run that does not exist is refused without leaving its folder (and
    lock) behind; ``train.py --check`` refuses what the ranks would: a folder that holds a
    run, a resume with nothing to continue."""
    from gravac.train.cli import main

    def cfg(name, *extra):
        return load_config([REPO / "configs/demo.yaml"],
                           [f"run.output_dir={tmp_path}", f"run.name={name}", "run.steps=2",
                            *LOCAL, *extra])
    with pytest.raises(ConfigError, match="--resume: no checkpoint in"):
        train(cfg("nothing"), resume=True)
    assert not (tmp_path / "nothing").exists()
    # nor the run.output_dir it would have made: only what was there before stays
    (tmp_path / "kept").mkdir()
    new_dir = tmp_path / "kept" / "new" / "runs"
    with pytest.raises(ConfigError, match="--resume: no checkpoint in"):
        train(load_config([REPO / "configs/demo.yaml"],
                          [f"run.output_dir={new_dir}", "run.name=x", "run.steps=2", *LOCAL]),
              resume=True)
    assert (tmp_path / "kept").is_dir() and not (tmp_path / "kept" / "new").exists()

    train(cfg("done"))
    base = ["--config", str(REPO / "configs/demo.yaml"), "--set", f"run.output_dir={tmp_path}",
            *LOCAL]
    assert main([*base, "run.name=done", "--check"]) == 2
    assert f"{tmp_path / 'done'} already holds a run; continue it with --resume" in \
        capsys.readouterr().err
    assert main([*base, "run.name=done", "run.steps=4", "--resume", "--check"]) == 0
    assert main([*base, "run.name=done", "run.overwrite=true", "--check"]) == 0
    assert main([*base, "run.name=nothing", "--resume", "--check"]) == 2
    assert "--resume: no checkpoint in" in capsys.readouterr().err
    assert not (tmp_path / "nothing").exists()
