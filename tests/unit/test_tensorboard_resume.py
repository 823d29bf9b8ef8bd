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


def test_autos_measurements_scores_and_choices_are_in_tensorboard(tmp_path):
    """Dense and fp16 both send at CF 1: the step's cf cannot tell Auto's methods apart,
    so its events have tags of their own."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from gravac.engine.run_record import METHOD, new_record
    from gravac.train.monitor import RunLogger

    log = RunLogger(tmp_path, enabled=True, total_steps=10, progress="never")
    log.record(new_record(METHOD, time=1.0, step=3, event="measured", method="fp16",
                          t=0.5, gain=1.0, steps=2))
    log.record(new_record(METHOD, time=2.0, step=6, event="measured", method="powersgd:4",
                          t=0.25, gain=0.8, steps=2))
    log.record(new_record(METHOD, time=2.0, step=6, event="chosen", method="powersgd:4",
                          score=3.2, round=1, scores={"fp16": 2.0, "powersgd:4": 3.2}))
    log.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()

    def scalars(tag):
        return [(e.step, round(e.value, 6)) for e in acc.Scalars(tag)]
    assert scalars("auto/step_time/fp16") == [(3, 0.5)]
    assert scalars("auto/step_time/powersgd_4") == [(6, 0.25)]
    assert scalars("auto/gain/powersgd_4") == [(6, 0.8)]
    assert scalars("auto/score/fp16") == [(6, 2.0)] and scalars("auto/score/powersgd_4") == [(6, 3.2)]

    def texts(tag):
        return [(e.step, e.tensor_proto.string_val[0].decode())
                for e in acc.Tensors(f"{tag}/text_summary")]
    assert texts("auto/chosen") == [(6, "powersgd:4")]
    events = texts("auto/events")
    assert [step for step, _ in events] == [3, 6, 6]
    assert events[0][1] == "step 3: measured fp16 (t=0.5, gain=1, steps=2)"
    assert events[2][1] == "step 6: chosen powersgd:4 (score=3.2, round=1)"
