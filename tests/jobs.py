"""Helpers of the tests that launch their own horovodrun jobs (tests/faults)."""
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HOROVODRUN = str(REPO / ".venv/bin/horovodrun")
PYTHON = str(REPO / ".venv/bin/python")


def rank_pid(marker: str, rank: int) -> int | None:
    """PID of the train.py worker whose command line holds ``marker`` and whose Horovod
    rank (at launch) is ``rank``; None when there is none."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if "train.py" in cmdline and marker in cmdline and \
                f"HOROVOD_RANK={rank}".encode() in environ:
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
