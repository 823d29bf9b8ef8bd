"""The launch scripts in hvd_scripts/: syntax, usage messages, the runs they launch (through a
stand-in horovodrun that records its arguments), and that every repository path they (or
README.md) mention exists. Nothing here starts a real job."""
from __future__ import annotations

import itertools
import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((REPO / "hvd_scripts").glob("*.sh"))
# The scripts that take arguments (install.sh takes none: it installs).
WITH_USAGE = ["run_single_node.sh", "run_multi_node.sh", "run_baseline.sh", "run_gravac.sh",
              "run_accordion.sh", "sweep.sh", "run_torchrun.sh"]

# A repository path: under one of these top-level folders, or train.py itself. The look-behind
# keeps out the tails of other paths (~/.cache/gravac/..., $CACHE/wheels/...).
PATH_RE = re.compile(r"(?<![\w./~$-])((?:configs|hvd_scripts|benchmarks|examples|tests|gravac)"
                     r"/[\w./{},*<>$-]*[\w}]|train\.py)/?(?![\w/])")


def bash(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def expand_braces(text: str) -> list[str]:
    """Shell brace expansion of ``a_{b,c}_{1,2}`` (no nesting).

    Example::

        expand_braces("s_{topk,dgc}_{10,1000}x")   # ['s_topk_10x', 's_topk_1000x', ...]
    """
    parts = re.split(r"\{([^{}]*,[^{}]*)\}", text)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(combo) for combo in itertools.product(*choices)]


def repo_paths(text: str) -> set[str]:
    """Repository paths mentioned in ``text``, braces expanded; placeholders (capital
    letters, $VARS, <...>, globs) and paths under runs/ or data/ are left out."""
    text = re.sub(r"\$\{?repo\}?/", "", text)          # "$repo/configs/..." is a repo path
    found = set()
    for match in PATH_RE.findall(text):
        path = match.rstrip("/.")
        if re.search(r"[A-Z$<>*]", path) or path.startswith(("runs/", "data/")):
            continue
        found.update(expand_braces(path))
    return found


def readme_code(text: str) -> str:
    """The backticked spans and fenced code blocks of a markdown text, one per line."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
    rest = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    return "\n".join(blocks + re.findall(r"`([^`\n]+)`", rest))


def test_helpers():
    assert expand_braces("c/s_{topk,dgc}_{10,1000}x.yaml") == [
        "c/s_topk_10x.yaml", "c/s_topk_1000x.yaml", "c/s_dgc_10x.yaml", "c/s_dgc_1000x.yaml"]
    text = ("see `configs/demo.yaml`, `$repo/hvd_scripts/x.sh`, ~/.cache/gravac/wheels/, "
            "`python -m gravac.report RUN_DIR`, `configs/models/MODEL.yaml`, `runs/demo`, "
            "`train.py`, `my_train.py`, `tests/unit/`.")
    assert repo_paths(text) == {"configs/demo.yaml", "hvd_scripts/x.sh", "train.py", "tests/unit"}
    assert readme_code("a `b/c.py` d\n```bash\nx/y.sh\n```\n`e`") == "x/y.sh\n\nb/c.py\ne"


def test_all_scripts_are_here():
    assert {p.name for p in SCRIPTS} >= set(WITH_USAGE) | {"install.sh"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_syntax(script):
    proc = bash("-n", str(script))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("name", WITH_USAGE)
def test_usage_and_exit_2_without_arguments(name, tmp_path):
    proc = bash(str(REPO / "hvd_scripts" / name), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"Usage:   hvd_scripts/{name}" in proc.stderr


@pytest.mark.parametrize("args, message", [
    (["run_single_node.sh", "0", "configs/demo.yaml"], "NP must be a positive integer, got '0'"),
    (["run_single_node.sh", "2", "configs/nope.yaml"], "config file 'configs/nope.yaml' not found"),
    (["run_multi_node.sh", "/nonexistent/hosts", "2", "configs/demo.yaml"],
     "hostfile '/nonexistent/hosts' not found (one 'HOST slots=N' per line)"),
    (["run_baseline.sh", "configs/nope.yaml"], "model config 'configs/nope.yaml' not found"),
    (["run_baseline.sh", "configs/nope.yaml"], f"not found (looked in {REPO})"),   # once
    (["run_gravac.sh", "configs/demo.yaml", "two"], "NP must be a positive integer, got 'two'"),
    (["run_accordion.sh", "configs/demo.yaml", "2", "--set"], "train.py arguments go after '--'"),
    (["run_torchrun.sh", "0", "configs/demo.yaml"], "NPROC must be a positive integer, got '0'"),
    (["run_torchrun.sh", "2", "configs/nope.yaml"], "config file 'configs/nope.yaml' not found"),
    # train.py's arguments without the `--` before them were taken for config files
    (["run_single_node.sh", "2", "configs/demo.yaml", "--set", "run.steps=5"],
     "unexpected argument '--set'; train.py arguments go after '--'"),
    (["run_torchrun.sh", "2", "configs/demo.yaml", "--dry-run"],
     "unexpected argument '--dry-run'; train.py arguments go after '--'"),
])
def test_bad_arguments_exit_2_with_a_message(args, message):
    proc = bash(str(REPO / "hvd_scripts" / args[0]), *args[1:])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr


def test_multi_node_controller_must_be_gloo_or_mpi(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost slots=2\n")
    proc = subprocess.run(["bash", str(REPO / "hvd_scripts/run_multi_node.sh"), str(hosts), "2",
                           "configs/demo.yaml"], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env={"PATH": "/usr/bin:/bin", "GRAVAC_CONTROLLER": "nccl"})
    assert proc.returncode == 2
    assert "GRAVAC_CONTROLLER must be gloo or mpi, got 'nccl'" in proc.stderr


def _fake_venv(tmp_path: Path, defer_checks: bool = False) -> tuple[Path, Path]:
    """A venv whose horovodrun and torchrun only record their arguments (one line a call).

    Its python runs the real ``train.py --check`` of the launchers; with ``defer_checks``
    it records each call instead (working directory and arguments, in ``tmp_path/checks``)
    and succeeds, and ``_run_checks`` then runs them all in this process: one start-up of
    torch instead of one per launched run."""
    import sys

    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    calls = tmp_path / "calls.txt"
    if defer_checks:
        checks = tmp_path / "checks"
        checks.mkdir()
        # gravac/util/job.py, which runs the launcher, is run for real (it imports no torch),
        # and so is a series' check of all its runs (one process)
        (bin_dir / "python").write_text(
            f'#!/bin/sh\ncase "$1 $2" in */gravac/util/job.py*|"-m gravac.sweep.check") '
            f'exec "{sys.executable}" "$@";; esac\n'
            f'printf \'%s\\0\' "$PWD" "$@" > "{checks}/$(ls "{checks}" | wc -l)"\n')
    else:
        # a wrapper, not a symlink: a symlinked venv python outside its venv loses its
        # packages (the launchers run the real `train.py --check` with it)
        (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "python").chmod(0o755)
    for tool in ("horovodrun", "torchrun"):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> "{calls}"\n')
        (bin_dir / tool).chmod(0o755)
    return tmp_path / "venv", calls


def _run_checks(tmp_path: Path) -> int:
    """Run the ``train.py --check LAUNCHER`` calls that the python of ``_fake_venv(tmp_path,
    defer_checks=True)`` recorded, in order, each as ``train.py`` would (its ``main`` with
    those arguments, from that working directory): every one must pass (exit 0) as it
    must for a launcher to go on. Returns how many there were."""
    import contextlib
    import io
    import os

    from gravac.train.cli import main

    recorded = sorted((tmp_path / "checks").iterdir(), key=lambda p: int(p.name))
    for path in recorded:
        cwd, script, *args = path.read_bytes().decode().split("\0")[:-1]
        # The check names the launcher that starts the job: its transport's options too.
        assert script == str(REPO / "train.py") and args[-2:] in (
            ["--check", "horovodrun"], ["--check", "torchrun"]), (script, args)
        here = os.getcwd()
        out, err = io.StringIO(), io.StringIO()
        try:
            os.chdir(cwd)
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(args)
        finally:
            os.chdir(here)
        assert code == 0, (args, out.getvalue(), err.getvalue())
        assert "config ok: " in out.getvalue(), out.getvalue()
    return len(recorded)


def _launched(script: str, *args: str, tmp_path: Path, env: dict | None = None) -> list[str]:
    """The launcher calls of ``script ARGS`` (which must exit 0), after checking that the
    script ran one ``train.py --check`` per launch and that every one of them passes."""
    venv, calls = _fake_venv(tmp_path, defer_checks=True)
    proc = subprocess.run(["bash", str(REPO / "hvd_scripts" / script), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "GRAVAC_VENV": str(venv), **(env or {})})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    launched = calls.read_text().splitlines() if calls.exists() else []
    assert _run_checks(tmp_path) == len(launched)
    return launched


@pytest.mark.parametrize("script, expected", [
    ("run_baseline.sh", ["dense", "horovod_fp16"] + [f"static_{c}_{f}x" for c in
                                                     ("topk", "dgc", "redsync", "randomk")
                                                     for f in (10, 1000)]),
    ("run_gravac.sh", ["gravac_exp_dgc_eps07", "gravac_exp_dgc_eps09", "gravac_geo_redsync",
                       "gravac_randomk"]),
    ("run_accordion.sh", ["accordion_cnn"]),
])
def test_series_scripts_launch_one_run_per_method(script, expected, tmp_path):
    calls = _launched(script, "configs/demo.yaml", "2", "--", "--set", "run.steps=3",
                      tmp_path=tmp_path)
    launched = [re.search(r"configs/compression/(\w+)\.yaml", c).group(1) for c in calls]
    assert launched == expected
    assert all(c.startswith("horovodrun -np 2 -H localhost:2 --gloo") and "run.steps=3" in c
               for c in calls)


def test_a_series_checks_every_run_first_and_says_a_shared_problem_once(tmp_path):
    """A data.root without the data: one line for all the runs, exit 2, nothing launched."""
    venv, calls = _fake_venv(tmp_path)
    missing = tmp_path / "nope"
    proc = subprocess.run(["bash", str(REPO / "hvd_scripts/run_gravac.sh"), "configs/demo.yaml",
                           "--", "--set", "data.name=cifar10", "--set", f"data.root={missing}"],
                          cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "GRAVAC_VENV": str(venv)})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 2, proc.stderr
    assert lines[0].startswith(f"config error: data.root='{missing}': cifar10: folder ")
    assert lines[0].endswith(" (all 4 runs)")
    assert lines[1] == "4 of 4 runs invalid; nothing was launched"
    assert not calls.exists()


def test_run_torchrun_single_and_multi_node(tmp_path):
    (one,) = _launched("run_torchrun.sh", "2", "configs/demo.yaml", "--", "--dry-run",
                       tmp_path=tmp_path / "a")
    assert one.startswith("torchrun --standalone --nproc-per-node 2 train.py --config ")
    assert one.endswith("configs/demo.yaml --set run.backend=torch --dry-run")
    # (a run folder of their own: the check refuses one that holds a run, e.g. the demo's)
    own = ["--", "--set", f"run.output_dir={tmp_path / 'runs'}"]
    (joined,) = _launched("run_torchrun.sh", "4", "configs/demo.yaml", *own,
                          tmp_path=tmp_path / "b",
                          env={"GRAVAC_NNODES": "2", "GRAVAC_RDZV_ENDPOINT": "node1:29400"})
    assert joined.startswith("torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d "
                             "--rdzv-endpoint node1:29400 --rdzv-id gravac train.py")
    # a fixed node rank is honoured only by the static rendezvous (c10d ignores it)
    (fixed,) = _launched("run_torchrun.sh", "4", "configs/demo.yaml", *own,
                         tmp_path=tmp_path / "c",
                         env={"GRAVAC_NNODES": "2", "GRAVAC_RDZV_ENDPOINT": "node1:29400",
                              "GRAVAC_NODE_RANK": "1"})
    assert fixed.startswith("torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend static "
                            "--rdzv-endpoint node1:29400 --node-rank 1 train.py")


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_paths_in_scripts_exist(script):
    missing = sorted(p for p in repo_paths(script.read_text()) if not (REPO / p).exists())
    assert not missing, f"{script.name} mentions paths that do not exist: {missing}"


def test_paths_in_readme_exist():
    paths = repo_paths(readme_code((REPO / "README.md").read_text()))
    assert paths, "found no repository paths in README.md's code; is the parser broken?"
    missing = sorted(p for p in paths if not (REPO / p).exists())
    assert not missing, f"README.md mentions paths that do not exist: {missing}"


def test_discover_hosts_prints_the_hosts_file_without_comments(tmp_path):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("# the cluster\nnode1:4\n\n  # gone for now\nnode2:4\n")
    script = str(REPO / "hvd_scripts/discover_hosts.sh")
    proc = bash(script, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout == "node1:4\nnode2:4\n", proc.stderr
    hosts.unlink()
    proc = bash(script, cwd=tmp_path)
    assert proc.returncode == 1 and "GRAVAC_HOSTS_FILE" in proc.stderr


def test_multi_node_checks_the_hostfile_and_passes_it_as_hosts(tmp_path):
    """Blank lines, comments and HOST:N are fine; a bad line is named with its
    number; NP above the slots is refused; horovodrun gets -H HOST:N,..."""
    hosts = tmp_path / "hosts"
    hosts.write_text("# cluster\nnode1 slots=2\n\nnode2:2   # the second\n")
    (call,) = _launched("run_multi_node.sh", str(hosts), "4", "configs/demo.yaml", "--",
                        "--set", f"run.output_dir={tmp_path / 'runs'}", tmp_path=tmp_path / "ok")
    assert call.startswith("horovodrun -np 4 -H node1:2,node2:2 --gloo ")
    venv, calls = _fake_venv(tmp_path / "bad")
    for text, np_, message in [
            ("node1 slots=2\nnode2 4\n", "2", f"{hosts}:2: expected 'HOST slots=N' or 'HOST:N', "
                                               "got 'node2 4'"),
            ("node1 slots=2\nnode2:0\n", "2", f"{hosts}:2: a host needs at least 1 slot"),
            ("node1:2\nnode2:2\n", "5", f"NP=5 is more than the 4 slots in {hosts} "
                                        "(node1:2,node2:2); lower NP or add slots"),
            ("# nobody\n\n", "1", "lists no host")]:
        hosts.write_text(text)
        proc = subprocess.run(["bash", str(REPO / "hvd_scripts/run_multi_node.sh"), str(hosts),
                               np_, "configs/demo.yaml"], cwd=REPO, capture_output=True,
                              text=True, timeout=600,
                              env={"PATH": "/usr/bin:/bin", "GRAVAC_VENV": str(venv)})
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not calls.exists()


@pytest.mark.parametrize("script, args", [
    ("run_single_node.sh", ["2", "configs/demo.yaml"]),
    ("run_torchrun.sh", ["2", "configs/demo.yaml"]),
])
def test_launchers_check_the_config_before_starting_ranks(script, args, tmp_path):
    """A bad config is train.py --check's one line (exit 2), and no launcher runs."""
    venv, calls = _fake_venv(tmp_path)
    proc = subprocess.run(["bash", str(REPO / "hvd_scripts" / script), *args, "--", "--set",
                           "optimizer.lr=.inf"], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env={"PATH": "/usr/bin:/bin", "GRAVAC_VENV": str(venv)})
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == ("config error: optimizer.lr=inf: must be a finite "
                                            "number")
    assert not calls.exists()


@pytest.mark.parametrize("script, env, refused", [
    ("run_single_node.sh", {}, True),
    ("run_torchrun.sh", {}, True),
    # Several nodes: the GPUs are on the hosts that train, not necessarily this one.
    ("run_torchrun.sh", {"GRAVAC_NNODES": "2", "GRAVAC_RDZV_ENDPOINT": "h0:29400"}, False),
])
def test_a_launch_on_this_host_checks_run_device_here(script, env, refused, tmp_path):
    """run.device=cuda on a host without a GPU is the check's one line when every rank
    starts here (it was horovodrun's 29-line traceback with gravac's line last)."""
    import torch
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    venv, calls = _fake_venv(tmp_path)
    proc = subprocess.run(["bash", str(REPO / "hvd_scripts" / script), "2", "configs/demo.yaml",
                           "--", "--set", "run.device=cuda", f"run.output_dir={tmp_path}/runs"],
                          cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "GRAVAC_VENV": str(venv), **env})
    if refused:
        assert proc.returncode == 2 and not calls.exists()
        assert proc.stderr.splitlines()[-1].startswith(
            "config error: run.device='cuda': this process sees no CUDA GPU")
    else:
        assert proc.returncode == 0, proc.stderr
        assert calls.exists()


def test_a_series_continues_with_resume_as_its_header_says(tmp_path):
    """`-- --resume` on a series whose runs had not all started failed each of
    those with "--resume: no checkpoint". Its horovodrun here is a stand-in that runs the
    real train.py as one process (run.backend=local) and notes each launch."""
    import json
    import shutil
    import sys

    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    launches = tmp_path / "launches.txt"
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    # horovodrun -np N -H HOSTS --gloo PYTHON train.py ARGS -> PYTHON train.py ARGS, local
    (bin_dir / "horovodrun").write_text(
        f'#!/bin/sh\nshift 5\necho "$*" >> "{launches}"\n'
        'exec "$@" --set run.backend=local --set run.progress=never --set run.threads=1\n')
    for tool in ("python", "horovodrun"):
        (bin_dir / tool).chmod(0o755)
    runs = tmp_path / "runs"

    def series(steps: int) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", str(REPO / "hvd_scripts/run_accordion.sh"), "configs/demo.yaml", "1", "--",
             "--set", f"run.output_dir={runs}", "--set", f"run.steps={steps}", "--set",
             "run.report=false", "--resume"], cwd=REPO, capture_output=True, text=True,
            timeout=600, env={"PATH": "/usr/bin:/bin", "GRAVAC_VENV": str(tmp_path / "venv")})

    def records(run_dir: Path, kind: str) -> list[dict]:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        return [r for r in map(json.loads, lines) if r["kind"] == kind]

    def ended_at(run_dir: Path) -> int:
        return records(run_dir, "run_end")[-1]["step"]

    def launched() -> list[str]:
        return launches.read_text().splitlines() if launches.exists() else []

    proc = series(2)                     # nothing there yet: the run starts
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all 1 runs finished" in proc.stderr
    (run_dir,) = runs.iterdir()
    assert ended_at(run_dir) == 2 and not launched()[-1].endswith("--resume")

    proc = series(4)                     # a checkpoint, fewer steps than asked: resumed
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ended_at(run_dir) == 4 and launched()[-1].endswith("--resume")
    assert len(records(run_dir, "run_start")) == 2          # one run, continued

    proc = series(4)                     # finished the steps asked for: kept, not launched
    assert proc.returncode == 0 and len(launched()) == 2, proc.stdout + proc.stderr
    assert "accordion_cnn.yaml: finished earlier, kept" in proc.stderr

    shutil.rmtree(run_dir / "checkpoints")
    proc = series(3)                     # logged, no checkpoint: started again
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "accordion_cnn.yaml: no checkpoint, started again" in proc.stderr
    assert ended_at(run_dir) == 3 and launched()[-1].endswith("run.overwrite=true")
    assert len(records(run_dir, "run_start")) == 1


def test_a_ranks_gravac_error_is_the_last_line_after_horovodruns_traceback(tmp_path):
    """An error inside the ranks (here a run folder another run holds, which
    `train.py --check` does not lock and so cannot see) ended in horovodrun's 25-line
    traceback; the launch script prints the ranks' one line after it. A real 2-rank
    horovodrun job."""
    from gravac.train.run_lock import RunDirLock

    held = RunDirLock(tmp_path / "r")
    assert held.acquire()
    try:
        proc = bash(str(REPO / "hvd_scripts/run_single_node.sh"), "2", "configs/demo.yaml",
                    "--", "--set", f"run.output_dir={tmp_path}", "--set", "run.name=r")
    finally:
        held.release()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "RuntimeError: Horovod detected that one or more processes exited" in proc.stderr
    last = proc.stderr.splitlines()[-1]
    assert last.startswith(f"config error: {tmp_path}/r is in use by another run (pid "), last
    assert last.endswith("; wait until it ends, or choose another run.name or "
                         "run.output_dir"), last


def test_check_refuses_a_resume_with_nothing_to_resume_before_the_launch(tmp_path):
    """The launch script's `train.py --check` sees the run folder: --resume with nothing to
    continue is its one line (exit 2), and no launcher runs."""
    proc = bash(str(REPO / "hvd_scripts/run_single_node.sh"), "2", "configs/demo.yaml", "--",
                "--set", f"run.output_dir={tmp_path}", "--set", "run.name=r", "--resume")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == (
        f"config error: --resume: no checkpoint in {tmp_path}/r/checkpoints; start without "
        "--resume, or set run.output_dir/run.name to the run to continue")
    assert not (tmp_path / "r").exists()


def test_the_demo_refuses_a_bad_link_in_one_line():
    proc = subprocess.run(["bash", "hvd_scripts/demo.sh", "2"], cwd=REPO, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "DEMO_LINK": "fast"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == ("demo.sh: DEMO_LINK: 'fast' is not a link rate; write it as "
                                   "tc does (e.g. 100mbit, 1gbit, 10gbit) or none for the "
                                   "plain loopback")
