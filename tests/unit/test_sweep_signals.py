"""A signal to a real sweep (hvd_scripts/sweep.py) stops the job it runs, launcher and ranks,
records that run as interrupted and exits 128 + the signal."""
from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def _stepped(metrics: Path) -> bool:
    """Whether the run logged a training step (its ranks are up and training)."""
    try:
        return any(json.loads(line).get("kind") == "step"
                   for line in metrics.read_text().splitlines()[:-1])
    except (OSError, ValueError):
        return False


# horovodrun: its ranks run in sessions of their own, so stopping the launcher's process
# group is not enough (torchrun's workers are in its group; the code path is the same).
@pytest.mark.parametrize("launcher", ["horovodrun"])
def test_sigterm_to_a_sweep_stops_its_job_and_marks_the_run_interrupted(launcher, tmp_path):
    sweep_file = tmp_path / "s.yaml"
    sweep_file.write_text(yaml.safe_dump({
        "name": "s", "np": 2, "configs": ["configs/demo.yaml"],
        "set": {"run.steps": 1000000, "run.eval_interval": 0, "run.checkpoint_interval": 0,
                "run.log_interval": 1, "run.report": False, "run.progress": "never"},
        "grid": {"compression": [{"files": ["configs/compression/dense.yaml"], "tag": "dense"},
                                 {"set": {"compression.controller": "static",
                                          "compression.compressor": "topk",
                                          "compression.cf": 10}, "tag": "topk"}]}}))
    out = tmp_path / "out"
    with open(tmp_path / "sweep.log", "w") as log:
        sweep = subprocess.Popen([sys.executable, "hvd_scripts/sweep.py", str(sweep_file),
                                  "--out", str(out), "--launcher", launcher],
                                 cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    family: list[psutil.Process] = []
    try:
        metrics = out / "runs" / "s-dense" / "metrics.jsonl"
        give_up = time.monotonic() + 600          # a hang guard, not a time limit
        while not _stepped(metrics):
            assert sweep.poll() is None, (tmp_path / "sweep.log").read_text()
            assert time.monotonic() < give_up, "the sweep's first run never trained"
            time.sleep(0.5)
        family = psutil.Process(sweep.pid).children(recursive=True)
        ranks = [p for p in family if "train.py" in " ".join(p.cmdline())
                 and launcher not in p.cmdline()[0]]
        assert len(ranks) >= 2, [p.cmdline() for p in family]

        sweep.send_signal(signal.SIGTERM)         # the sweep only, as a scheduler would
        code = sweep.wait(timeout=600)
        gone, alive = psutil.wait_procs(family, timeout=30)
        alive = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
        output = (tmp_path / "sweep.log").read_text()
        assert code == 128 + signal.SIGTERM, output
        assert alive == [], [p.cmdline() for p in alive]
        with open(out / "results.csv", newline="") as f:
            rows = {r["name"]: r for r in csv.DictReader(f)}
        assert (rows["s-dense"]["status"], rows["s-dense"]["note"]) == \
            ("interrupted", "stopped by SIGTERM")
        assert rows["s-topk"]["status"] == "pending"
        table = (out / "results.md").read_text()
        assert "| s-dense | dense | interrupted |" in table
        assert "| running |" not in table
        assert "stopped by SIGTERM: the sweep ends here" in output
    finally:
        if sweep.poll() is None:
            sweep.kill()
        for process in family:                    # what a failed check left running
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        sweep.wait()
