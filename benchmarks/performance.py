"""docs/PERFORMANCE.md and README.md's speed table, generated from the result sets under
docs/results/ that docs/results/current.yaml names, section by section.

    .venv/bin/python benchmarks/performance.py            # rewrite both
    .venv/bin/python benchmarks/performance.py --check    # exit 1 if either is stale

A result set is a folder that one benchmark invocation wrote and that is never edited
afterwards: its README.md (the machine, the commit, the command, what it shows) and its
data. ``current.yaml`` says which sets are the current numbers; this script renders them:

* ``e2e`` sets (``benchmarks/end_to_end.py``'s ``results.json``): per workload and link,
  each method's samples/s and time to dense's target loss against dense and against the
  fastest method a user would run instead (dense, fp16, DDP's PowerSGD), its final loss
  against dense's and the floats it sent; the README table condenses them. A set measured
  under both launchers is listed once per launcher (``backend: horovod`` or ``torch``):
  each launcher's rounds have their own peers;
* ``gpu`` sets (``benchmarks/cuda_check.sh``): the step breakdown, the compressors against
  one pass and the batched paths;
* ``table`` sets: their ``results.md`` (or ``file``) as the benchmark printed it;
* ``choose`` sections: per e2e set, the fastest method to dense's target, gravac's best
  configuration against the fastest alternative, and so which one to use there;
* ``text`` sections: their introduction only (how the numbers are measured).

Every number links to its set; nothing here is typed by hand.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"
PERFORMANCE = REPO / "docs" / "PERFORMANCE.md"
README = REPO / "README.md"
#: README's generated block lies between these lines.
BEGIN = "<!-- speed table: benchmarks/performance.py writes it -->"
END = "<!-- end of the speed table -->"
#: What a user would run instead of gravac (end_to_end.py's method names).
PEERS = ("dense", "horovod_fp16", "ddp_powersgd_rank1", "ddp_powersgd_rank4")
PEER_NAMES = {"dense": "dense DDP", "horovod_fp16": "DDP's fp16 hook",
              "ddp_powersgd_rank1": "DDP PowerSGD rank 1",
              "ddp_powersgd_rank4": "DDP PowerSGD rank 4"}
#: The same methods' names under horovodrun, where end_to_end.py runs Horovod's own.
HOROVOD_PEER_NAMES = {"dense": "Horovod dense", "horovod_fp16": "Horovod fp16"}


def peer_name(method: str, backend: str | None = None) -> str:
    return (HOROVOD_PEER_NAMES if backend == "horovod" else PEER_NAMES).get(method, method)


#: What each kind of section renders from its sets' folders, and the keys its entries need
#: (a ``readme`` entry is a ``choose`` one: the same keys, the same file).
KIND_FILES = {"e2e": ("results.json",), "choose": ("results.json",), "table": (),
              "gpu": ("gpu_step.json", "compressors.json", "batched_paths.json"), "text": ()}
KIND_KEYS = {"e2e": ("set", "workload", "link"), "choose": ("set", "workload", "link", "gravac"),
             "table": ("set",), "gpu": ("set",), "text": ()}


def load_current() -> dict:
    """current.yaml, checked (``check_current``): a bad one stops in one line naming it."""
    path = RESULTS / "current.yaml"
    try:
        current = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SystemExit(f"{path.relative_to(REPO)}: {' '.join(str(exc).split())}") from None
    check_current(current)
    return current


def check_current(current, root: Path | None = None) -> None:
    """Every entry of current.yaml of the shape its section renders, naming a result set
    that holds what it reads; else SystemExit, one line naming the entry (before anything
    is rendered, not a KeyError or a missing file halfway through)."""
    root = RESULTS if root is None else root
    where = "docs/results/current.yaml"

    def fail(entry_name: str, problem: str):
        raise SystemExit(f"{where}: {entry_name}: {problem}")

    def check_entry(name: str, entry, kind: str) -> None:
        if not isinstance(entry, dict):
            fail(name, f"{entry!r} is not a mapping; write it as {{set: NAME, ...}}")
        missing = [k for k in KIND_KEYS[kind] if k not in entry]
        if missing:
            fail(name, f"needs {', '.join(missing)} (a {kind} entry has "
                       f"{', '.join(KIND_KEYS[kind])})")
        if "gravac" in KIND_KEYS[kind] and (not isinstance(entry["gravac"], list)
                                            or not entry["gravac"]):
            fail(name, f"gravac: {entry['gravac']!r} is not a list of end_to_end.py methods")
        folder = root / str(entry["set"])
        if not folder.is_dir():
            fail(name, f"no result set docs/results/{entry['set']}/ (a typo, or "
                       "a set not kept yet: benchmarks/result_set.py)")
        files = KIND_FILES[kind] + ((entry.get("file", "results.md"),) if kind == "table" else ())
        for file in files:
            if not (folder / file).is_file():
                fail(name, f"set {entry['set']} has no {file} (a {kind} section reads it)")

    if not isinstance(current, dict) or not isinstance(current.get("sections"), list) \
            or not isinstance(current.get("readme"), list):
        fail("top level", "needs the lists readme: and sections:")
    for i, entry in enumerate(current["readme"]):
        check_entry(f"readme entry {i + 1}", entry, "choose")
    for i, section in enumerate(current["sections"]):
        name = f"section {i + 1}"
        if not isinstance(section, dict) or section.get("kind") not in KIND_KEYS \
                or not section.get("title"):
            fail(name, f"needs a title and a kind ({', '.join(KIND_KEYS)})")
        name = f"section {i + 1} ({section['title']!r})"
        sets = section.get("sets", [])
        if not isinstance(sets, list) or (section["kind"] != "text" and not sets):
            fail(name, "sets: must be a list of entries")
        for j, entry in enumerate(sets):
            check_entry(f"{name}, set {j + 1}", entry, section["kind"])


def _link(name: str, from_readme: bool = False) -> str:
    return f"[{name}]({'docs/' if from_readme else ''}results/{name}/)"


def _rounds(result_set: str, backend: str | None = None) -> list[dict]:
    """Every (rate, backend, round) block of an end_to_end.py results.json; ``backend``:
    that launcher's only, which a set measured under both must name (each launcher's
    rounds have their own peers)."""
    data = json.loads((RESULTS / result_set / "results.json").read_text())
    measured = sorted({b for backends in data.values() for b in backends})
    if backend is None and len(measured) > 1:
        raise SystemExit(f"docs/results/current.yaml: {result_set} holds the backends "
                         f"{measured}; give its entry a backend: {' or '.join(measured)}")
    if backend is not None and backend not in measured:
        raise SystemExit(f"docs/results/current.yaml: {result_set} has no backend "
                         f"{backend!r} (it holds {measured})")
    # A one-round invocation writes its block without a round's key.
    return [{"rate": rate, "backend": b, "round": name, **block}
            for rate, backends in data.items() for b, rounds in backends.items()
            if backend is None or b == backend
            for name, block in sorted(({"round1": rounds} if "runs" in rounds
                                       else rounds).items())]


def _ratio(values: list[float | None]) -> str:
    """'0.38x' or '0.38-0.41x' over the rounds; 'never' when one never got there."""
    if any(v is None for v in values):
        return "never" if all(v is None for v in values) else \
            f"{_ratio([v for v in values if v is not None])}, never once"
    low, high = min(values), max(values)
    return f"{low:.2f}x" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f}x"


def _pct(values: list[float]) -> str:
    low, high = min(values), max(values)
    text = f"{100 * low:+.1f}%"
    return text if f"{low:.3f}" == f"{high:.3f}" else f"{text} to {100 * high:+.1f}%"


def _share(values: list[float]) -> str:
    """'0.082' or '0.082-0.090' over the rounds: a method whose choices differ between
    rounds sends different shares, and the lowest alone understated what it sent (0.101
    where the other round sent 0.842)."""
    low, high = f"{min(values):.3f}", f"{max(values):.3f}"
    return low if low == high else f"{low}-{high}"


def e2e_rows(result_set: str, backend: str | None = None) -> list[dict]:
    """Per method: its ratios over the rounds (time to target and samples/s vs dense,
    time to target vs the best peer of each round, final loss vs dense, floats sent);
    ``backend``: one launcher's rounds (``_rounds``)."""
    rounds = _rounds(result_set, backend)
    methods = list(rounds[0]["runs"])
    rows = []
    for method in methods:
        ttt, sps, vs_peer, loss, floats, peers = [], [], [], [], [], []
        for block in rounds:
            runs = block["runs"]
            dense, mine = runs["dense"], runs.get(method)
            if mine is None:
                continue
            reached = {m: r["time_to_target"] for m, r in runs.items()
                       if m in PEERS and r.get("time_to_target") is not None}
            best = min(reached, key=reached.get)
            peers.append(best)
            t = mine.get("time_to_target")
            ttt.append(None if t is None else t / dense["time_to_target"])
            vs_peer.append(None if t is None else t / reached[best])
            sps.append(mine["samples_per_sec"] / dense["samples_per_sec"])
            loss.append(mine["final_loss"] / dense["final_loss"] - 1)
            floats.append(mine["floats_ratio"])
        rows.append({"method": method, "ttt": ttt, "sps": sps, "vs_peer": vs_peer,
                     "loss": loss, "floats": floats, "peers": peers,
                     "rounds": len(ttt)})
    return rows


def e2e_table(entry: dict) -> list[str]:
    backend = entry.get("backend")
    rows = e2e_rows(entry["set"], backend)
    peers = sorted({peer_name(p, backend) for r in rows for p in r["peers"]})
    lines = [f"#### {entry['workload']}, {entry['link']} ({_link(entry['set'])})", "",
             f"{rows[0]['rounds']} round{'s' if rows[0]['rounds'] > 1 else ''}; the "
             f"fastest peer to dense's target loss: "
             f"{', '.join(peers)}. Lower is faster for time to target.", "",
             "| method | samples/s vs dense | time to target vs dense | vs the fastest peer "
             "| final loss vs dense | floats sent / dense |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['method']} | {_ratio(r['sps'])} | {_ratio(r['ttt'])} | "
                     f"{_ratio(r['vs_peer'])} | {_pct(r['loss'])} | "
                     f"{_share(r['floats'])} |")
    return lines + [""]


def readme_table(entries: list[dict]) -> list[str]:
    """One row per workload and link: gravac's best configuration against dense and
    against the fastest peer, over the rounds."""
    lines = ["| workload | link | gravac (best of its configs) | time to dense's target "
             "vs dense | vs the fastest alternative | final loss vs dense | result set |",
             "|---|---|---|---:|---:|---:|---|"]
    for entry in entries:
        backend = entry.get("backend")
        rows = {r["method"]: r for r in e2e_rows(entry["set"], backend)}
        ours = [rows[m] for m in entry["gravac"] if m in rows]
        best = min(ours, key=lambda r: max((v for v in r["ttt"] if v is not None),
                                           default=float("inf")))
        peer = sorted({peer_name(p, backend) for p in best["peers"]})
        lines.append(f"| {entry['workload']} | {entry['link']} | `{best['method']}` | "
                     f"{_ratio(best['ttt'])} | {_ratio(best['vs_peer'])} "
                     f"({', '.join(peer)}) | {_pct(best['loss'])} | "
                     f"{_link(entry['set'], from_readme=True)} |")
    return lines


def _median(values: list[float | None]) -> float:
    """The median over the rounds, a round that never reached the target counting as
    infinitely slow."""
    ordered = sorted(float("inf") if v is None else v for v in values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def choose_table(entries: list[dict]) -> list[str]:
    """Per workload and link: gravac's fastest configuration to dense's target, its time
    against the fastest alternative of each round (the median over the rounds), and what to
    use there: gravac where that median is at most 1, else the alternative with the lowest
    median time."""
    lines = ["| workload | link | gravac's fastest | time to dense's target vs the fastest "
             "alternative (median of the rounds) | use | result set |",
             "|---|---|---|---:|---|---|"]
    for entry in entries:
        backend = entry.get("backend")
        rows = e2e_rows(entry["set"], backend)
        ours = min((r for r in rows if r["method"] in entry["gravac"]),
                   key=lambda r: _median(r["ttt"]))
        peer = min((r for r in rows if r["method"] in PEERS), key=lambda r: _median(r["ttt"]))
        versus = _median(ours["vs_peer"])
        against = ", ".join(sorted({peer_name(p, backend) for p in ours["peers"]}))
        use = f"gravac (`{ours['method']}`)" if versus <= 1.0 else \
            peer_name(peer["method"], backend)
        lines.append(f"| {entry['workload']} | {entry['link']} | `{ours['method']}` | "
                     f"{'never' if versus == float('inf') else f'{versus:.2f}x'} "
                     f"({against}) | {use} | {_link(entry['set'])} |")
    return lines + [""]


def gpu_section(entry: dict) -> list[str]:
    folder = RESULTS / entry["set"]
    step = json.loads((folder / "gpu_step.json").read_text())
    lines = [f"Device: {step['device']} ({_link(entry['set'])}).", "",
             "| model, batch | method | compression of the step (ms) | share | selection "
             "| residual | pack+unpack |", "|---|---|---:|---:|---:|---:|---:|"]
    for name in ("gpu_step.json", "gpu_step_large.json"):
        path = folder / name
        if not path.is_file():
            continue
        for r in json.loads(path.read_text())["results"]:
            if r["method"] in ("plain", "dense"):
                continue
            lines.append(f"| {r['model']}, {r['batch']} | {r['method']} | {r['compress']:.2f} "
                         f"of {r['step']:.1f} | {100 * r['share']:.1f}% | {r['t_select']:.2f} "
                         f"| {r['t_residual']:.2f} | {r['t_pack'] + r['t_unpack']:.2f} |")
    comp = json.loads((folder / "compressors.json").read_text())
    lines += ["", "Selection against one pass over the tensor (CUDA events, median):", "",
              "| compressor | entries | CF | ms | / one pass |", "|---|---:|---:|---:|---:|"]
    for r in comp["rows"]:
        if r.get("n") == 100_000_000 and "median_ms" in r:
            lines.append(f"| {r['compressor']} | {r['n']:,} | {r['cf']:g} | "
                         f"{r['median_ms']:.3f} | {r['per_pass']:.2f}x |")
    paths = json.loads((folder / "batched_paths.json").read_text())
    lines += ["", "The step's batched paths against the per-layer loops they replace, each "
              "alone (wall-clock median, ms):", "", "| model | what | ms |", "|---|---|---:|"]
    for model, r in paths["results"].items():
        for what, ms in r["rows"].items():
            lines.append(f"| {model} | {what} | {ms:.3f} |")
    return lines + [""]


def table_section(entry: dict) -> list[str]:
    text = (RESULTS / entry["set"] / entry.get("file", "results.md")).read_text()
    body = []
    for line in text.splitlines():
        if line.startswith("# "):
            continue
        if line.startswith("|") and body and body[-1] and not body[-1].startswith("|"):
            body.append("")      # a table needs a blank line after a paragraph line
        body.append(line)
    return [f"({_link(entry['set'])})", "", *body, ""]


def performance_md(current: dict) -> str:
    lines = ["# Performance", "",
             "Generated by `benchmarks/performance.py` from the result sets that "
             "`docs/results/current.yaml` names; each set's README says the machine, the "
             "commit and the command. Do not edit by hand.", ""]
    for section in current["sections"]:
        lines += [f"## {section['title']}", ""]
        if section.get("intro"):
            lines += [section["intro"].strip(), ""]
        if section["kind"] == "choose":
            lines += choose_table(section["sets"])
            continue
        render = {"e2e": e2e_table, "gpu": gpu_section, "table": table_section}
        for entry in section.get("sets", []):
            lines += render[section["kind"]](entry)
    return "\n".join(lines).rstrip() + "\n"


def readme_with_table(current: dict, readme: str) -> str:
    if BEGIN not in readme or END not in readme:
        raise SystemExit(f"README.md has no speed-table markers ({BEGIN} ... {END})")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    table = readme_table(current["readme"])
    return head + BEGIN + "\n" + "\n".join(table) + "\n" + END + tail


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if docs/PERFORMANCE.md or README's table is stale")
    args = parser.parse_args(argv)
    current = load_current()
    want = {PERFORMANCE: performance_md(current),
            README: readme_with_table(current, README.read_text())}
    stale = [p for p, text in want.items() if not p.is_file() or p.read_text() != text]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(REPO)} is stale: run .venv/bin/python "
                  "benchmarks/performance.py", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(want[path])
        print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
