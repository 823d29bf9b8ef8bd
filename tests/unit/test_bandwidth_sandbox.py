"""hvd_scripts/bandwidth_sandbox.sh: runs a command behind a rate-limited loopback."""
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = str(REPO / "hvd_scripts/bandwidth_sandbox.sh")


def _can_make_namespaces() -> bool:
    probe = subprocess.run(["ip", "netns", "add", "gravac-probe"], capture_output=True)
    if probe.returncode != 0:
        return False
    subprocess.run(["ip", "netns", "del", "gravac-probe"], capture_output=True)
    return True


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def test_bad_rate_is_refused_before_anything_is_created():
    proc = subprocess.run(["bash", SCRIPT, "fast", "--", "true"], capture_output=True, text=True)
    assert proc.returncode == 2 and "rate 'fast' not understood" in proc.stderr


@pytest.mark.skipif(not _can_make_namespaces(), reason="needs rights to create network namespaces")
def test_runs_the_command_limited_and_cleans_up():
    before = _namespaces()
    proc = subprocess.run(
        ["bash", SCRIPT, "100mbit", "--", "bash", "-c",
         "tc qdisc show dev lo; ip -o link show lo; exit 3"], capture_output=True, text=True)
    assert proc.returncode == 3, proc.stderr                  # the command's status
    assert "tbf" in proc.stdout and "rate 100Mbit" in proc.stdout
    assert "mtu 9000" in proc.stdout
    assert _namespaces() == before                            # the namespace is gone
