"""gravac.sweep (hvd_scripts/sweep.py): grid expansion, baselines, the results table, errors, dry runs.

No test here launches horovodrun: launching is replaced by a fake that writes metrics.
"""
from __future__ import annotations

import contextlib
import csv
import gc
import io
import json
import pickle
import re
import subprocess
import sys
import weakref
from pathlib import Path

import numpy as np
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SAFE = re.compile(r"^[A-Za-z0-9._+-]+$")


from gravac.sweep import results as swr      # noqa: E402  the results table
from gravac.sweep import runner as swx       # noqa: E402  validation, launching, the CLI
from gravac.sweep import spec as sws         # noqa: E402  the sweep file
from gravac.sweep import link as swl         # noqa: E402  the link the runs cross

DENSE = "configs/compression/dense.yaml"
TOPK10 = "configs/compression/static_topk_10x.yaml"


def sweep_dict(**changes) -> dict:
    data = {"name": "t", "np": 2, "configs": ["configs/demo.yaml"], "set": {"run.steps": 60},
            "grid": {"compression": [{"files": [DENSE]}, {"files": [TOPK10]},
                                     {"set": {"compression.controller": "gravac",
                                              "compression.gravac.window": 20},
                                      "tag": "gravac w/20"}],
                     "optimizer.lr": [0.05, 0.1]}}
    data.update(changes)
    return data


# -- expansion ---------------------------------------------------------------------------------
def test_grid_expands_to_unique_safe_names_first_axis_slowest():
    runs = sws.expand(sws.parse_sweep(sweep_dict()))
    assert [r.name for r in runs] == [
        "t-dense-lr_0.05", "t-dense-lr_0.1", "t-static_topk_10x-lr_0.05",
        "t-static_topk_10x-lr_0.1", "t-gravac_w_20-lr_0.05", "t-gravac_w_20-lr_0.1"]
    assert all(SAFE.match(r.name) for r in runs)
    assert runs[3].index == (1, 1)
    assert runs[3].labels == {"compression": "static_topk_10x", "optimizer.lr": "lr_0.1"}


def test_overrides_merge_in_order_and_the_sweep_sets_name_and_output_dir(tmp_path):
    runs = sws.expand(sws.parse_sweep(sweep_dict()))
    run = runs[5]                                           # gravac, lr 0.1
    assert run.files == ["configs/demo.yaml"]
    args = run.train_args(tmp_path, extra=[("data.batch_size", 8)])
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    assert sets == ["run.steps=60", "compression.controller=gravac",
                    "compression.gravac.window=20", "optimizer.lr=0.1", "data.batch_size=8",
                    f"run.output_dir={tmp_path / 'runs'}", "run.name=t-gravac_w_20-lr_0.1"]
    assert runs[2].train_args(tmp_path)[:4] == ["--config", "configs/demo.yaml", TOPK10, "--set"]


def test_overrides_resolve_to_the_config_train_py_would_use(tmp_path):
    runs = sws.expand(sws.parse_sweep(sweep_dict()))
    configs, errors = swx.resolve_configs(runs, tmp_path, extra=[])
    assert errors == []
    cfg = configs["t-gravac_w_20-lr_0.1"]
    assert (cfg.compression.controller, cfg.compression.gravac.window) == ("gravac", 20)
    assert (cfg.optimizer.lr, cfg.run.steps) == (0.1, 60)
    assert cfg.run.name == "t-gravac_w_20-lr_0.1"
    assert cfg.run.output_dir == str(tmp_path / "runs")
    assert configs["t-dense-lr_0.05"].compression.controller == "dense"


def test_runs_are_validated_against_the_sweeps_launcher(tmp_path, capsys):
    # DDP's PowerSGD hook: refused before a horovodrun sweep starts, naming the run; under
    # torchrun accepted, and its dry run is one process on the local transport (a dry run
    # without a launcher would build on Horovod, which refuses it).
    ddp = {"compression": [{"files": ["configs/compression/ddp_powersgd_rank4.yaml"]}]}
    runs = sws.expand(sws.parse_sweep(sweep_dict(grid=ddp)))
    checked = []

    def check(args):
        checked.append(args)
        return None
    _, errors = swx.validate(runs, tmp_path, [], check, launcher="horovodrun")
    assert len(errors) == 1 and not checked
    assert errors[0][0] == "t-ddp_powersgd_rank4"
    assert errors[0][1].startswith("config error: compression.ddp_powersgd_rank=4: PyTorch "
                                   "DDP runs on")
    configs, errors = swx.validate(runs, tmp_path, [], check, launcher="torchrun")
    assert errors == [] and list(configs) == ["t-ddp_powersgd_rank4"]
    assert checked[0][-2:] == ["--set", "run.backend=local"]
    assert swx.dry_run_check(checked[0]) is None          # the real dry run passes


@pytest.mark.parametrize("value", [0.05, 1, True, None, "topk", "1e-4", "true", "a b: c",
                                   "/data/x", [1, 2], {"same_across_ranks": True}])
def test_values_survive_the_set_command_line(value):
    from gravac.train.config import parse_override

    assert parse_override(f"k={sws.format_value(value)}") == {"k": value}


def test_shorthand_axis_over_one_key():
    axis = sws.parse_axis("compression.compressor", ["topk", "dgc"])
    assert [v.label for v in axis.values] == ["compressor_topk", "compressor_dgc"]
    assert axis.values[1].overrides == (("compression.compressor", "dgc"),)
    milestones = sws.parse_axis("optimizer.lr_milestones", [[100, 200], [300]])
    assert milestones.values[0].overrides == (("optimizer.lr_milestones", [100, 200]),)
    assert all(SAFE.match(v.label) for v in milestones.values)


def test_entry_forms_and_labels():
    axis = sws.parse_axis("c", [DENSE, [DENSE, TOPK10], {"set": {"compression.cf": 50}},
                               {"files": [TOPK10], "set": {"run.seed": 3}}])
    assert [v.label for v in axis.values] == ["dense", "dense+static_topk_10x", "cf_50",
                                              "static_topk_10x_seed_3"]
    assert axis.values[1].files == (DENSE, TOPK10)


def test_equal_derived_labels_are_made_unique_but_equal_tags_are_an_error():
    axis = sws.parse_axis("c", [{"set": {"compression.cf": 10}}, {"set": {"compression.cf": 10}},
                               {"files": [DENSE]}])
    assert [v.label for v in axis.values] == ["cf_10_0", "cf_10_1", "dense"]
    with pytest.raises(sws.SweepError, match=r"grid\.c\[1\]\.tag: 'x' is already the tag of "
                                            r"grid\.c\[0\]"):
        sws.parse_axis("c", [{"files": [DENSE], "tag": "x"}, {"files": [TOPK10], "tag": "x"}])


def test_long_names_are_shortened_with_a_hash():
    name = sws.run_name("s", ["a" * 80, "b" * 80])
    assert len(name) == sws.MAX_NAME and SAFE.match(name)
    assert name != sws.run_name("s", ["a" * 80, "b" * 79 + "c"])


# -- baselines ---------------------------------------------------------------------------------
def test_default_baseline_is_the_first_dense_run():
    sweep = sws.parse_sweep(sweep_dict(grid={"compression": [{"files": [TOPK10]},
                                                            {"files": [DENSE]}]}))
    runs = sws.expand(sweep)
    controllers = {"t-static_topk_10x": "static", "t-dense": "dense"}
    assert sws.pick_baselines(sweep, runs, controllers) == {"t-static_topk_10x": "t-dense",
                                                           "t-dense": "t-dense"}
    no_dense = {"t-static_topk_10x": "static", "t-dense": "static"}
    assert set(sws.pick_baselines(sweep, runs, no_dense).values()) == {None}


def test_baseline_mapping_fixes_the_named_axes_and_keeps_the_others():
    sweep = sws.parse_sweep(sweep_dict(baseline={"compression": 0}))
    baselines = sws.pick_baselines(sweep, sws.expand(sweep))
    assert baselines["t-gravac_w_20-lr_0.1"] == "t-dense-lr_0.1"
    assert baselines["t-static_topk_10x-lr_0.05"] == "t-dense-lr_0.05"
    by_label = sws.parse_sweep(sweep_dict(baseline={"compression": "static_topk_10x",
                                                   "optimizer.lr": 0}))
    assert set(sws.pick_baselines(by_label, sws.expand(by_label)).values()) == \
        {"t-static_topk_10x-lr_0.05"}


@pytest.mark.parametrize("baseline, message", [
    ({"nope": 0}, r"baseline\.nope: no such grid axis"),
    ({"compression": 3}, r"baseline\.compression: index 3 out of range .*0\.\.2"),
    ({"compression": "sparse"}, r"baseline\.compression: 'sparse' is neither an index nor a label"),
    ([0], r"baseline: expected a mapping axis -> index"),
])
def test_bad_baselines_name_the_field(baseline, message):
    with pytest.raises(sws.SweepError, match=message):
        sws.parse_sweep(sweep_dict(baseline=baseline))


# -- invalid sweep files -------------------------------------------------------------------------
@pytest.mark.parametrize("changes, message", [
    ({"grids": {}}, r"unknown top-level key 'grids'; allowed: name, np, configs, set, grid, baseline"),
    ({"grid": {"compression": []}}, r"grid\.compression: the axis is empty"),
    ({"grid": {}}, r"grid: expected a mapping with at least one axis"),
    ({"configs": ["configs/nope.yaml"]}, r"configs\[0\]: config file 'configs/nope.yaml' not found"),
    ({"grid": {"c": [{"files": [DENSE]}, {"files": ["configs/compression/x.yaml"]}]}},
     r"grid\.c\[1\]\.files\[0\]: config file 'configs/compression/x.yaml' not found"),
    ({"grid": {"c": [{"file": [DENSE]}]}},
     r"grid\.c\[0\]: unknown key 'file'; allowed: files, set, tag; did you mean files\?"),
    ({"grdi": {}}, r"unknown top-level key 'grdi'; .*; did you mean grid\?"),
    # a train.py config where the sweep file goes
    ({"run": {"steps": 5}}, r"'run' is a section of a train\.py config: a sweep file names "
                            r"such files under configs:"),
    ({"grid": {"lr": [0.1]}}, r"grid\.lr\[0\]: expected a mapping .*e\.g\. optimizer\.lr"),
    ({"grid": {"status": [DENSE]}}, r"grid\.status: the axis name clashes with a results column"),
    ({"np": 0}, r"np: 0 must be a positive integer"),
    ({"name": "a/b"}, r"name: 'a/b' must be a non-empty name"),
    ({"set": {"run.name": "x"}}, r"set\.run\.name: run\.name is chosen by the sweep"),
    ({"set": {"run..steps": 1}}, r"set\.run\.\.steps: key 'run\.\.steps' must be a dotted path"),
])
def test_invalid_sweep_files_name_the_field(changes, message):
    with pytest.raises(sws.SweepError, match=message):
        sws.parse_sweep(sweep_dict(**changes))


def test_invalid_sweep_file_on_the_command_line_exits_2_before_any_check(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(sweep_dict(grid={"compression": []})))
    calls = []
    assert swx.main([str(path), "--out", str(tmp_path / "out")], check=calls.append) == 2
    assert "sweep error: grid.compression: the axis is empty" in capsys.readouterr().err
    assert calls == [] and not (tmp_path / "out").exists()


def test_a_sweep_file_that_is_a_folder_or_bad_yaml_is_named_with_where(tmp_path):
    (tmp_path / "b.yaml").write_text("name: b\n")
    with pytest.raises(sws.SweepError) as err:
        sws.load_sweep(tmp_path)
    assert str(err.value) == (f"sweep file {str(tmp_path)!r} is a folder; name one sweep file "
                              f"in it, e.g. {tmp_path / 'b.yaml'}")
    bad = tmp_path / "b.yaml"
    bad.write_text("name: b\ngrid:\n  a: [1\n")
    with pytest.raises(sws.SweepError) as err:
        sws.load_sweep(bad)
    assert str(err.value).startswith(f"sweep file {bad}:4:1: not valid YAML: while parsing a "
                                     "flow sequence")


def test_a_key_given_twice_in_the_sweep_file_is_refused(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: s\nnp: 2\nnp: 4\n")
    with pytest.raises(sws.SweepError, match=r"found duplicate key 'np' \(first on line 2\)"):
        sws.load_sweep(path)


def test_a_bad_run_config_stops_the_sweep_before_launching(tmp_path, capsys, monkeypatch):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(sweep_dict(grid={"optimizer.lr": [0.1, -1.0]})))
    monkeypatch.setattr(swx, "launch", lambda *a, **k: pytest.fail("launched"))
    assert swx.main([str(path), "--out", str(tmp_path / "out")], check=lambda args: None) == 2
    err = capsys.readouterr().err
    assert "run t-lr_-1.0: config error: optimizer.lr=-1.0: must be > 0" in err
    assert "nothing was launched" in err and not (tmp_path / "out").exists()


def test_dry_run_check_reports_train_py_config_errors():
    problem = swx.dry_run_check(["--config", "configs/demo.yaml", "--set", "run.steps=0"])
    assert problem == "config error: run.steps=0: must be >= 1"


# -- the results table -------------------------------------------------------------------------
def write_metrics(run_dir: Path, records: list[dict]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def step(n, t, sent, dense, rate):
    return {"kind": "step", "step": n, "time": t, "cum_floats_sent": sent,
            "cum_dense_floats": dense, "samples_per_sec": rate}


FAKE_RUNS = {
    "t-dense": [{"kind": "run_start", "controller": "dense"},
                step(5, 9.0, 500, 500, 100.0), step(10, 19.0, 1000, 1000, 200.0),
                {"kind": "eval", "step": 5, "top1": 0.5, "top5": 0.9, "loss": 1.0},
                {"kind": "eval", "step": 10, "top1": 0.75, "top5": 0.95, "loss": 0.5},
                {"kind": "run_end", "step": 10, "time": 20.0, "final": {"top1": 0.75}}],
    "t-topk": [{"kind": "run_start", "controller": "static"},
               step(5, 4.0, 50, 500, 300.0), step(10, 9.0, 100, 1000, 500.0),
               {"kind": "eval", "step": 10, "top1": 0.7, "top5": 0.9, "loss": 0.6},
               {"kind": "run_end", "step": 10, "time": 10.0, "final": {"top1": 0.7}}],
    "t-long": [step(20, 19.0, 400, 2000, 400.0),      # twice as long: compared per step
               {"kind": "eval", "step": 20, "perplexity": 80.0, "loss": 4.38},
               {"kind": "run_end", "step": 20, "time": 20.0, "final": {"perplexity": 80.0}}],
    "t-crash": [step(5, 4.0, 50, 500, 250.0)],
}


@pytest.fixture
def fake_sweep(tmp_path):
    sweep = sws.parse_sweep({"name": "t", "grid": {"c": [{"files": [DENSE], "tag": "dense"},
                                                        {"files": [TOPK10], "tag": "topk"},
                                                        {"files": [TOPK10], "tag": "long"},
                                                        {"files": [TOPK10], "tag": "crash"},
                                                        {"files": [TOPK10], "tag": "later"}]}})
    runs = sws.expand(sweep)
    for name, records in FAKE_RUNS.items():
        write_metrics(tmp_path / "runs" / name, records)
    status = {"t-dense": "ok", "t-topk": "ok", "t-long": "ok", "t-crash": "failed"}
    notes = {"t-crash": "RuntimeError: boom | bang"}
    baselines = {r.name: "t-dense" for r in runs}
    return sweep, runs, status, notes, baselines


def test_results_rows_exact_numbers(fake_sweep, tmp_path):
    sweep, runs, status, notes, baselines = fake_sweep
    rows = {r["name"]: r for r in swr.results_rows(sweep, runs, tmp_path, status, notes, baselines)}
    assert rows["t-dense"] == {
        "name": "t-dense", "c": "dense", "status": "ok", "steps": 10, "wall_time_s": 20.0,
        "metric": "top1", "final_metric": 0.75, "floats_vs_dense": 1.0,
        "mean_samples_per_sec": 150.0, "speedup": 1.0, "comm_saving": 1.0,
        "baseline": "t-dense", "note": ""}
    topk = rows["t-topk"]
    assert (topk["final_metric"], topk["floats_vs_dense"], topk["mean_samples_per_sec"]) == \
        (0.7, 0.1, 400.0)
    assert (topk["speedup"], topk["comm_saving"]) == (2.0, 10.0)
    # Twice as long: compared at step 10, the last step both reached, as the report does
    # (gravac.report.stats). The long run logged only step 20 (19 s, 400 floats): from the
    # origin that is 9.5 s and 200 floats at step 10, against dense's step 10 at 19 s (its
    # run_end's 20 s holds its final evaluation, not done by the long run at step 10) and
    # 1000 floats.
    long = rows["t-long"]
    assert (long["steps"], long["metric"], long["final_metric"]) == (20, "perplexity", 80.0)
    assert long["speedup"] == pytest.approx(19.0 / 9.5) and long["comm_saving"] == 5.0
    assert long["floats_vs_dense"] == 0.2 and "at step 10" in long["note"]
    # A run that stopped early: the report's wall time is its last timed record, and it is
    # not compared (its baseline finished, it did not).
    crash = rows["t-crash"]
    assert (crash["status"], crash["steps"], crash["wall_time_s"], crash["speedup"]) == \
        ("failed", 5, 4.0, None)
    assert crash["floats_vs_dense"] == 0.1 and crash["note"] == "RuntimeError: boom | bang"
    later = rows["t-later"]
    assert later["status"] == "pending" and later["steps"] is None and later["speedup"] is None


def test_results_rows_hold_only_the_baseline_and_one_run_loaded(fake_sweep, tmp_path,
                                                                monkeypatch):
    """A sweep of long runs: the table is made holding the baselines' records and one run's
    at a time, not every finished run's at once."""
    sweep, runs, status, notes, baselines = fake_sweep
    made, alive, real = [], [], swr.load_run

    def load_run(path):
        gc.collect()
        alive.append(sum(ref() is not None for ref in made))
        run = real(path)
        made.append(weakref.ref(run))
        return run
    monkeypatch.setattr(swr, "load_run", load_run)
    swr.results_rows(sweep, runs, tmp_path, status, notes, baselines)
    assert len(made) == 4 and max(alive) <= 2     # the baseline, the previous row's run


def test_no_speedup_without_a_successful_baseline(fake_sweep, tmp_path):
    sweep, runs, status, notes, baselines = fake_sweep
    status = {**status, "t-dense": "failed"}
    rows = swr.results_rows(sweep, runs, tmp_path, status, notes, baselines)
    assert all(r["speedup"] is None and r["comm_saving"] is None for r in rows)


def test_the_table_is_the_reports_summary(fake_sweep, tmp_path):
    from gravac.report import load_run
    from gravac.report.stats import summarize
    sweep, runs, status, notes, baselines = fake_sweep
    rows = {r["name"]: r for r in swr.results_rows(sweep, runs, tmp_path, status, notes, baselines)}
    base = load_run(tmp_path / "runs" / "t-dense")
    for name in ("t-dense", "t-topk", "t-long"):
        s = summarize(load_run(tmp_path / "runs" / name), base)
        row = rows[name]
        assert (row["steps"], row["wall_time_s"], row["metric"], row["final_metric"],
                row["floats_vs_dense"], row["mean_samples_per_sec"], row["speedup"],
                row["comm_saving"]) == (s.steps, s.wall_time, s.metric, s.final_metric,
                                        s.floats_vs_dense, s.mean_samples_per_sec,
                                        s.speedup, s.comm_saving)


def test_a_run_of_another_model_than_its_baseline_is_not_compared(fake_sweep, tmp_path):
    sweep, runs, status, notes, baselines = fake_sweep
    path = tmp_path / "runs" / "t-topk" / "metrics.jsonl"
    write_metrics(path.parent, [{"kind": "run_start", "controller": "static", "model": "vgg16"}]
                  + FAKE_RUNS["t-topk"][1:])
    write_metrics(tmp_path / "runs" / "t-dense", [{"kind": "run_start", "controller": "dense",
                                                   "model": "resnet18"}]
                  + FAKE_RUNS["t-dense"][1:])
    topk = swr.results_rows(sweep, runs, tmp_path, status, notes, baselines)[1]
    assert (topk["speedup"], topk["comm_saving"]) == (None, None)
    assert topk["note"].startswith("not compared: model vgg16 differs")


def test_finished_needs_run_end_and_skips_a_torn_last_line(tmp_path):
    write_metrics(tmp_path, FAKE_RUNS["t-topk"])
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"kind": "step", "ste')
    assert swr.finished(tmp_path)
    write_metrics(tmp_path / "crash", FAKE_RUNS["t-crash"])
    assert not swr.finished(tmp_path / "crash") and not swr.finished(tmp_path / "none")


def test_unreadable_metrics_are_noted_not_fatal(fake_sweep, tmp_path):
    sweep, runs, status, notes, baselines = fake_sweep
    (tmp_path / "runs" / "t-topk" / "metrics.jsonl").write_text('{"kind": "step"\n{}\n')
    topk = swr.results_rows(sweep, runs, tmp_path, status, notes, baselines)[1]
    assert topk["steps"] is None and topk["note"].startswith("metrics not read: ")


def test_results_csv_and_md_are_written(fake_sweep, tmp_path):
    sweep, runs, status, notes, baselines = fake_sweep
    rows = swr.results_rows(sweep, runs, tmp_path, status, notes, baselines)
    swr.write_results(sweep, rows, tmp_path)
    with open(tmp_path / "results.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert list(table[0]) == ["name", "c", "status", "steps", "wall_time_s", "metric",
                              "final_metric", "floats_vs_dense", "mean_samples_per_sec",
                              "speedup", "comm_saving", "baseline", "note"]
    assert [r["name"] for r in table] == [r.name for r in runs]
    assert float(table[1]["speedup"]) == 2.0 and float(table[1]["comm_saving"]) == 10.0
    assert table[3]["speedup"] == "" and table[4]["status"] == "pending"
    md = (tmp_path / "results.md").read_text()
    assert md.startswith("# Sweep t\n") and "5 runs on 2 ranks: 3 ok, 1 failed, 1 pending" in md
    assert "| t-topk | topk | ok | 10 | 10.00 | top1 | 0.7 | 0.1 | 400.0 | 2.00x | 10.00x |" in md
    assert "RuntimeError: boom \\| bang" in md
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.csv", "results.md", "runs"]


def test_execute_records_failures_goes_on_and_keeps_results_current(tmp_path, monkeypatch, capsys):
    sweep = sws.parse_sweep({"name": "t", "grid": {"c": [{"files": [DENSE], "tag": "dense"},
                                                        {"files": [TOPK10], "tag": "bad"},
                                                        {"files": [TOPK10], "tag": "topk"}]}})
    runs = sws.expand(sweep)
    seen = []

    def fake_launch(command, log_path, repo=sws.REPO):
        name = command[-1].split("=", 1)[1]          # the last --set is run.name=...
        with open(tmp_path / "results.csv", newline="") as f:
            seen.append({r["name"]: r["status"] for r in csv.DictReader(f)})
        log_path.parent.mkdir(parents=True, exist_ok=True)
        if name == "t-bad":
            log_path.write_text("$ cmd\nconfig error: something broke\n")
            return 1
        write_metrics(tmp_path / "runs" / name, FAKE_RUNS["t-dense" if name == "t-dense" else "t-topk"])
        return 0

    reports = []
    monkeypatch.setattr(swx, "launch", fake_launch)
    monkeypatch.setattr(swx, "run_report", lambda dirs, out, base: reports.append((dirs, out, base)) or True)
    code = swx.execute(sweep, runs, tmp_path, [], {r.name: "t-dense" for r in runs}, "horovodrun", "horovodrun")
    assert code == 1
    assert seen[1] == {"t-dense": "ok", "t-bad": "running", "t-topk": "pending"}
    with open(tmp_path / "results.csv", newline="") as f:
        final = {r["name"]: r for r in csv.DictReader(f)}
    assert [final[n]["status"] for n in ("t-dense", "t-bad", "t-topk")] == ["ok", "failed", "ok"]
    assert final["t-bad"]["note"] == "config error: something broke"
    assert float(final["t-topk"]["speedup"]) == 2.0
    assert reports == [([tmp_path / "runs/t-dense", tmp_path / "runs/t-topk"], tmp_path / "report",
                         tmp_path / "runs/t-dense")]


def test_resume_keeps_finished_runs_resumes_the_interrupted_one_and_runs_the_rest(
        tmp_path, monkeypatch, capsys):
    """`--resume` after an interrupted sweep. t-dense finished (its run_end is the
    completed marker), t-topk was interrupted after a checkpoint, t-gravac never started."""
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "set": {"run.steps": 10}, "grid": {"c": [
        {"files": [DENSE], "tag": "dense"}, {"files": [TOPK10], "tag": "topk"},
        {"set": {"compression.controller": "gravac"}, "tag": "gravac"}]}}))
    out = tmp_path / "out"
    write_metrics(out / "runs/t-dense", FAKE_RUNS["t-dense"])
    write_metrics(out / "runs/t-topk", FAKE_RUNS["t-topk"][:2])        # stopped at step 5
    (out / "runs/t-topk/checkpoints").mkdir()
    (out / "runs/t-topk/checkpoints/latest.json").write_text(
        '{"step": 5, "dir": "step_00000005", "world_size": 2}')
    launched = []

    def fake_launch(command, log_path, repo=sws.REPO):
        name = command[command.index("--config"):][-1].split("=", 1)[1] \
            if command[-1] != "--resume" else command[-2].split("=", 1)[1]
        launched.append((name, command[-1] == "--resume"))
        write_metrics(out / "runs" / name, FAKE_RUNS["t-topk"])
        return 0

    monkeypatch.setattr(swx, "launch", fake_launch)
    monkeypatch.setattr(swx, "find_launcher", lambda name, repo=REPO: "horovodrun")
    monkeypatch.setattr(swx, "run_report", lambda dirs, out_dir, base: True)
    # without --resume the finished and interrupted runs block the sweep
    assert swx.main([str(path), "--out", str(out)], check=lambda args: None) == 2
    err = capsys.readouterr().err
    # one line for both runs, offering --resume first
    assert f"sweep error: the run folder in {out / 'runs'} already holds a run; pass --resume " \
           "to continue it, --overwrite to replace the sweep's runs, or --out to write " \
           "elsewhere (runs t-dense, t-topk)\n" in err and launched == []
    assert "sweep error: 2 of 3 runs invalid; nothing was launched" in err
    assert swx.main([str(path), "--out", str(out), "--resume"], check=lambda args: None) == 0
    assert launched == [("t-topk", True), ("t-gravac", False)]
    assert "t-dense: finished earlier, kept" in capsys.readouterr().out
    with open(out / "results.csv", newline="") as f:
        rows = {r["name"]: r for r in csv.DictReader(f)}
    assert {n: r["status"] for n, r in rows.items()} == {"t-dense": "ok", "t-topk": "ok",
                                                        "t-gravac": "ok"}
    assert rows["t-dense"]["note"] == "finished in an earlier sweep (--resume)"
    assert rows["t-topk"]["note"] == "resumed from its checkpoint (--resume)"
    assert swx.main([str(path), "--out", str(out), "--resume", "--overwrite"]) == 2
    assert "--resume keeps the finished runs" in capsys.readouterr().err


# -- dry runs of the shipped sweep files ---------------------------------------------------------
def test_demo_sweep_dry_run_end_to_end(tmp_path):
    proc = subprocess.run([sys.executable, "hvd_scripts/sweep.py", "configs/sweeps/demo_sweep.yaml",
                           "--dry-run", "--out", str(tmp_path / "sweep")],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    listed = re.findall(r"^\s+\d+\. (\S+)", proc.stdout, flags=re.M)
    assert listed == ["demo_sweep-dense", "demo_sweep-fp16", "demo_sweep-gravac_recommended",
                      "demo_sweep-auto"]
    assert "demo_sweep-dense               compression=dense  (baseline)" in proc.stdout
    # the link it will cross: the rate-limited loopback as root, else the plain one, said
    assert re.search(r"^link: (1gbit \(hvd_scripts/bandwidth_sandbox.sh\)|loopback \(no "
                     r"rate limit\).*1gbit was asked)", proc.stdout, flags=re.M), proc.stdout
    assert "all 4 runs are valid (dry run: nothing launched)" in proc.stdout
    assert not (tmp_path / "sweep").exists()


# -- the link the runs cross ----------------------------------------------------------------------
@pytest.mark.parametrize("raw, rate", [(None, None), ("none", None), ("loopback", None),
                                       ("100mbit", "100mbit"), ("1GBIT", "1gbit"),
                                       ("2.5gbit", "2.5gbit")])
def test_link_rates_are_tc_spellings_or_loopback(raw, rate):
    assert swl.check_rate("link", raw) == rate
    assert sws.parse_sweep(sweep_dict(link=raw)).link == rate


@pytest.mark.parametrize("raw", ["100", "fast", "1 gbit", 100, "10mbps"])
def test_a_bad_link_rate_names_the_field(raw):
    with pytest.raises(sws.SweepError, match=r"^link: .* is not a link rate; write it as tc "):
        sws.parse_sweep(sweep_dict(link=raw))


def test_the_link_plan_limits_the_loopback_where_it_can_and_says_so_where_not():
    limited = swl.link_plan("100mbit", why_not=None) if swl.can_limit() is None else \
        swl.LinkPlan(("bash", swl.SANDBOX, "100mbit", "--"), "100mbit (x)")
    assert limited.prefix == ("bash", "hvd_scripts/bandwidth_sandbox.sh", "100mbit", "--")
    refused = swl.link_plan("100mbit", why_not="it needs root (network namespaces and tc)")
    assert refused.prefix == () and not refused.limited
    assert refused.description.startswith("loopback (no rate limit): nothing limits")
    assert "100mbit was asked, but hvd_scripts/bandwidth_sandbox.sh could not run: it " \
           "needs root" in refused.description
    assert swl.link_plan(None).description == swl.LOOPBACK


def test_execute_runs_each_job_behind_the_link_and_names_the_fastest(tmp_path, monkeypatch,
                                                                     capsys):
    sweep = sws.parse_sweep({"name": "t", "link": "100mbit",
                             "grid": {"c": [{"files": [DENSE], "tag": "dense"},
                                            {"files": [TOPK10], "tag": "topk"}]}})
    sweep.link_description = "100mbit (hvd_scripts/bandwidth_sandbox.sh)"
    runs = sws.expand(sweep)
    commands = []

    def fake_launch(command, log_path, repo=sws.REPO):
        commands.append(command)
        name = command[-1].split("=", 1)[1]
        write_metrics(tmp_path / "runs" / name, FAKE_RUNS["t-dense" if name == "t-dense"
                                                          else "t-topk"])
        return 0
    monkeypatch.setattr(swx, "launch", fake_launch)
    monkeypatch.setattr(swx, "run_report", lambda dirs, out, base: True)
    plan = swl.LinkPlan(("bash", swl.SANDBOX, "100mbit", "--"), sweep.link_description)
    assert swx.execute(sweep, runs, tmp_path, [], {r.name: "t-dense" for r in runs},
                       "horovodrun", "/v/horovodrun", link=plan) == 0
    assert [c[:5] for c in commands] == [["bash", swl.SANDBOX, "100mbit", "--",
                                          "/v/horovodrun"]] * 2
    out = capsys.readouterr().out
    assert "fastest: t-topk, 400.0 samples/s, 2.00x its baseline t-dense's speed; link: 100mbit " \
           "(hvd_scripts/bandwidth_sandbox.sh)" in out
    md = (tmp_path / "results.md").read_text()
    assert "Link: 100mbit (hvd_scripts/bandwidth_sandbox.sh).\n" in md
    assert "Fastest: t-topk, 400.0 samples/s, 2.00x its baseline t-dense's speed.\n" in md


def test_a_link_and_a_hostfile_together_are_refused(tmp_path, capsys):
    hosts = tmp_path / "hosts"
    hosts.write_text("a slots=1\n")
    assert swx.main(["configs/sweeps/demo_sweep.yaml", "--dry-run", "--hostfile",
                     str(hosts)]) == 2
    assert "link 1gbit limits this host's loopback, but --hostfile" in capsys.readouterr().err
    assert swx.main(["configs/sweeps/demo_sweep.yaml", "--dry-run", "--link", "fast"]) == 2
    assert "--link: 'fast' is not a link rate" in capsys.readouterr().err


def write_tiny_cifar10(root: Path, n: int = 64) -> None:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        entry = {b"data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
                 b"labels": rng.integers(0, 10, size=n).tolist()}
        with open(folder / name, "wb") as f:
            pickle.dump(entry, f, protocol=2)


def test_paper_sweep_validates_on_tiny_fake_data(tmp_path, monkeypatch, capsys):
    """Every run of the paper sweep passes train.py's dry run (in this process, for speed)."""
    from gravac.train import cli

    write_tiny_cifar10(tmp_path / "data")
    monkeypatch.chdir(REPO)
    checked = []

    def check(args):
        checked.append(args)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
            code = cli.main([*args, "--dry-run"])
        return None if code == 0 else err.getvalue().strip()

    hosts = tmp_path / "hosts"                         # the paper's 32 ranks: a cluster
    hosts.write_text("node1 slots=16\nnode2 slots=16\n")
    code = swx.main(["configs/paper/table2_resnet101.yaml", "--dry-run", "--out", str(tmp_path / "sw"),
                    "--set", f"data.root={tmp_path / 'data'}", "--hostfile", str(hosts)],
                    check=check)
    out = capsys.readouterr().out
    assert code == 0, out
    expected = ["dense"] + [f"static_{c}_{f}x" for c in ("topk", "dgc", "redsync", "randomk")
                            for f in (10, 1000)] + ["gravac_exp_dgc_eps07", "gravac_exp_dgc_eps09"]
    assert sorted(re.findall(r"^\s+\d+\. table2_resnet101-(\S+)", out, flags=re.M)) == sorted(expected)
    assert len(checked) == len(expected)
    assert all(f"data.root={tmp_path / 'data'}" in args for args in checked)
    assert "table2_resnet101-dense                 compression=dense  (baseline)" in out
    assert "on 32 ranks each" in out                     # the paper's scale


@pytest.mark.parametrize("sweep", sorted(p for p in (REPO / "configs/paper").glob("*.yaml")
                                         if not p.stem.startswith("scaled_")),
                         ids=lambda p: p.stem)
def test_every_paper_sweep_resolves_as_it_is_and_scaled(sweep, tmp_path, capsys):
    """Every run of every configs/paper sweep is a valid config on a cluster (as it is) and
    scaled down on one machine (with its scaled file): the configs are resolved and
    checked, not built (the dry run above builds a whole table's models)."""
    from gravac.train.config import ConfigError, load_config

    def check(args):
        files, sets, i = [], [], 1
        while i < len(args):
            if args[i] == "--set":
                sets.append(args[i + 1])
                i += 2
            else:
                files.append(args[i])
                i += 1
        try:
            load_config(files, sets)
        except ConfigError as exc:
            return str(exc)
        return None

    scaled = "scaled_text.yaml" if "lstm" in sweep.stem else "scaled_images.yaml"
    hosts = tmp_path / "hosts"
    hosts.write_text("node1 slots=16\nnode2 slots=16\n")
    for extra in (["--hostfile", str(hosts)], ["--config", f"configs/paper/{scaled}", "--np", "2"]):
        code = swx.main([str(sweep), "--dry-run", "--out", str(tmp_path / "sw"), *extra],
                        check=check)
        out = capsys.readouterr().out
        assert code == 0, out
        assert f"on {32 if extra[0] == '--hostfile' else 2} ranks each" in out
    if extra:
        assert f"configs/paper/{scaled}" in out


def test_a_hostfile_runs_each_run_through_run_multi_node():
    from gravac.sweep.runner import launch_command

    args = ["--config", "a.yaml", "b.yaml", "--set", "run.steps=9", "--resume"]
    assert launch_command("horovodrun", "/x/horovodrun", 32, args, "/h/hosts.txt") == [
        "bash", "hvd_scripts/run_multi_node.sh", "/h/hosts.txt", "32", "a.yaml", "b.yaml",
        "--", "--set", "run.steps=9", "--resume"]
    with pytest.raises(swx.SweepError, match="--hostfile runs through horovodrun"):
        launch_command("torchrun", "/x/torchrun", 2, args, "/h/hosts.txt")


def test_hostfile_and_config_options_on_the_command_line(tmp_path, capsys):
    code = swx.main(["configs/sweeps/demo_sweep.yaml", "--dry-run", "--hostfile",
                     str(tmp_path / "none.txt"), "--out", str(tmp_path / "sw")])
    assert code == 2 and "--hostfile" in capsys.readouterr().err
    code = swx.main(["configs/sweeps/demo_sweep.yaml", "--dry-run", "--launcher", "torchrun",
                     "--hostfile", "x", "--out", str(tmp_path / "sw")])
    assert code == 2 and "runs through horovodrun" in capsys.readouterr().err


# -- one report per baseline, the axis values, ranks on this host, paths, leftovers -------------
SEEDS = {"name": "t", "set": {"run.steps": 10},
         "grid": {"c": [{"files": [DENSE], "tag": "dense"}, {"files": [TOPK10], "tag": "topk"}],
                  "run.seed": [0, 1]},
         "baseline": {"c": "dense"}}


def test_each_report_uses_the_baseline_of_the_results_table(tmp_path, monkeypatch, capsys):
    """Each seed's runs against that seed's dense run, in the report as in results.md; the
    run.seed column holds the seeds, not the labels seed_0, seed_1."""
    sweep = sws.parse_sweep(SEEDS)
    runs = sws.expand(sweep)
    baselines = sws.pick_baselines(sweep, runs)
    assert baselines["t-topk-seed_1"] == "t-dense-seed_1"

    def fake_launch(command, log_path, repo=sws.REPO):
        name = command[-1].split("=", 1)[1]
        write_metrics(tmp_path / "runs" / name, FAKE_RUNS["t-dense" if "dense" in name else "t-topk"])
        return 0
    reports = []
    monkeypatch.setattr(swx, "launch", fake_launch)
    monkeypatch.setattr(swx, "run_report", lambda dirs, out, base: reports.append((dirs, out, base)) or True)
    assert swx.execute(sweep, runs, tmp_path, [], baselines, "horovodrun", "horovodrun") == 0
    runs_dir = tmp_path / "runs"
    assert reports == [
        ([runs_dir / "t-dense-seed_0", runs_dir / "t-topk-seed_0"], tmp_path / "report/t-dense-seed_0",
         runs_dir / "t-dense-seed_0"),
        ([runs_dir / "t-dense-seed_1", runs_dir / "t-topk-seed_1"], tmp_path / "report/t-dense-seed_1",
         runs_dir / "t-dense-seed_1")]
    out = capsys.readouterr().out
    assert f"report of 2 run(s) in {tmp_path / 'report/t-dense-seed_1'}: speedups against " \
           "t-dense-seed_1" in out
    with open(tmp_path / "results.csv", newline="") as f:
        rows = {r["name"]: r for r in csv.DictReader(f)}
    assert {n: (r["c"], r["run.seed"], r["baseline"]) for n, r in rows.items()} == {
        "t-dense-seed_0": ("dense", "0", "t-dense-seed_0"), "t-dense-seed_1": ("dense", "1", "t-dense-seed_1"),
        "t-topk-seed_0": ("topk", "0", "t-dense-seed_0"), "t-topk-seed_1": ("topk", "1", "t-dense-seed_1")}


def test_the_seed_summary_is_the_mean_and_sd_over_the_seeds_that_finished(tmp_path):
    """One row per point of the other axes: exact means and sample sds over the finished
    seeds, a failed seed counted out, a missing number left out of its measure only."""
    sweep = sws.parse_sweep({**SEEDS, "grid": {**SEEDS["grid"], "run.seed": [0, 1, 2]}})
    assert swr.seed_axis(sweep).name == "run.seed"

    def row(c, seed, status, wall, top1, speedup):
        return {"name": f"t-{c}-seed_{seed}", "c": c, "run.seed": str(seed), "status": status,
                "metric": "top1", "final_metric": top1, "wall_time_s": wall,
                "mean_samples_per_sec": wall and 1000.0 / wall, "speedup": speedup,
                "comm_saving": None if speedup is None else 10.0, "floats_vs_dense": 0.1}
    rows = [row("dense", 0, "ok", 20.0, 0.75, 1.0), row("dense", 1, "ok", 22.0, 0.70, 1.0),
            row("dense", 2, "ok", 24.0, 0.80, 1.0),
            row("topk", 0, "ok", 10.0, 0.70, 2.0), row("topk", 1, "ok", 11.0, 0.60, None),
            row("topk", 2, "failed", None, None, None)]
    dense, topk = swr.seed_rows(sweep, rows)
    assert (dense["c"], dense["seeds"], dense["metric"]) == ("dense", "3 of 3", "top1")
    assert dense["wall_time_s_mean"] == 22.0 and dense["wall_time_s_sd"] == 2.0
    assert dense["final_metric_mean"] == pytest.approx(0.75, abs=1e-15)
    assert dense["final_metric_sd"] == pytest.approx(0.05, abs=1e-15)
    assert (topk["seeds"], topk["wall_time_s_mean"]) == ("2 of 3", 10.5)
    assert topk["wall_time_s_sd"] == pytest.approx(0.5 ** 0.5, abs=1e-15)
    # One seed's speedup: a mean, no sd.
    assert (topk["speedup_mean"], topk["speedup_sd"]) == (2.0, None)
    swr.write_results(sweep, rows, tmp_path)
    with open(tmp_path / "results_seeds.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert list(table[0])[:5] == ["c", "seeds", "metric", "final_metric_mean", "final_metric_sd"]
    assert [(r["c"], r["seeds"], r["speedup_sd"]) for r in table] == [
        ("dense", "3 of 3", "0.0"), ("topk", "2 of 3", "")]
    md = (tmp_path / "results.md").read_text()
    assert "## Over the seeds (run.seed)" in md
    assert "| topk | 2 of 3 | top1 | 0.65 ± 0.07071 | 10.50 ± 0.71 | 95.5 ± 6.4 | 2.00x | " \
           "10.00x | 0.1 ± 0 |" in md
    # Seeds set by tagged entries count too; a grid without a seed axis has no summary.
    tagged = sws.parse_sweep({**SEEDS, "grid": {"c": SEEDS["grid"]["c"], "s": [
        {"set": {"run.seed": 3}, "tag": "a"}, {"set": {"run.seed": 4}, "tag": "b"}]}})
    assert swr.seed_axis(tagged).name == "s"
    plain = sws.parse_sweep({**SEEDS, "grid": {"c": SEEDS["grid"]["c"], "s": [
        {"set": {"run.seed": 3, "run.steps": 5}}, {"set": {"run.seed": 4}}]}})
    assert swr.seed_axis(plain) is None and swr.seed_rows(plain, rows) == []


def test_report_groups_one_baseline_one_report_and_failed_baselines_apart():
    names = ["d0", "k0", "d1", "k1"]
    baselines = {"d0": "d0", "k0": "d0", "d1": "d1", "k1": "d1"}
    ok = dict.fromkeys(names, "ok")
    assert swr.report_groups(names, ok, dict.fromkeys(names, "d0")) == [("d0", names)]
    assert swr.report_groups(names, {**ok, "d1": "failed"}, baselines) == [
        ("d0", ["d0", "k0"]), (None, ["k1"])]
    assert swr.report_groups(names, ok, dict.fromkeys(names)) == [(None, names)]


def test_too_many_ranks_for_this_host_are_refused_before_any_check(tmp_path, monkeypatch, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**sweep_dict(), "np": 32}))
    asked = []
    monkeypatch.setattr(swx, "local_slots", lambda gpu: asked.append(gpu) or (2, "2 CPU cores"))
    calls = []
    for extra in ([], ["--dry-run"]):
        assert swx.main([str(path), "--out", str(tmp_path / "out"), *extra], check=calls.append) == 2
        assert capsys.readouterr().err == (
            "sweep error: np: 32 (the sweep file's) starts 32 ranks per run on this host, which "
            "has 2 CPU cores; pass --np 2 (or fewer) to run here, or --hostfile FILE to spread "
            "them over the hosts it lists\n")
    assert swx.main([str(path), "--np", "3", "--dry-run"], check=calls.append) == 2
    assert capsys.readouterr().err.startswith("sweep error: --np 3 starts 3 ranks per run")
    assert calls == [] and not (tmp_path / "out").exists()
    assert asked == [False] * 3                      # demo.yaml trains where it can: no GPU here
    hosts = tmp_path / "hosts"
    hosts.write_text("node1 slots=16\nnode2 slots=16\n")
    assert swx.main([str(path), "--dry-run", "--hostfile", str(hosts), "--out",
                     str(tmp_path / "out")], check=lambda args: None) == 0
    assert swx.main([str(path), "--dry-run", "--np", "2", "--out", str(tmp_path / "out")],
                    check=lambda args: None) == 0


def test_this_hosts_slots_are_its_gpus_for_gpu_runs_else_its_cores():
    import os

    import torch

    cores = os.cpu_count() or 1
    assert swx.local_slots(False) == (max(cores, 2), f"{cores} CPU core{'s' if cores != 1 else ''}")
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        assert swx.local_slots(True)[0] == count


def test_a_relative_data_root_on_the_command_line_is_taken_from_the_current_directory(
        tmp_path, monkeypatch):
    assert swx.cli_overrides(["data.root=fake", "data.root=/abs", "data.root=../up"], False,
                             cwd=Path("/home/me")) == [
        ("data.root", "/home/me/fake"), ("data.root", "/abs"), ("data.root", "/home/up")]
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(sweep_dict(grid={"optimizer.lr": [0.1]})))
    monkeypatch.chdir(tmp_path)
    checked = []
    assert swx.main(["s.yaml", "--dry-run", "--set", "data.root=fakedata"],
                    check=lambda args: checked.append(args)) == 0
    assert f"data.root={tmp_path / 'fakedata'}" in checked[0]


def test_a_problem_of_every_run_is_one_line(tmp_path, capsys):
    from gravac.sweep.errors import problem_lines

    assert problem_lines([("a", "bad root"), ("b", "bad root"), ("c", "lr < 0"),
                          ("a", "bad root")], 4) == ["bad root (runs a, b)", "run c: lr < 0"]
    assert problem_lines([("a", "x"), ("b", "x")], 2) == ["x (all 2 runs)"]
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(sweep_dict()))
    missing = tmp_path / "nope"
    assert swx.main([str(path), "--dry-run", "--set", f"data.root={missing}"],
                    check=lambda args: f"config error: data.root={missing}: no such folder") == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"sweep error: config error: data.root={missing}: no such folder (all 6 runs)",
                   "sweep error: 6 of 6 runs invalid; nothing was launched"]


def test_runs_the_grid_lacks_are_named_and_left_alone(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(sweep_dict(grid={"optimizer.lr": [0.1]})))
    out = tmp_path / "out"
    write_metrics(out / "runs/t-lr_0.2", FAKE_RUNS["t-topk"])
    assert swx.main([str(path), "--dry-run", "--overwrite", "--out", str(out)],
                    check=lambda args: None) == 0
    assert f"note: {out / 'runs'} also holds 1 run(s) this sweep does not have (t-lr_0.2); " \
           "they are left as they are, out of the results and the report" in capsys.readouterr().out
    assert (out / "runs/t-lr_0.2/metrics.jsonl").exists()
