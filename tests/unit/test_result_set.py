"""benchmarks/result_set.py: a result set records where its numbers came from and is never
edited afterwards; bad input is refused before anything is written."""
import pytest

from bench_module import load_benchmark

result_set = load_benchmark("result_set")


def test_a_result_set_holds_its_files_and_their_provenance(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.json").write_text("{}")
    (out / "results.md").write_text("| a |\n")
    folder = result_set.write_result_set("cpu_x_2026-12-01", "python bench.py --x",
                                         [out / "results.json", out / "results.md"],
                                         root=tmp_path / "results")
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "results.json",
                                                        "results.md"]
    readme = (folder / "README.md").read_text()
    assert readme.startswith("# cpu_x_2026-12-01\n")
    assert "Code: commit " in readme and "Versions: Python " in readme and "torch " in readme
    assert " cores" in readme and "\n    python bench.py --x\n" in readme


@pytest.mark.parametrize("name, files, command, message", [
    ("bad name", ["a"], "cmd", "NAME 'bad name'"),
    ("ok", ["missing.json"], "cmd", "no such file"),
    ("exists", ["a"], "cmd", "is never edited"),
    ("ok", ["a", "run"], "cmd", "run: a directory, not a file; name the files in it"),
    ("ok", ["a", "README.md"], "cmd", "a kept file is named README.md"),
    ("ok", ["a"], " ", "--command is empty"),
])
def test_bad_input_is_refused_before_anything_is_written(tmp_path, name, files, command,
                                                         message):
    (tmp_path / "a").write_text("x")
    (tmp_path / "README.md").write_text("the benchmark's own notes")
    (tmp_path / "run").mkdir()
    root = tmp_path / "results"
    (root / "exists").mkdir(parents=True)
    before = sorted(p.name for p in root.iterdir())
    with pytest.raises(SystemExit, match=message) as stop:
        result_set.write_result_set(name, command, [tmp_path / f for f in files], root=root)
    assert "\n" not in str(stop.value)
    assert sorted(p.name for p in root.iterdir()) == before


def test_a_benchmark_keeps_its_files_and_printed_tables_with_the_command(tmp_path,
                                                                        monkeypatch, capsys):
    monkeypatch.setattr(result_set, "RESULTS", tmp_path)
    monkeypatch.setattr(result_set.sys, "argv", [str(result_set.REPO / "benchmarks/x.py"),
                                                 "--rates", "1gbit", "--label", "a b"])
    monkeypatch.delenv("SUDO_USER", raising=False)
    (tmp_path / "out.json").write_text("{}")
    monkeypatch.setattr(result_set, "_STARTED_FROM", None)     # restored afterwards
    monkeypatch.setattr(result_set, "provenance", lambda: {
        "commit": "abc1234", "versions": "Python 3", "machine": "m", "date": "2026-12-01"})
    result_set.add_argument(result_set.argparse.ArgumentParser())     # the run starts
    monkeypatch.setattr(result_set, "provenance", lambda: {
        "commit": "def5678", "versions": "Python 3", "machine": "m", "date": "2026-12-01"})
    result_set.check_name("cpu_x_2026-12-01")
    with result_set.recording_stdout() as printed:
        print("| table |")
    assert capsys.readouterr().out == "| table |\n"     # still printed
    folder = result_set.keep("cpu_x_2026-12-01", [tmp_path / "out.json"],
                             {"results.md": printed.getvalue()})
    assert (folder / "results.md").read_text() == "| table |\n"
    assert (folder / "out.json").read_text() == "{}"
    readme = (folder / "README.md").read_text()
    assert "benchmarks/x.py --rates 1gbit --label 'a b'\n" in readme
    assert "commit abc1234" in readme      # what ran, not what was committed meanwhile
    assert str(result_set.REPO) not in readme.split("Files:")[0].split("command")[1]
    assert result_set.keep(None, [tmp_path / "out.json"]) is None
    with pytest.raises(SystemExit, match="is never edited"):
        result_set.check_name("cpu_x_2026-12-01")


def test_the_command_of_a_run_under_sudo_says_so(monkeypatch):
    monkeypatch.setenv("SUDO_USER", "someone")
    monkeypatch.setattr(result_set.os, "geteuid", lambda: 0)
    assert result_set.invocation(["benchmarks/end_to_end.py", "--rounds", "2"]).startswith(
        "sudo ")
    assert result_set.invocation(["benchmarks/end_to_end.py"]).endswith(
        "benchmarks/end_to_end.py")


@pytest.mark.parametrize("script, args, expect", [
    ("compressors.py", ["--sizes", "20000", "--cfs", "10", "--repeats", "1",
                        "--compressors", "topk", "randomk"], ["| topk | 20,000 | 10 |"]),
    # Part 2 drives the engine's own selection and gains round (1 Horovod rank): it breaks
    # when the engine's interface moves, which is what this catches.
    ("multilevel.py", ["--models", "lstm", "--compressors", "randomk", "--repeats", "1"],
     ["| lstm | 51,034,000 (10) | randomk |", "GraVAC compression phase", "| lstm | randomk |"]),
])
def test_the_cpu_benchmarks_run_and_refuse_a_taken_result_set(script, args, expect):
    import subprocess
    import sys
    run = subprocess.run([sys.executable, str(result_set.REPO / "benchmarks" / script), *args],
                         capture_output=True, text=True, cwd=result_set.REPO)
    assert run.returncode == 0, run.stderr[-2000:]
    for text in expect:
        assert text in run.stdout
    taken = next(p.name for p in result_set.RESULTS.iterdir() if p.is_dir())
    refused = subprocess.run([sys.executable, str(result_set.REPO / "benchmarks" / script),
                              *args, "--result-set", taken],
                             capture_output=True, text=True, cwd=result_set.REPO)
    assert refused.returncode == 1 and "is never edited" in refused.stderr
    assert refused.stdout == ""                        # refused before measuring


@pytest.mark.parametrize("script, args, message", [
    ("compressors", ["--compressors", "nosuch"], "'nosuch' is not a sparsifier; choose from "
                                                 "topk, dgc, redsync, randomk, none"),
    ("compressors", ["--compressors", "powersgd"], "'powersgd' is not a sparsifier (low rank"),
    ("compressors", ["--compressors", "torch.topk"], "with --device cuda only"),
    ("compressors", ["--cfs", "10", "0"], "argument --cfs: each must be >= 1"),
    ("compressors", ["--json", "/missing/dir/x.json"], "no folder /missing/dir to write x.json"),
    ("multilevel", ["--compressors", "nosuch"], "invalid choice: 'nosuch'"),
    ("multilevel", ["--compressors", "none"], "invalid choice: 'none'"),
    ("multilevel", ["--theta-min", "100", "--theta-c", "10"], "10 is below --theta-min 100"),
])
def test_the_cpu_benchmarks_refuse_bad_options_in_one_line_before_measuring(
        script, args, message, capsys):
    bench = load_benchmark(script)
    with pytest.raises(SystemExit) as stop:
        bench.main(args)
    assert stop.value.code == 2
    out, err = capsys.readouterr()
    assert message in err.splitlines()[-1] and out == ""
