"""Helpers of the tests that launch their own horovodrun or torchrun jobs (tests/faults)."""
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HOROVODRUN = str(REPO / ".venv/bin/horovodrun")
TORCHRUN = str(REPO / ".venv/bin/torchrun")
PYTHON = str(REPO / ".venv/bin/python")
LAUNCHERS = ("horovodrun", "torchrun")


def launch_train(launcher: str, np_: int = 2) -> list[str]:
    """The command that starts ``np_`` ranks of train.py (from the repository root)."""
    if launcher == "horovodrun":
        return [HOROVODRUN, "-np", str(np_), "-H", f"localhost:{np_}", "--gloo", PYTHON,
                "train.py"]
    if launcher == "torchrun":
        return [TORCHRUN, "--standalone", "--nproc-per-node", str(np_), "train.py"]
    raise ValueError(f"launcher must be one of {LAUNCHERS}, got {launcher!r}")


def slowed_train(seconds: float) -> list[str]:
    """Python arguments that run train.py (from the repository root, as ``rank_pid`` finds
    it) with every backward pass ``seconds`` longer (a sleep): what a test of timing needs
    to hold on a fast machine as on a slow one.
    ``[PYTHON, *slowed_train(0.05), "--config", ...]`` in place of ``[PYTHON, "train.py",
    "--config", ...]``."""
    code = ("import sys, time, torch\n"
            "backward = torch.Tensor.backward\n"
            "def slowed(self, *args, **kwargs):\n"
            f"    time.sleep({float(seconds)!r})\n"
            "    return backward(self, *args, **kwargs)\n"
            "torch.Tensor.backward = slowed\n"
            "import runpy\n"
            "sys.argv[0] = 'train.py'\n"
            "runpy.run_path('train.py', run_name='__main__')\n")
    return ["-c", code]


def rank_pid(marker: str, rank: int) -> int | None:
    """PID of the train.py worker whose command line holds ``marker`` and whose rank (at
    launch: HOROVOD_RANK under horovodrun, RANK under torchrun) is ``rank``; None when
    there is none."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        ranks = {f"HOROVOD_RANK={rank}".encode(), f"RANK={rank}".encode()}
        if "train.py" in cmdline and marker in cmdline and ranks & set(environ):
            return int(entry.name)
    return None


def read_records(path: Path) -> list[dict]:
    """The records of a metrics.jsonl being written (a line cut mid-write is skipped)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            pass
    return records
