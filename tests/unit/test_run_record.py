"""The run-record schema (gravac/engine/run_record.py): every line the trainer writes is
declared there, and the one reader of run directories (gravac.report.load_run) loads
every declared field by its type, delta_min and delta_c among them."""
import ast
import dataclasses
import json
from pathlib import Path

import pytest

from gravac.engine.record import LOGGED_STATS, StepStats, step_record
from gravac.engine.run_record import (EVAL, KINDS, LOOP_MEASURED, METRICS_FILE, NUMBER,
                                      RANK_STEP_FIELDS, RANKS_DIR, STEP, STEP_FIELDS,
                                      TENSORBOARD_TAGS, TYPES, WINDOW, new_record,
                                      unknown_fields)
from gravac.report import RunLoadError, load_rank_steps, load_run
from gravac.train import tasks
from gravac.train.config import load_config
from gravac.train.loop import train

REPO = Path(__file__).resolve().parents[2]


def test_the_step_line_is_the_loops_measures_and_the_engines_step_record():
    stats_fields = {f.name for f in dataclasses.fields(StepStats)}
    assert set(STEP_FIELDS) == set(LOOP_MEASURED) | set(LOGGED_STATS)
    assert set(LOGGED_STATS) <= stats_fields
    assert list(KINDS[STEP].fields) == list(STEP_FIELDS)
    assert {"delta_min", "delta_c"} <= set(LOGGED_STATS)
    assert set(RANK_STEP_FIELDS) <= set(STEP_FIELDS)
    assert set(TENSORBOARD_TAGS.values()) <= set(STEP_FIELDS)
    for kind in KINDS.values():
        assert set(kind.fields.values()) <= set(TYPES), kind.name
        assert kind.more in (None, *TYPES), kind.name


def test_new_record_refuses_what_the_schema_does_not_declare():
    # eval lines take a task's own numbers; every other kind is closed
    assert new_record(EVAL, step=3, time=1.0, top1=0.5, bleu=2.0)["bleu"] == 2.0
    with pytest.raises(ValueError, match="'thetamin'.*run_record.py"):
        new_record(WINDOW, step=3, thetamin=10.0)
    with pytest.raises(ValueError, match="kind 'epoch_end'"):
        new_record("epoch_end", step=3)
    with pytest.raises(ValueError, match="needs the loop's measures"):
        step_record(StepStats(step=0, sent="dense"), step=1)
    assert unknown_fields({"kind": STEP, "step": 1, "loss": 2.0, "thetamin": 1}) == ["thetamin"]
    assert unknown_fields({"kind": "epoch_end", "step": 1}) == ["step"]


def _hand_written_records(path: Path):
    """(kind, fields) of every dict literal with a string "kind" in ``path``."""
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Dict):
            continue
        keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
        if "kind" not in keys:
            continue
        kind = node.values[keys.index("kind")]
        if isinstance(kind, ast.Constant) and isinstance(kind.value, str):
            yield kind.value, [k for k in keys if k != "kind"]


def test_the_trainer_writes_no_record_by_hand():
    """Every metrics line of the trainer goes through new_record (the schema checks its
    kind and fields); no dict literal with a "kind" is written around it."""
    found = [(path.name, kind) for path in sorted((REPO / "gravac/train").glob("*.py"))
             for kind, _ in _hand_written_records(path)]
    assert found == []


def test_every_line_a_run_writes_is_declared_and_read_back(tmp_path, monkeypatch):
    """A GraVAC run with windows, evaluations, rank files and one NaN step: every line is
    of a declared kind with declared fields, and load_run returns them typed, with the
    smoothed gains (delta_min, delta_c) of the step lines as written."""
    real_loss, calls = tasks.ImageTask.loss, []

    def loss_with_a_nan_at_the_7th_step(self, batch):
        calls.append(1)
        loss = real_loss(self, batch)
        return loss * float("nan") if len(calls) == 7 else loss

    monkeypatch.setattr(tasks.ImageTask, "loss", loss_with_a_nan_at_the_7th_step)
    cfg = load_config([str(REPO / "configs/demo.yaml"),
                       str(REPO / "configs/compression/gravac_exp_topk.yaml")],
                      [f"run.output_dir={tmp_path}", "run.name=all", "run.steps=30",
                       "run.backend=local", "run.log_interval=1", "run.progress=never",
                       "run.report=false", "run.eval_interval=10", "run.rank_phases=true",
                       "compression.gravac.window=5"])
    train(cfg)
    run_dir = tmp_path / "all"
    lines = [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]
    assert {r["kind"] for r in lines} == {"run_start", "step", "eval", "window", "nonfinite",
                                          "run_end"}
    for line in lines:
        assert unknown_fields(line) == [], line
    steps = [r for r in lines if r["kind"] == STEP]
    assert [r["step"] for r in steps if r["sent"] == "skipped"] == [7]
    for rank_line in load_rank_steps(run_dir)[0]:
        assert set(rank_line) == {"rank", *RANK_STEP_FIELDS}
    assert (run_dir / RANKS_DIR / "rank0.jsonl").is_file()

    run = load_run(run_dir)
    assert [s["step"] for s in run.steps] == list(range(1, 31))
    for written, loaded in zip(steps, run.steps):
        assert set(loaded) == {"kind", *STEP_FIELDS}
        for name in ("delta_min", "delta_c"):
            assert loaded[name] == written[name]
            assert loaded[name] is None or type(loaded[name]) is float
    assert sum(s["delta_min"] is not None for s in run.steps) > 20
    assert sum(s["delta_c"] is not None for s in run.steps) > 5
    assert len(run.windows) == 6 and all(set(KINDS[WINDOW].fields) <= set(w)
                                         for w in run.windows)
    assert all(isinstance(w["table"], dict) and type(w["delta_min"]) is float
               for w in run.windows)
    assert run.end is not None and run.end["final"]["top1"] > 0
    assert run.start["compressor"] == "topk" and run.start["world_size"] == 1


def _write(run_dir: Path, *records):
    run_dir.mkdir()
    (run_dir / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir


@pytest.mark.parametrize("name", [n for n, t in KINDS[STEP].fields.items() if t == NUMBER])
def test_every_number_of_a_step_line_is_checked(tmp_path, name):
    run_dir = _write(tmp_path / "r", {"kind": STEP, "step": 1, name: 2},
                     {"kind": STEP, "step": 2, name: "high"})
    with pytest.raises(RunLoadError, match=f"{METRICS_FILE}:2: step field '{name}' should "
                                           "be a number"):
        load_run(run_dir)
    run_dir = _write(tmp_path / "ok", {"kind": STEP, "step": 1, name: 2})
    assert load_run(run_dir).steps[0][name] == 2.0


def test_absent_fields_are_none_and_unknown_ones_kept(tmp_path):
    run_dir = _write(tmp_path / "r", {"kind": STEP, "step": 1, "newer_field": "x"},
                     {"kind": WINDOW, "step": 5, "settled": True})
    run = load_run(run_dir)
    assert run.steps[0]["delta_c"] is None and run.steps[0]["newer_field"] == "x"
    assert run.windows[0]["table"] == {} and run.windows[0]["delta_min"] is None
    with pytest.raises(RunLoadError, match="window field 'settled' should be true or false"):
        load_run(_write(tmp_path / "bad", {"kind": STEP, "step": 1},
                        {"kind": WINDOW, "step": 5, "settled": "yes"}))
