"""Keep a benchmark's output as a result set: ``docs/results/<name>/`` with the files it
wrote and a README that records the commit, the versions, the machine and the command.

    .venv/bin/python benchmarks/result_set.py NAME --command "CMD" FILE [FILE ...]

    # e.g. after an end-to-end run:
    .venv/bin/python benchmarks/result_set.py cpu_lstm_1gbit_$(date +%F) \\
        --command "sudo .venv/bin/python benchmarks/end_to_end.py --workload lstm ..." \\
        runs/benchmarks/e2e/results.json runs/benchmarks/e2e/results.md

The benchmarks keep their own output this way when given ``--result-set NAME``
(``add_argument``, ``check_name`` before the work, ``keep`` after it), recording the
command as it was typed.

A set is never edited afterwards: an existing NAME is refused. The README's first lines
are written here; what the set shows is for its author to add below them, before naming
the set in ``docs/results/current.yaml`` (``benchmarks/performance.py`` renders the current
sets into docs/PERFORMANCE.md).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
from datetime import date
from pathlib import Path
from typing import Iterator

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


def check_name(name: str, root: Path | None = None) -> None:
    """Refuse a bad NAME or one that is taken: a benchmark calls this before it measures."""
    root = RESULTS if root is None else root
    if not NAME.match(name):
        raise SystemExit(f"result_set.py: NAME {name!r}: use letters, digits, '.', '_', '+' "
                         "or '-' (e.g. cpu_lstm_1gbit_2026-12-01)")
    if (root / name).exists():
        raise SystemExit(f"result_set.py: {root / name} exists; a result set is never edited "
                         "(give the new measurement a new name)")


def write_result_set(name: str, command: str, files: list[Path],
                     root: Path | None = None, texts: dict[str, str] | None = None,
                     origin: dict[str, str] | None = None) -> Path:
    """Make ``root/name`` with ``files`` (and ``texts``: file name -> content) and its
    README header (``origin``: the provenance to state, by default the present one);
    refuse an existing set, a bad name, an empty command, a missing file, a directory or a
    file named README.md (the set's own), before anything is written."""
    root = RESULTS if root is None else root
    check_name(name, root)
    folder = root / name
    texts = texts or {}
    if not command.strip():
        raise SystemExit("result_set.py: --command is empty; give the command that wrote the "
                         "files, as typed")
    folders = [str(f) for f in files if f.is_dir()]
    if folders:
        raise SystemExit(f"result_set.py: {', '.join(folders)}: a directory, not a file; name "
                         "the files in it")
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise SystemExit(f"result_set.py: no such file: {', '.join(missing)}")
    names = [f.name for f in files] + list(texts)
    if len(set(names)) != len(names):
        raise SystemExit("result_set.py: two files share a name; copy one under another name")
    if "README.md" in names:
        raise SystemExit("result_set.py: a kept file is named README.md, the name of the set's "
                         "own README; copy it under another name")
    p = origin or provenance()
    folder.mkdir(parents=True)
    for f in files:
        shutil.copy2(f, folder / f.name)
    for file_name, text in texts.items():
        (folder / file_name).write_text(text)
    (folder / "README.md").write_text(
        f"# {name}\n\n"
        f"Machine: {p['machine']}. Versions: {p['versions']}. Code: commit {p['commit']}. "
        f"Kept on {p['date']}. The command, from the repository's root:\n\n"
        f"    {command}\n\n"
        f"Files: {', '.join(f'`{n}`' for n in names)}.\n")
    return folder


#: What ``provenance()`` said when the running benchmark began (``add_argument``).
_STARTED_FROM: dict[str, str] | None = None


def add_argument(parser: argparse.ArgumentParser) -> None:
    """A benchmark's ``--result-set NAME`` option; notes the commit the run starts from.

        result_set.add_argument(parser)
        args = parser.parse_args()
        if args.result_set:
            result_set.check_name(args.result_set)     # before any measuring
        ...
        result_set.keep(args.result_set, [out / "results.json", out / "results.md"])
    """
    global _STARTED_FROM
    _STARTED_FROM = provenance()     # the code the run measures, whatever is committed later
    parser.add_argument("--result-set", metavar="NAME",
                        help="also keep what this run writes as docs/results/NAME/, with the "
                             "commit, versions, machine and this command (a new NAME: a set "
                             "is never edited)")


def invocation(argv: list[str] | None = None) -> str:
    """The running command as typed from the repository's root (``sudo`` where root ran it
    through sudo): what a result set's README records."""
    argv = list(sys.argv if argv is None else argv)
    python = Path(sys.executable)
    script = Path(argv[0]).resolve()
    words = [str(python.relative_to(REPO)) if python.is_relative_to(REPO) else "python3",
             str(script.relative_to(REPO)) if script.is_relative_to(REPO) else argv[0],
             *argv[1:]]
    sudo = "sudo " if os.environ.get("SUDO_USER") and os.geteuid() == 0 else ""
    return sudo + shlex.join(words)


@contextlib.contextmanager
def recording_stdout() -> Iterator[io.StringIO]:
    """Print as usual and also collect what is printed: a benchmark whose output is its
    printed tables keeps them as its set's ``results.md``.

        with result_set.recording_stdout() as printed:
            print_tables()
        result_set.keep(args.result_set, [], {"results.md": printed.getvalue()})
    """
    buffer, real = io.StringIO(), sys.stdout

    class _Both(io.TextIOBase):
        def write(self, text: str) -> int:
            buffer.write(text)
            return real.write(text)

        def flush(self) -> None:
            real.flush()

    sys.stdout = _Both()
    try:
        yield buffer
    finally:
        sys.stdout = real


def keep(name: str | None, files: list[Path],
         texts: dict[str, str] | None = None) -> Path | None:
    """Keep ``files`` (and ``texts``: file name -> content) as the result set ``name``;
    nothing when ``name`` is None."""
    if not name:
        return None
    folder = write_result_set(name, invocation(), files, texts=texts, origin=_STARTED_FROM)
    print(f"kept {folder.relative_to(REPO) if folder.is_relative_to(REPO) else folder}: add "
          "what it shows to its README, then name it in docs/results/current.yaml")
    return folder


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
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
