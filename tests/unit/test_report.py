"""gravac.report: reading fake run directories, the summary numbers, plots and the CLI."""
import json

import pytest

from gravac.report import (PLOTS, RunLoadError, build_report, cf_shares,
                           compression_throughput, load_run)
from gravac.report.__main__ import main

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_NAMES = ["metric_vs_step.png", "metric_vs_time.png", "loss_vs_step.png",
             "loss_vs_time.png", "cf_vs_step.png", "cf_density.png", "compression_throughput.png",
             "floats_sent.png"]
LOGGED = range(9, 100, 10)  # step lines every 10 steps: 9, 19, ..., 99

# --------------------------------------------------------------------- fake run dirs


def write_run(path, records, trailer="\n"):
    path.mkdir(parents=True)
    text = "\n".join(json.dumps(r) for r in records) + trailer
    (path / "metrics.jsonl").write_text(text)
    return path


def start(name, controller, model="resnet101", dataset="cifar10", metric="top1"):
    return {"kind": "run_start", "name": name, "time": 0.0, "world_size": 2,
            "controller": controller, "compressor": "none" if controller == "dense" else "topk",
            "model": model, "dataset": dataset, "batch_size": 32, "metric": metric}


def step(k, time, cf, sent, cum, cum_dense, rate=1000.0, theta_min=None, theta_c=None,
         gain_min=None, gain_c=None, dense=1000):
    return {"kind": "step", "step": k, "epoch": 0, "time": time, "loss": 3.0 - k / 50,
            "lr": 0.1, "cf": cf, "sent": sent, "theta_min": theta_min, "theta_c": theta_c,
            "gain_min": gain_min, "gain_c": gain_c, "floats_sent": dense / cf,
            "cum_floats_sent": cum, "dense_floats": dense, "cum_dense_floats": cum_dense,
            "t_compute": 0.01, "t_compress": 0.002, "t_comm": 0.003, "t_iter": 0.02,
            "samples_per_sec": rate}


def top1(k, time, acc):
    return {"kind": "eval", "step": k, "time": time, "loss": 1.0, "top1": acc, "top5": 0.9}


def dense_run(path):
    """100 steps, 2 s each (step k ends at 2(k+1) s), 1000 floats a step; 205 s wall."""
    steps = [step(k, 2.0 * (k + 1), 1.0, "dense", 1000.0 * (k + 1), 1000.0 * (k + 1))
             for k in LOGGED]
    evals = [top1(39, 81.0, 0.55), top1(69, 141.0, 0.62), top1(99, 201.0, 0.60)]
    return write_run(path, [start("resnet-dense", "dense"), *steps, *evals,
                            {"kind": "run_end", "step": 100, "time": 205.0}])


def gravac_cum(k):
    # Steps 0..49 at CF 10 (100 floats each), then CF 20 (50 floats each).
    return 100.0 * (k + 1) if k < 50 else 5000.0 + 50.0 * (k - 49)


def gravac_run(path):
    """CF 10 ("min") then 20 ("candidate"); 82 s wall; 7500 of 100000 floats sent."""
    steps = []
    for n, k in enumerate(LOGGED):
        cf, sent = (10.0, "min") if k < 50 else (20.0, "candidate")
        steps.append(step(k, 0.8 * (k + 1), cf, sent, gravac_cum(k), 1000.0 * (k + 1),
                          rate=2000.0 if n % 2 else 2400.0, theta_min=10.0, theta_c=20.0,
                          gain_min=0.9, gain_c=0.8))
    windows = [
        {"kind": "window", "step": 49, "time": 40.0, "theta_min": 10.0, "theta_c": 20.0,
         "delta_min": 0.9, "delta_c": 0.8, "table": {"10.0": 900.0, "20.0": 1500.0},
         "settled": False},
        # the first record as older trainers wrote it (the 0-based index of the window's
        # last step), the second as now (steps done, and the window's number from 1)
        {"kind": "window", "step": 100, "window": 2, "time": 80.0, "theta_min": 20.0,
         "theta_c": 40.0,
         "delta_min": 0.85, "delta_c": 0.6,
         "table": {"10.0": 950.0, "20.0": 1600.0, "40.0": 1200.0}, "settled": True},
    ]
    evals = [top1(49, 41.0, 0.50), top1(99, 81.0, 0.58), top1(79, 65.0, 0.59)]
    return write_run(path, [start("resnet-gravac", "gravac"), *steps, *windows, *evals,
                            {"kind": "run_end", "step": 100, "time": 82.0}])


def static_run(path):
    """Static CF 100, stopped after step 79 (no run_end): 0.5 s a step, 10 floats a step."""
    steps = [step(k, 0.5 * (k + 1), 100.0, "candidate", 10.0 * (k + 1), 1000.0 * (k + 1),
                  rate=4000.0) for k in LOGGED if k <= 79]
    evals = [top1(39, 20.5, 0.40), top1(79, 39.0, 0.45)]
    return write_run(path, [start("resnet-static", "static"), *steps, *evals])


def lstm_run(path):
    """LSTM with perplexity; CF 10 ("min", gain 0.5) and 20 ("candidate", gain missing)."""
    steps = []
    for n, k in enumerate(LOGGED):
        cf, sent = (10.0, "min") if n % 2 else (20.0, "candidate")
        steps.append(step(k, 1.0 * (k + 1), cf, sent, 75.0 * (k + 1), 1000.0 * (k + 1),
                          rate=100.0 * (n + 1), theta_min=10.0, theta_c=20.0,
                          gain_min=0.5, gain_c=None))
    evals = [{"kind": "eval", "step": k, "time": k + 1.5, "loss": 4.5, "perplexity": ppl}
             for k, ppl in ((29, 150.0), (59, 120.0), (99, 125.0))]
    return write_run(path, [start("lstm-gravac", "gravac", "lstm", "ptb", "perplexity"),
                            *steps, *evals, {"kind": "run_end", "step": 100, "time": 101.0}])


def table_rows(markdown):
    """{run name: {column: cell}} of the first markdown table after '## Summary'."""
    lines = markdown.split("## Summary", 1)[1].strip().splitlines()
    split = lambda line: [c.strip() for c in line.strip().strip("|").split("|")]  # noqa: E731
    header = split(lines[0])
    rows = {}
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        cells = dict(zip(header, split(line)))
        rows[cells["Run"]] = cells
    return rows


def assert_png(path):
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE), path
    assert len(data) > 5000, (path, len(data))


@pytest.fixture(scope="module")
def four_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    dirs = [gravac_run(root / "gravac"), static_run(root / "static"),
            dense_run(root / "dense"), lstm_run(root / "lstm")]
    out = root / "out"
    report = build_report(dirs, out_dir=out)
    return dirs, out, report.read_text()


# ----------------------------------------------------------------------- full report


def test_all_plots_written_as_png(four_runs):
    _, out, _ = four_runs
    assert sorted(PLOTS) == sorted(PNG_NAMES)
    for name in PNG_NAMES:
        assert_png(out / name)
    assert sorted(p.name for p in out.iterdir()) == sorted(PNG_NAMES + ["report.md"])


def test_summary_rows_have_exact_numbers(four_runs):
    _, _, text = four_runs
    rows = table_rows(text)
    assert list(rows) == ["resnet-gravac", "resnet-static", "resnet-dense", "lstm-gravac"]

    g = rows["resnet-gravac"]
    assert (g["Controller"], g["Compressor"], g["Steps"]) == ("gravac", "topk", "100")
    assert g["Wall time (s)"] == "82.0"
    assert (g["Metric"], g["Final"], g["Best"]) == ("top1", "0.5800", "0.5900")
    # Lines at steps 9, 19, ..., 99 alternate 2400 and 2000 samples/s at 0.02 s a step;
    # step 9 stands for itself, each later one for 10 steps: 1 + 4 x 10 steps at 2400 and
    # 5 x 10 at 2000, (41 x 2400 + 50 x 2000) / 91 = 2180.2.
    assert g["Samples/s"] == "2180.2"
    assert g["Floats sent vs dense"] == "0.0750"          # 7500 / 100000
    assert g["Speedup vs baseline"] == "2.50x"            # 205 s / 82 s
    assert g["Comm. saving vs baseline"] == "13.33x"      # 100000 / 7500

    s = rows["resnet-static"]  # stopped at step 79: compared with the baseline there
    assert (s["Steps"], s["Wall time (s)"]) == ("79", "40.0")
    assert (s["Final"], s["Best"], s["Samples/s"]) == ("did not finish", "0.4500",
                                                             "4000.0")
    assert s["Floats sent vs dense"] == "0.0100"          # 800 / 80000
    assert s["Speedup vs baseline"] == "4.00x"            # 160 s / 40 s at step 79
    assert s["Comm. saving vs baseline"] == "100.00x"     # 80000 / 800 at step 79
    assert "resnet-static: compared with the baseline at step 79" in text

    d = rows["resnet-dense"]
    assert (d["Steps"], d["Wall time (s)"], d["Final"], d["Best"]) == (
        "100", "205.0", "0.6000", "0.6200")
    assert d["Floats sent vs dense"] == "1.0000"
    assert (d["Speedup vs baseline"], d["Comm. saving vs baseline"]) == ("1.00x", "1.00x")

    lstm = rows["lstm-gravac"]  # a different model: no speedup against a ResNet baseline
    assert (lstm["Metric"], lstm["Final"], lstm["Best"]) == ("perplexity", "125.00", "120.00")
    assert lstm["Wall time (s)"] == "101.0"
    # 100, 200, ..., 1000 samples/s at steps 9, ..., 99: (100 + 10 x (200 + ... + 1000)) / 91
    assert lstm["Samples/s"] == "594.5"
    assert lstm["Speedup vs baseline"] == lstm["Comm. saving vs baseline"] == "—"
    assert "model lstm differs from the baseline's resnet101" in text


def test_a_killed_runs_last_evaluation_is_not_shown_as_final(tmp_path):
    """A run without run_end (killed at step 79) showed its mid-run evaluation
    as "Final"."""
    from gravac.report.stats import summarize

    run = load_run(static_run(tmp_path / "static"))
    row = summarize(run)
    assert (row.finished, row.final_metric, row.last_eval) == (False, None, (79, 0.45))
    assert summarize(load_run(dense_run(tmp_path / "dense"))).final_metric == 0.60
    text = build_report([tmp_path / "static"], out_dir=tmp_path / "out").read_text()
    assert table_rows(text)["resnet-static"]["Final"] == "did not finish"
    assert ("- resnet-static: the run did not finish (no run_end record); last evaluation "
            "at step 79: top1 0.4500.") in text


def test_report_lists_runs_decisions_and_images(four_runs):
    dirs, _, text = four_runs
    assert text.startswith("# ")
    for d in dirs:
        assert f"`{d}`" in text
    assert "Baseline: **resnet-dense**" in text
    decisions = text.split("## GraVAC decisions", 1)[1].split("## Plots", 1)[0]
    assert "### resnet-gravac" in decisions and "### lstm-gravac" in decisions
    assert "### resnet-static" not in decisions
    # windows numbered from 1 and ended "after step 50", as evaluations count steps
    assert "| Window | After step | θmin | θc | δmin | δc | Settled |" in decisions
    assert "| 1 | 50 | 10 | 20 | 0.9 | 0.8 | no |" in decisions
    assert "| 2 | 100 | 20 | 40 | 0.85 | 0.6 | yes |" in decisions
    assert "No window records logged." in decisions  # the LSTM run has none
    for name in PNG_NAMES:
        assert f"]({name})" in text


# ------------------------------------------------------------------------ statistics


def test_cf_shares_and_throughput(tmp_path):
    gravac = load_run(gravac_run(tmp_path / "g"))
    assert cf_shares(gravac) == {10.0: 0.5, 20.0: 0.5}
    # From the last window's table.
    assert compression_throughput(gravac) == {10.0: 950.0, 20.0: 1600.0, 40.0: 1200.0}
    # No windows: mean of samples/s x gain; CF 10 ("min", gain 0.5) is logged at n = 1,
    # 3, ..., 9 (rates 200, ..., 1000), CF 20 ("candidate", gain missing -> 1) at n = 0,
    # 2, ..., 8 (rates 100, ..., 900).
    lstm = load_run(lstm_run(tmp_path / "l"))
    assert compression_throughput(lstm) == pytest.approx({10.0: 300.0, 20.0: 500.0})
    dense = load_run(dense_run(tmp_path / "d"))
    assert cf_shares(dense) == {1.0: 1.0}
    assert compression_throughput(dense) == {1.0: 1000.0}


def test_single_run_writes_into_its_directory(tmp_path):
    run_dir = gravac_run(tmp_path / "gravac")
    report = build_report([run_dir])
    assert report == run_dir / "report.md"
    for name in PNG_NAMES:
        assert_png(run_dir / name)
    rows = table_rows(report.read_text())
    assert list(rows) == ["resnet-gravac"]
    assert "Speedup vs baseline" not in rows["resnet-gravac"]  # no dense run, no baseline


def test_metric_falls_back_to_eval_lines_and_partial_last_line(tmp_path):
    records = [{k: v for k, v in start("x", "static").items() if k != "metric"},
               step(9, 1.0, 10.0, "candidate", 10.0, 100.0), top1(9, 1.5, 0.3)]
    run_dir = write_run(tmp_path / "x", records, trailer='\n{"kind": "step", "st')
    run = load_run(run_dir)  # the cut-off last line of a killed run is skipped
    assert run.metric == "top1" and len(run.steps) == 1
    assert run.end is None and run.final_step == 9


# ------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("content", [None, "", "\n\n"])
def test_missing_or_empty_metrics_file_is_a_clear_error(tmp_path, content):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if content is not None:
        (run_dir / "metrics.jsonl").write_text(content)
    out = tmp_path / "out"
    with pytest.raises(RunLoadError, match="metrics.jsonl"):
        build_report([dense_run(tmp_path / "dense"), run_dir], out_dir=out)
    assert not out.exists()
    assert sorted(p.name for p in run_dir.iterdir()) == (
        [] if content is None else ["metrics.jsonl"])


def test_cli_error_names_the_file_and_writes_nothing(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with pytest.raises(SystemExit) as exc:
        main([str(run_dir)])
    assert exc.value.code == 2
    assert str(run_dir / "metrics.jsonl") in capsys.readouterr().err
    assert list(run_dir.iterdir()) == []


@pytest.mark.parametrize("line, message", [
    ('{"kind": "step", "step": 5, "loss": "high"}', "field 'loss' should be a number"),
    ('{"kind": "step", "time": 1.0}', "integer 'step'"),
    ("not json", "not valid JSON"),
    ('{"kind": "window", "step": 5, "table": {"ten": 1.0}}', "not a CF number"),
])
def test_malformed_record_names_file_line_and_field(tmp_path, line, message):
    run_dir = tmp_path / "bad"
    run_dir.mkdir()
    good = json.dumps(step(1, 1.0, 10.0, "min", 10.0, 100.0))
    (run_dir / "metrics.jsonl").write_text(
        json.dumps(start("bad", "static")) + "\n" + line + "\n" + good + "\n")
    with pytest.raises(RunLoadError, match=message) as exc:
        load_run(run_dir)
    assert f"{run_dir / 'metrics.jsonl'}:2:" in str(exc.value)


# ------------------------------------------------------------------------------- CLI


def test_cli_with_explicit_baseline(tmp_path, capsys, monkeypatch):
    gravac, static = gravac_run(tmp_path / "gravac"), static_run(tmp_path / "static")
    dense = dense_run(tmp_path / "dense")
    monkeypatch.chdir(tmp_path)  # several runs and no --out: ./report
    assert main([str(gravac), str(static), "--baseline", str(dense), "--dpi", "50"]) == 0
    assert "report.md" in capsys.readouterr().out
    out = tmp_path / "report"
    for name in PNG_NAMES:
        assert (out / name).read_bytes().startswith(PNG_SIGNATURE)
    rows = table_rows((out / "report.md").read_text())
    # The baseline is not among the runs given: it is loaded and shown first.
    assert list(rows) == ["resnet-dense", "resnet-gravac", "resnet-static"]
    assert rows["resnet-gravac"]["Speedup vs baseline"] == "2.50x"
    assert rows["resnet-static"]["Comm. saving vs baseline"] == "100.00x"


def test_loss_plot_uses_a_log_scale(tmp_path):
    """The first steps' loss dwarfs the rest; on a linear axis the curve is flat."""
    from gravac.report.plots import plot_loss

    run = load_run(gravac_run(tmp_path / "g"))
    fig = plot_loss([run])
    assert fig.axes[0].get_yscale() == "log"
    fig = plot_loss([run], "time")
    assert fig.axes[0].get_yscale() == "log"


def test_time_breakdown_is_the_median_of_each_phase(tmp_path):
    """The report's "Where the step time goes" table, medians per phase after
    the first 10 steps; runs without phases (dense baselines) get no row."""
    from gravac.engine.phases import LOCAL_PHASES, WAIT_PHASES
    from gravac.report.stats import time_breakdown

    records = [start("profiled", "static")]
    for k in range(1, 31):
        rec = step(k, 0.1 * k, 40.0, "min", 25.0 * k, 1000.0 * k)
        # Step k spends k ms selecting and 2 ms waiting for the exchange; steps 1-10 are
        # start-up and left out, so the median of steps 11..30 is 20.5 ms.
        rec.update({p: 0.0 for p in LOCAL_PHASES + WAIT_PHASES})
        rec.update(t_select=k / 1000, t_wait_exchange=0.002, t_compress=k / 1000,
                   t_comm=0.002, t_update=0.001)
        records.append(rec)
    run = load_run(write_run(tmp_path / "profiled", records))
    times = time_breakdown(run)
    assert times["t_select"] == pytest.approx(0.0205)
    assert times["t_wait_exchange"] == pytest.approx(0.002)
    assert times["t_update"] == pytest.approx(0.001)
    dense = load_run(dense_run(tmp_path / "dense"))
    assert time_breakdown(dense) is None
    report = tmp_path / "report"
    build_report([tmp_path / "profiled", tmp_path / "dense"], report)
    text = (report / "report.md").read_text()
    assert "## Where the step time goes" in text
    section = text.split("## Where the step time goes")[1].split("\n## ")[0].splitlines()
    row = next(line for line in section if line.startswith("| profiled |"))
    assert "| 20.5 |" in row and "| 2.0 |" in row
    assert not any(line.startswith("| resnet-dense |") for line in section)


def test_exploration_is_the_trials_time_over_the_chosen_methods_median(tmp_path):
    """Auto's trials: every step before the first choice, and a re-check's trial of
    another method (sparse:10 at step 9), against the median step of the chosen fp16
    (1.0 s of 1.0, 1.2, 0.8): 7 steps, 7.7 s, 0.7 s more than fp16 would take."""
    from gravac.report.stats import exploration

    plan = [("fp16", 1.0)] * 3 + [("powersgd:4", 0.2), ("dense", 2.0), ("dense", 2.0),
                                  ("fp16", 1.0), ("fp16", 1.2), ("sparse:10", 0.5),
                                  ("fp16", 0.8)]
    records = [start("auto", "auto")]
    for k, (method, t) in enumerate(plan, start=1):
        rec = step(k, float(k), 1.0, "dense", 1000.0 * k, 1000.0 * k)
        rec.update(method=method, t_iter=t)
        records.append(rec)
    records += [{"kind": "method", "step": k, "time": float(k), "event": "chosen",
                 "method": "fp16", "score": 1.0} for k in (6, 9)]
    run = load_run(write_run(tmp_path / "auto", records))
    cost = exploration(run)
    assert (cost.steps, cost.total_steps) == (7, 10)
    assert cost.seconds == pytest.approx(7.7) and cost.excess == pytest.approx(0.7)
    assert cost.share == pytest.approx(0.7 / 10.7)
    build_report([tmp_path / "auto"], tmp_path / "report")
    text = (tmp_path / "report" / "report.md").read_text()
    assert "Exploration: 7 of 10 steps" in text and "+6.5% of the run's step time" in text
    assert exploration(load_run(dense_run(tmp_path / "dense"))) is None


def test_exploration_from_a_line_every_few_steps_counts_the_steps_it_stands_for(tmp_path):
    """A 20-step run logged every 5 steps, chosen at step 15: the lines at 5, 10, 15 stand
    for 15 exploring steps (counting lines said "3 of 4"), the line at 20 for 5 settled."""
    from gravac.report.stats import exploration

    records = [start("auto", "auto")]
    for k, (method, t) in zip((5, 10, 15, 20), [("fp16", 1.0), ("dense", 2.0),
                                                 ("powersgd:4", 0.5), ("fp16", 1.0)]):
        rec = step(k, float(k), 1.0, "dense", 1000.0 * k, 1000.0 * k)
        rec.update(method=method, t_iter=t)
        records.append(rec)
    records.append({"kind": "method", "step": 15, "time": 15.0, "event": "chosen",
                    "method": "fp16", "score": 1.0})
    run = load_run(write_run(tmp_path / "auto", records))
    cost = exploration(run)
    assert (cost.steps, cost.total_steps, cost.stride) == (15, 20, 5)
    assert cost.seconds == pytest.approx(17.5) and cost.excess == pytest.approx(2.5)
    build_report([tmp_path / "auto"], tmp_path / "report")
    text = (tmp_path / "report" / "report.md").read_text()
    assert "Exploration: 15 of 20 steps" in text
    assert "(estimated from a step line every 5 steps: run.log_interval)." in text


def test_a_split_method_event_names_the_layers_it_sends_dense(tmp_path):
    records = [start("auto", "auto"), step(1, 1.0, 1.0, "min", 10.0, 1000.0)]
    records[1].update(method="sparse:40/split")
    records.append({"kind": "method", "step": 1, "time": 1.0, "event": "split",
                    "method": "sparse:40/split", "dense_layers": ["rnn.weight_hh_l1"],
                    "gain": 0.91, "reason": "sparse:40's gain 0.69 is below epsilon=0.7"})
    build_report([write_run(tmp_path / "auto", records)], tmp_path / "report")
    text = (tmp_path / "report" / "report.md").read_text()
    assert ("| 1 | split | sparse:40/split | — | 0.910 | — | — | sparse:40's gain 0.69 is "
            "below epsilon=0.7; sent dense: rnn.weight_hh_l1 |") in text


def test_the_method_table_shows_the_lag_only_where_it_was_measured(tmp_path):
    records = [start("auto", "auto"), step(1, 1.0, 1.0, "min", 10.0, 1000.0)]
    records.append({"kind": "method", "step": 5, "time": 1.0, "event": "measured",
                    "method": "powersgd:4", "t": 0.05, "gain": 0.42, "lag": 0.031,
                    "steps": 4})
    records.append({"kind": "method", "step": 9, "time": 2.0, "event": "measured",
                    "method": "sparse:10", "t": 0.5, "gain": 0.61, "steps": 4})
    build_report([write_run(tmp_path / "auto", records)], tmp_path / "report")
    text = (tmp_path / "report" / "report.md").read_text()
    assert "| Next CF's gain | Lag | Score |" in text
    assert "| 5 | measured | powersgd:4 | 50.0 | 0.420 | — | 0.031 | — |  |" in text
    assert "| 9 | measured | sparse:10 | 500.0 | 0.610 | — | — | — |  |" in text
    records.pop(2)
    build_report([write_run(tmp_path / "no_lag", records)], tmp_path / "report2")
    assert "Lag" not in (tmp_path / "report2" / "report.md").read_text()


def test_throughput_is_samples_over_the_logged_steps_time():
    # Two logged steps of 64 samples, 0.1 s and 0.9 s: 128 samples in 1 s. The mean of
    # their rates (640 and 71.1 samples/s) said 355.6.
    from gravac.report.stats import throughput

    class _Run:
        steps = [{"step": 1, "samples_per_sec": 640.0, "t_iter": 0.1},
                 {"step": 2, "samples_per_sec": 64 / 0.9, "t_iter": 0.9}]
    assert throughput(_Run()) == pytest.approx(128.0)


def test_throughput_weighs_each_logged_step_by_the_steps_it_stands_for():
    # One line every 5 steps: step 1 (0.8 s, first-use costs) stands for itself, steps 5
    # and 10 (0.02 s) for 4 and 5 steps: 10 x 64 samples in 0.8 + 9 x 0.02 = 0.98 s. The
    # logged steps alone said 3 x 64 / 0.84 = 228.6 samples/s.
    from gravac.report.stats import throughput

    class _Run:
        steps = [{"step": 1, "samples_per_sec": 64 / 0.8, "t_iter": 0.8},
                 {"step": 5, "samples_per_sec": 64 / 0.02, "t_iter": 0.02},
                 {"step": 10, "samples_per_sec": 64 / 0.02, "t_iter": 0.02}]
    assert throughput(_Run()) == pytest.approx(640 / 0.98)


def _timed_run(path, name, controller, steps, per_step, end_time):
    """Step lines every 10 steps at ``per_step`` s a step, 1000 floats a step (CF 10 off
    dense), and run_end at ``end_time``: after the final evaluation and checkpoint."""
    cf = 1.0 if controller == "dense" else 10.0
    lines = [step(k, per_step * k, cf, "dense" if cf == 1.0 else "candidate",
                  1000.0 / cf * k, 1000.0 * k) for k in range(10, steps + 1, 10)]
    return write_run(path, [start(name, controller), *lines, top1(steps, end_time, 0.5),
                            {"kind": "run_end", "step": steps, "time": end_time}])


def test_runs_of_different_lengths_are_timed_when_both_had_done_the_shorter_ones_steps(
        tmp_path):
    """The shorter run's time at its last step was run_end's, which holds its final
    evaluation and checkpoint, while the longer run's was its step line's: a run whose
    final evaluation took 8 s showed 100 / 58 = 1.72x against a baseline twice as slow."""
    from gravac.report.stats import speedup, summarize

    # Baseline: 100 steps at 2 s (step 50 done at 100 s), run_end at 205 s.
    base = load_run(_timed_run(tmp_path / "dense", "dense", "dense", 100, 2.0, 205.0))
    # 50 steps at 1 s (step 50 done at 50 s), then 8 s of final evaluation and checkpoint.
    short = load_run(_timed_run(tmp_path / "short", "short", "static", 50, 1.0, 58.0))
    row = summarize(short, base)
    assert (row.compared_at, row.speedup) == (50, 100.0 / 50.0)
    assert row.comm_saving == 50000.0 / 5000.0
    # The same with the baseline the shorter one: its final 10 s are left out too.
    long_ = load_run(_timed_run(tmp_path / "long", "long", "static", 100, 1.0, 108.0))
    short_base = load_run(_timed_run(tmp_path / "dense50", "dense50", "dense", 50, 2.0, 110.0))
    assert speedup(long_, short_base) == 100.0 / 50.0
    # Equal lengths still compare wall times, both with their final evaluation.
    assert speedup(long_, base) == 205.0 / 108.0


def test_a_long_runs_window_and_method_tables_list_both_ends_and_say_what_is_left_out(
        tmp_path):
    """A 500k-step run has a thousand windows: the report lists the first and last
    LISTED_ROWS and says how many are in metrics.jsonl only."""
    from gravac.report.summary import LISTED_ROWS, decisions_section, method_section

    n = 2 * LISTED_ROWS + 7
    windows = [{"kind": "window", "step": 10 * w, "window": w, "time": float(w),
                "theta_min": 10.0, "theta_c": 20.0, "delta_min": 0.9, "delta_c": 0.8,
                "table": {"10.0": 1.0}, "settled": False} for w in range(1, n + 1)]
    events = [{"kind": "method", "step": w, "time": float(w), "event": "measured",
               "method": "fp16", "t": 0.5, "gain": 1.0} for w in range(1, n + 1)]
    steps = [step(k, float(k), 10.0, "min", k, 10 * k) for k in (1, 10 * n)]
    run = load_run(write_run(tmp_path / "long", [start("long", "gravac"), *steps, *windows,
                                                  *events, {"kind": "run_end", "step": 10 * n,
                                                            "time": float(n)}]))
    for lines, kind in ((decisions_section(run), "window"), (method_section(run), "method")):
        rows = [line for line in lines if line.startswith("| ") and line[2].isdigit()]
        assert len(rows) == 2 * LISTED_ROWS
        assert rows[0].startswith("| 1 |") and rows[-1].startswith(f"| {n} |")
        gap = [line for line in lines if line.startswith("| ... 7 more |")]
        assert len(gap) == 1 and lines.index(gap[0]) == lines.index(rows[LISTED_ROWS - 1]) + 1
        assert f'7 of {n} rows left out here; every one is a `"kind": "{kind}"` line of ' \
               "metrics.jsonl." in lines
    short = load_run(gravac_run(tmp_path / "g"))
    assert not any("left out" in line for line in decisions_section(short))
