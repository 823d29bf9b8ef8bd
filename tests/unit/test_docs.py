"""The documentation a user reads: docs/PERFORMANCE.md and README's speed table are what
benchmarks/performance.py makes of the result sets docs/results/current.yaml names, every
set they name is in the repository with its README, no page cites a section number of a
page that moves, and the pages that describe gravac speak of what is, not of when it
came to be (dates belong to result sets and docs/notes/)."""
import json
import re
from pathlib import Path

import pytest

from bench_module import load_benchmark

REPO = Path(__file__).resolve().parents[2]
performance = load_benchmark("performance")

#: The pages that describe gravac as it is.
PAGES = ["README.md", "docs/PERFORMANCE.md", "docs/USAGE.md", "docs/TRAINING.md",
         "docs/ALGORITHM.md", "docs/SCALING.md", "docs/RELIABILITY.md", "docs/HOROVOD.md",
         "docs/DDP_HOOK.md", "docs/LAYOUT.md", "docs/CONFIG.md", "benchmarks/README.md"]
#: Words of a diary: an issue number, a session, a calendar date.
DIARY = re.compile(r"\bissue \d+|\bsessions?\b(?! of (?:its|their) own)|\b20\d\d-\d\d-\d\d\b",
                   re.IGNORECASE)
#: A date inside a result set's or a note's name is its identity, not a diary entry.
NAMED = re.compile(r"[\w./-]*(_20\d\d-\d\d-\d\d|notes/20\d\d-\d\d-[\w.-]+)")


def test_performance_page_and_readme_table_are_generated_from_the_result_sets():
    assert performance.main(["--check"]) == 0, \
        "run .venv/bin/python benchmarks/performance.py and commit what it writes"


def test_every_result_set_named_is_kept_with_its_readme():
    current = performance.load_current()
    named = [e["set"] for e in current["readme"]] + \
        [e["set"] for s in current["sections"] for e in s.get("sets", [])]
    assert named
    for name in named:
        folder = REPO / "docs" / "results" / name
        assert (folder / "README.md").is_file(), f"result set {name}: no README.md"


def test_the_readme_table_links_every_row_to_its_result_set():
    readme = (REPO / "README.md").read_text()
    table = readme.split(performance.BEGIN)[1].split(performance.END)[0]
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    assert len(rows) == len(performance.load_current()["readme"])
    for row in rows:
        assert re.search(r"\]\(docs/results/[\w.-]+/\) \|$", row), row


def _e2e_set(root: Path, name: str, times: dict[str, list[float | None]]) -> None:
    """An end_to_end.py results.json: one rate, one backend, a round per list entry."""
    rounds = {}
    for r in range(len(next(iter(times.values())))):
        runs = {m: {"time_to_target": t[r], "samples_per_sec": 10.0, "final_loss": 2.0,
                    "floats_ratio": 1.0} for m, t in times.items()}
        rounds[f"round{r + 1}"] = {"target": 2.1, "runs": runs}
    (root / name).mkdir(parents=True)
    (root / name / "results.json").write_text(json.dumps({"1gbit": {"torch": rounds}}))


def test_the_choice_table_says_to_use_gravac_only_where_it_beats_the_fastest_peer(
        tmp_path, monkeypatch):
    monkeypatch.setattr(performance, "RESULTS", tmp_path)
    _e2e_set(tmp_path, "wins", {"dense": [100, 100], "horovod_fp16": [60, 70],
                                "gravac_auto": [50, 80]})       # 50/60, 80/70: median 0.99
    _e2e_set(tmp_path, "loses", {"dense": [100, 100], "horovod_fp16": [60, 60],
                                 "gravac_recommended": [None, 50], "gravac_auto": [70, 70]})
    lines = performance.choose_table([
        {"set": "wins", "workload": "A", "link": "1 Gbit/s", "gravac": ["gravac_auto"]},
        {"set": "loses", "workload": "B", "link": "1 Gbit/s",
         "gravac": ["gravac_recommended", "gravac_auto"]}])
    wins, loses = lines[2], lines[3]
    assert "| A | 1 Gbit/s | `gravac_auto` | 0.99x (DDP's fp16 hook) | " \
        "gravac (`gravac_auto`) |" in wins
    # A run that never reached the target counts as infinitely slow in the median: the
    # recommended config's median is never, so auto (70/60) is gravac's fastest, and loses.
    assert "| B | 1 Gbit/s | `gravac_auto` | 1.17x (DDP's fp16 hook) | DDP's fp16 hook |" \
        in loses


@pytest.mark.parametrize("page", PAGES)
def test_pages_speak_of_what_is(page):
    text = NAMED.sub("", (REPO / page).read_text())
    found = [m.group(0) for m in DIARY.finditer(text)]
    assert not found, f"{page}: {found} (dated stories go to docs/notes/)"


def test_no_page_or_code_cites_the_retired_benchmarks_page():
    cited = [str(p.relative_to(REPO)) for p in
             [*REPO.glob("*.md"), *(REPO / "docs").glob("*.md"), *(REPO / "gravac").rglob("*.py"),
              *(REPO / "benchmarks").rglob("*.py"), *(REPO / "configs").rglob("*.yaml")]
             if "BENCHMARKS.md" in p.read_text()]
    assert not cited, f"these cite docs/BENCHMARKS.md, which moved to docs/notes/: {cited}"


@pytest.mark.parametrize("script, argv", [
    ("collectives", []), ("performance", []), ("result_set", []), ("layer_gains", []),
    ("residual_lag", []), ("compressors", []), ("multilevel", []), ("end_to_end", []),
    ("scaling", ["measure-collectives"]),
])
def test_a_benchmarks_help_opens_with_its_whole_first_paragraph(script, argv, capsys):
    """--help's description is the docstring's first paragraph, not its first line (a
    wrapped sentence stopped mid-way), under the name the command was run by."""
    if script == "scaling":       # its measure-collectives subcommand is collectives.py
        load_benchmark("scaling")
        import benchmarks.scaling.cli
        main, doc = benchmarks.scaling.cli.main, load_benchmark("collectives").__doc__
    else:
        bench = load_benchmark(script)
        main, doc = bench.main, bench.__doc__
    with pytest.raises(SystemExit) as stop:
        main([*argv, "--help"])
    assert stop.value.code == 0
    text = capsys.readouterr().out
    if script in ("scaling", "collectives"):    # the others are named by sys.argv[0]
        prog = "benchmarks/scaling measure-collectives" if argv else "collectives.py"
        assert text.startswith(f"usage: {prog} ")
    first = " ".join(doc.split("\n\n")[0].split())
    assert first[-1] in ".?" and first in " ".join(text.split())
