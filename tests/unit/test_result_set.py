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


@pytest.mark.parametrize("name, files, message", [
    ("bad name", ["a"], "NAME 'bad name'"),
    ("ok", ["missing.json"], "no such file"),
    ("exists", ["a"], "is never edited"),
])
def test_bad_input_is_refused_before_anything_is_written(tmp_path, name, files, message):
    (tmp_path / "a").write_text("x")
    root = tmp_path / "results"
    (root / "exists").mkdir(parents=True)
    before = sorted(p.name for p in root.iterdir())
    with pytest.raises(SystemExit, match=message):
        result_set.write_result_set(name, "cmd", [tmp_path / f for f in files], root=root)
    assert sorted(p.name for p in root.iterdir()) == before
