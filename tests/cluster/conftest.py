"""Cluster tests: jobs across the "hosts" of hvd_scripts/cluster_sandbox.sh. They need root,
network namespaces and sshd, and are skipped (with the reason) where one is missing.

``sandbox`` starts sandbox jobs and, after the test, checks that none of them left anything
behind (namespaces, /etc/netns entries, temporary files, sshd processes)."""
import pytest

from sandbox_jobs import Sandbox, unavailable

UNAVAILABLE = unavailable()


@pytest.fixture
def sandbox(tmp_path):
    """``sandbox(command, **options) -> Sandbox`` (see sandbox_jobs.Sandbox)."""
    if UNAVAILABLE:
        pytest.skip(UNAVAILABLE)
    started: list[Sandbox] = []

    def start(command: str, **options) -> Sandbox:
        job = Sandbox(tmp_path, command, name=f"sandbox{len(started)}", **options)
        started.append(job)
        return job

    yield start
    for job in started:
        job.stop()
    left = [item for job in started for item in job.leftovers()]
    assert not left, f"the sandbox left these behind: {left}"
