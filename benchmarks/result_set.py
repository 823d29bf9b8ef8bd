"""Keep a benchmark's output as a result set: ``docs/results/<name>/`` with the files it
wrote and a README that records the commit, the versions, the machine and the command.

    .venv/bin/python benchmarks/result_set.py NAME --command "CMD" FILE [FILE ...]

    # e.g. after an end-to-end run:
    .venv/bin/python benchmarks/result_set.py cpu_lstm_1gbit_$(date +%F) \\
        --command "sudo .venv/bin/python benchmarks/end_to_end.py --workload lstm ..." \\
        runs/benchmarks/e2e/results.json runs/benchmarks/e2e/results.md

A set is never edited afterwards: an existing NAME is refused. The README's first lines
are written here; what the set shows is for its author to add below them, before naming
the set in ``docs/results/current.yaml`` (``benchmarks/performance.py`` renders the current
sets into docs/PERFORMANCE.md).
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


def _run(*cmd: str) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30,
                              cwd=REPO).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def provenance() -> dict[str, str]:
    """The commit (with "+ uncommitted changes" where the tree differs), the versions and
    the machine, as a result set's README states them."""
    commit = _run("git", "rev-parse", "--short", "HEAD") or "unknown"
    if _run("git", "status", "--porcelain", "--untracked-files=no"):
        commit += " + uncommitted changes"
    versions = [f"Python {platform.python_version()}"]
    for module in ("torch", "horovod", "triton"):
        try:
            versions.append(f"{module} {__import__(module).__version__}")
        except Exception:  # noqa: BLE001 (absent, or a build that does not import here)
            pass
    cpu = ""
    try:
        cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                    if ln.startswith("model name")), "")
    except OSError:
        pass
    mem = ""
    try:
        kib = int(next(ln.split()[1] for ln in open("/proc/meminfo")
                       if ln.startswith("MemTotal")))
        mem = f", {kib / 2 ** 20:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    gpus = _run("nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader")
    machine = f"{cpu or platform.processor() or platform.machine()}, {os.cpu_count()} cores{mem}"
    machine += f"; GPU: {gpus.replace(chr(10), '; ')}" if gpus else "; no GPU"
    return {"commit": commit, "versions": ", ".join(versions), "machine": machine,
            "date": date.today().isoformat()}


def write_result_set(name: str, command: str, files: list[Path],
                     root: Path = RESULTS) -> Path:
    """Make ``root/name`` with ``files`` and its README header; refuse an existing set, a
    bad name or a missing file (before anything is written)."""
    if not NAME.match(name):
        raise SystemExit(f"result_set.py: NAME {name!r}: use letters, digits, '.', '_', '+' "
                         "or '-' (e.g. cpu_lstm_1gbit_2026-12-01)")
    folder = root / name
    if folder.exists():
        raise SystemExit(f"result_set.py: {folder} exists; a result set is never edited "
                         "(give the new measurement a new name)")
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise SystemExit(f"result_set.py: no such file: {', '.join(missing)}")
    names = [f.name for f in files]
    if len(set(names)) != len(names):
        raise SystemExit("result_set.py: two files share a name; copy one under another name")
    p = provenance()
    folder.mkdir(parents=True)
    for f in files:
        shutil.copy2(f, folder / f.name)
    (folder / "README.md").write_text(
        f"# {name}\n\n"
        f"Machine: {p['machine']}. Versions: {p['versions']}. Code: commit {p['commit']}. "
        f"Kept on {p['date']}. The command, from the repository's root:\n\n"
        f"    {command}\n\n"
        f"Files: {', '.join(f'`{n}`' for n in names)}.\n")
    return folder


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", metavar="NAME", help="<workload>_<machine>_<date>")
    parser.add_argument("--command", required=True, help="the command that wrote the files")
    parser.add_argument("files", nargs="+", type=Path, metavar="FILE")
    args = parser.parse_args(argv)
    folder = write_result_set(args.name, args.command, args.files)
    print(f"wrote {folder.relative_to(REPO) if folder.is_relative_to(REPO) else folder}: "
          "add what it shows to its README, then name it in docs/results/current.yaml")
    return 0


if __name__ == "__main__":
    sys.exit(main())
