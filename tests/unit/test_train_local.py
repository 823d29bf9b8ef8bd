"""train.py's loop on the single-process transport (run.backend=local): no launcher, the
same engine, and metrics lines that carry exactly the step record's fields."""
import json
import re
import shutil
from pathlib import Path

import pytest

from gravac.controllers import base
from gravac.engine.record import STEP_FIELDS
from gravac.train.config import load_config
from gravac.train.loop import train

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("compression", ["gravac_exp_topk.yaml", "dense.yaml"])
def test_local_backend_trains_and_logs_the_step_record(tmp_path, compression):
    cfg = load_config([str(REPO / "configs/demo.yaml"),
                       str(REPO / "configs/compression" / compression)],
                      [f"run.output_dir={tmp_path}", "run.name=local", "run.steps=150",
                       "run.backend=local", "run.log_interval=1", "run.progress=never",
                       "run.report=false", "compression.gravac.window=10"])
    summary = train(cfg)
    assert summary["steps"] == 150 and summary["final"]["top1"] > 0.5
    records = [json.loads(line) for line in
               (tmp_path / "local" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, 151))
    for r in steps:
        assert set(r) == {"kind", *STEP_FIELDS}
    start = next(r for r in records if r["kind"] == "run_start")
    assert start["backend"] == "local" and start["world_size"] == 1
    # which gravac ran it: version and source hash (reports show it beside the run)
    assert re.fullmatch(r"gravac \S+ \(source [0-9a-f]{12}\)", start["gravac"])
    if compression == "dense.yaml":
        assert all(r["cf"] == 1.0 and r["sent"] == "dense" for r in steps)
    else:
        assert {r["theta_min"] for r in steps} == {10.0}
        assert any(r["delta_min"] is not None for r in steps)
        # A window's last step carries the smoothed gains its window record measured
        # (they were read after the window's end reset them: null there).
        by_step = {r["step"]: r for r in steps}
        windows = [r for r in records if r["kind"] == "window"]
        assert windows
        for w in windows:
            line = by_step[w["step"]]
            assert line["delta_min"] is not None
            assert (line["delta_min"], line["delta_c"]) == (w["delta_min"], w["delta_c"])


def test_window_records_are_all_written_when_the_controller_keeps_the_latest(tmp_path,
                                                                            monkeypatch):
    """The controller keeps only its latest decisions (DECISIONS_KEPT): the trainer still
    writes every window once, numbered from the first, across a resume too."""
    monkeypatch.setattr(base, "DECISIONS_KEPT", 2)
    sets = [f"run.output_dir={tmp_path}", "run.name=kept", "run.backend=local",
            "run.progress=never", "run.report=false", "compression.gravac.window=5",
            "run.checkpoint_interval=20"]
    train(load_config([str(REPO / "configs/demo.yaml")], sets + ["run.steps=30"]))
    train(load_config([str(REPO / "configs/demo.yaml")], sets + ["run.steps=60"]), resume=True)
    records = [json.loads(line) for line in
               (tmp_path / "kept" / "metrics.jsonl").read_text().splitlines()]
    windows = [r for r in records if r["kind"] == "window"]
    assert [(w["window"], w["step"]) for w in windows] == [(i, 5 * i) for i in range(1, 13)]


def test_resuming_a_finished_run_logs_its_final_evaluation_once(tmp_path, capsys):
    """--resume of a run that has finished must not evaluate (and log) again."""
    sets = [f"run.output_dir={tmp_path}", "run.name=done", "run.steps=20", "run.backend=local",
            "run.progress=never", "run.report=false"]
    first = train(load_config([str(REPO / "configs/demo.yaml")], sets))
    again = train(load_config([str(REPO / "configs/demo.yaml")], sets), resume=True)
    assert again["final"] == first["final"] and again["steps"] == 20
    assert "had finished its 20 steps already" in capsys.readouterr().out
    records = [json.loads(line) for line in
               (tmp_path / "done" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [20]
    assert [r["step"] for r in records if r["kind"] == "run_end"] == [20]
    # and a longer run still evaluates at its new end
    longer = train(load_config([str(REPO / "configs/demo.yaml")], sets[:2] + [
        "run.steps=30", *sets[3:]]), resume=True)
    records = [json.loads(line) for line in
               (tmp_path / "done" / "metrics.jsonl").read_text().splitlines()]
    assert longer["steps"] == 30
    assert [r["step"] for r in records if r["kind"] == "eval"] == [20, 30]



def test_resuming_an_unfinished_run_with_fewer_steps_says_it_ends_at_the_checkpoint(tmp_path,
                                                                                       capsys):
    """A run stopped at step 10 of 20, resumed with run.steps=5: it ends at step 10 (a
    final evaluation there) and says so; it ended silently, reporting 10 steps."""
    sets = [f"run.output_dir={tmp_path}", "run.name=cut", "run.backend=local",
            "run.progress=never", "run.report=false", "run.checkpoint_interval=10"]
    demo = str(REPO / "configs/demo.yaml")
    train(load_config([demo], [*sets, "run.steps=20"]))
    root = tmp_path / "cut" / "checkpoints"     # as if it had been stopped after step 10
    shutil.rmtree(root / "step_00000020")
    (root / "latest.json").write_text(json.dumps({"step": 10, "dir": "step_00000010",
                                                  "world_size": 1}))
    capsys.readouterr()
    shorter = train(load_config([demo], [*sets, "run.steps=5"]), resume=True)
    assert shorter["steps"] == 10
    assert ("the checkpoint is at step 10, past the run's 5 steps (run.steps, run.epochs): "
            "the run ends there; raise them to train on") in capsys.readouterr().out

PROGRESS = [("auto", True), ("plain", True), ("never", False)]


@pytest.fixture(scope="module")
def progress_stdout(tmp_path_factory):
    """{run.progress: train.py's standard output} of a 40-step run with each setting of
    PROGRESS, the output a pipe or file, never a terminal (as under horovodrun): the three
    command lines in one python process (tests/script_batch.py), one start-up, not three."""
    from script_batch import run_scripts

    out = tmp_path_factory.mktemp("progress")
    runs = run_scripts([(REPO, ["train.py", "--config", "configs/demo.yaml",
                                "--set", f"run.output_dir={out / progress}", "--set", "run.steps=40",
                                "--set", "run.backend=local", "--set", "run.report=false",
                                "--set", "run.log_interval=2", "--set", f"run.progress={progress}"])
                        for progress, _ in PROGRESS], timeout=300)
    for proc in runs:
        assert proc.returncode == 0, proc.stderr
    return {progress: proc.stdout for (progress, _), proc in zip(PROGRESS, runs)}


@pytest.mark.parametrize("progress,shown", PROGRESS)
def test_progress_lines_when_output_is_not_a_terminal(progress_stdout, progress, shown):
    """Under horovodrun (output never a terminal) or into a file, run.progress=auto
    prints a plain line every tenth of the run: step/total, loss, CF, samples/s, eta."""
    import re

    lines = re.findall(r"^step (\d+)/40 \(\d+%\)  loss [\d.]+  cf [\d.]+  \d+ samples/s"
                       r"(?:  eta \d+(?:m\d\d)?s)?$", progress_stdout[progress], re.M)
    if shown:
        assert [int(s) for s in lines] == [1, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40]
    else:
        assert lines == []


def _demo_cfg(tmp_path, name, impl, steps=12):
    return load_config([str(REPO / "configs/demo.yaml")],
                       [f"run.output_dir={tmp_path}", f"run.name={name}", f"run.steps={steps}",
                        "run.backend=local", "run.progress=never", "run.report=false",
                        "run.eval_interval=0", "run.checkpoint_interval=6",
                        f"optimizer.implementation={impl}", "optimizer.weight_decay=0.0001"])


def test_optimizer_implementations_train_alike(tmp_path):
    """optimizer.implementation=auto takes torch's fused SGD (one kernel per tensor: on
    CPU ~4x faster than the per-tensor loop), which rounds differently in the last bit;
    foreach is bitwise the loop; a resume keeps the configured kernel, not the
    checkpoint's."""
    import torch

    from gravac.comm.local import LocalComm
    from gravac.train.loop import Trainer

    params = {}
    for impl in ("loop", "foreach", "auto"):
        train(_demo_cfg(tmp_path, impl, impl))
        trainer = Trainer(_demo_cfg(tmp_path, impl, impl), LocalComm())
        trainer.start(resume=True)
        params[impl] = [p.detach().clone() for p in trainer.model.parameters()]
        group = trainer.opt.param_groups[0]
        assert group["fused"] is (True if impl == "auto" else None)
        assert group["foreach"] is {"loop": False, "foreach": True, "auto": None}[impl]
    assert all(torch.equal(a, b) for a, b in zip(params["loop"], params["foreach"]))
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6)
               for a, b in zip(params["loop"], params["auto"]))
    # The run trained with the loop, resumed with fused (a free change: the same update).
    trainer = Trainer(_demo_cfg(tmp_path, "loop", "fused", steps=18), LocalComm())
    trainer.start(resume=True)
    assert trainer.opt.param_groups[0]["fused"] is True
