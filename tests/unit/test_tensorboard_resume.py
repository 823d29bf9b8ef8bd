"""TensorBoard after --resume: the steps between the checkpoint and the
interruption appear once, not twice; and the viewer the run prints is installed."""
import shutil
import subprocess
import sys
from pathlib import Path

from gravac.train.config import load_config
from gravac.train.loop import train

REPO = Path(__file__).resolve().parents[2]


def _loss_steps(run_dir: Path) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    return [event.step for event in acc.Scalars("train/loss")]


def test_resumed_run_has_each_step_once_in_tensorboard(tmp_path):
    sets = [f"run.output_dir={tmp_path}", "run.name=tb", "run.backend=local",
            "run.progress=never", "run.report=false", "run.log_interval=1",
            "run.checkpoint_interval=10", "run.keep_checkpoints=5"]
    train(load_config([str(REPO / "configs/demo.yaml")], sets + ["run.steps=25"]))
    # an "interruption" after step 25: go back to the checkpoint of step 20 and go on
    run_dir = tmp_path / "tb"
    ckpt = run_dir / "checkpoints"
    (ckpt / "latest.json").write_text('{"step": 20, "dir": "step_00000020", "world_size": 1}')
    for later in ckpt.glob("step_0000002[1-9]"):
        shutil.rmtree(later)
    train(load_config([str(REPO / "configs/demo.yaml")], sets + ["run.steps=30"]), resume=True)
    steps = _loss_steps(run_dir)
    assert steps == list(range(1, 31)), steps


def test_the_printed_tensorboard_command_is_installed():
    tensorboard = Path(sys.executable).parent / "tensorboard"
    proc = subprocess.run([str(tensorboard), "--version"], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip()
