"""Helpers of the cluster tests: jobs launched on several "hosts" of
hvd_scripts/cluster_sandbox.sh (network namespaces with an sshd each, on this machine).

Example::

    job = Sandbox(tmp_path, 'hvd_scripts/run_multi_node.sh "$GRAVAC_HOSTFILE" 4 ...')
    ranks = RankWatcher("run.name=straight", 4).start()
    assert job.wait() == 0, job.output()
    ranks.stop()          # {rank: (network namespace, host name)} of every rank seen
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from jobs import REPO, rank_pid

SANDBOX = str(REPO / "hvd_scripts/cluster_sandbox.sh")
# Where a failed job's output starts to say what went wrong (digest()).
FAILURE_MARKS = ("Traceback (most recent call last)", "terminate called", "Fatal Python error",
                 "[sandbox] COMMAND on")
# A guard against a broken set-up (a job that never ends), not a speed limit.
HANG_GUARD_S = 420


def unavailable() -> str | None:
    """Why the sandbox cannot run here, or None when it can (tried, not guessed)."""
    if os.geteuid() != 0:
        return ("needs root (network namespaces, /etc/netns, sshd); run tests/cluster as "
                "root")
    for tool, package in [("ip", "iproute2"), ("tc", "iproute2"), ("ssh", "openssh-client"),
                          ("ssh-keygen", "openssh-client"), ("setsid", "util-linux")]:
        if shutil.which(tool) is None:
            return f"'{tool}' not found: install {package}"
    if shutil.which("sshd") is None and not os.access("/usr/sbin/sshd", os.X_OK):
        return ("sshd not found: install openssh-server (as root: apt-get install -y "
                "openssh-server; `make install` does it when run as root)")
    from gravac.sweep.link import namespace_refusal
    return namespace_refusal()


def namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


class Sandbox:
    """``cluster_sandbox.sh`` running ``bash -c COMMAND`` (from the repository root), its
    output in ``tmp_path/NAME.log``; ``prefix`` runs the script under another command
    (e.g. ``env --default-signal=INT``)."""

    def __init__(self, tmp_path: Path, command: str, *, hosts: int = 2, slots: int = 2,
                 link: str = "1gbit", each: bool = False, env: dict | None = None,
                 name: str = "sandbox", prefix: tuple[str, ...] = ()):
        self.log = tmp_path / f"{name}.log"
        args = [*prefix, "bash", SANDBOX, "--hosts", str(hosts), "--slots", str(slots),
                "--link", link,
                *(["--each"] if each else []), "--", "bash", "-c", command]
        with open(self.log, "w") as out:
            # its own session: a last-resort SIGKILL reaches the script and its children
            self.proc = subprocess.Popen(args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         env={**os.environ, **(env or {})})

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def digest(self, limit: int = 6000) -> str:
        """The output for an assertion message: from the first traceback, native abort
        (a rank's "terminate called ...", "Fatal Python error") or the sandbox's own
        failure line (what went wrong first), then the end; a job that fails on one host
        fills its tail with the other hosts' stop."""
        text = self.output()
        marks = [i for i in (text.find(mark) for mark in FAILURE_MARKS) if i >= 0]
        if not marks or len(text) <= limit:
            return text[-limit:]
        first = max(0, min(marks) - 500)
        head = text[first:first + limit // 2]
        return f"{head}\n[...]\n{text[-limit // 2:]}"

    def wait(self, timeout: float = HANG_GUARD_S) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"the sandbox job did not end in {timeout} s (hang guard):\n"
                                 f"{self.digest(4000)}") from None

    def stop(self) -> None:
        """TERM (the sandbox stops its command and removes itself), KILL if that hangs."""
        if self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def leftovers(self) -> list[str]:
        """What of this sandbox is still there: namespaces, /etc/netns entries, its
        temporary folder and processes that use it (sshd). Names carry the script's pid."""
        prefix = f"gravac-cl-{self.proc.pid}-"
        found = [f"namespace {n}" for n in sorted(namespaces()) if n.startswith(prefix)]
        found += [str(p) for p in Path("/etc/netns").glob(prefix + "*")]
        match = re.search(r"hostfile (/tmp/gravac-cluster\.[\w]+)/hostfile", self.output())
        if match:
            tmp = match.group(1)
            if Path(tmp).exists():
                found.append(tmp)
            for entry in Path("/proc").iterdir():
                try:
                    cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                except OSError:
                    continue
                if entry.name.isdigit() and tmp in cmdline:
                    found.append(f"process {entry.name}: {cmdline}")
        return found


class RankWatcher:
    """Finds the ranks of a running job (train.py processes whose command line holds
    ``marker``, rank from HOROVOD_RANK or RANK) and records, for each, the network
    namespace it runs in (``ip netns identify``) and its HOROVOD_HOSTNAME."""

    def __init__(self, marker: str, ranks: int):
        self.marker, self.ranks = marker, ranks
        self.seen: dict[int, tuple[str, str | None]] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> "RankWatcher":
        self._thread.start()
        return self

    def stop(self) -> dict[int, tuple[str, str | None]]:
        self._done.set()
        self._thread.join()
        return dict(self.seen)

    def _watch(self) -> None:
        while not self._done.is_set() and len(self.seen) < self.ranks:
            for rank in range(self.ranks):
                if rank in self.seen:
                    continue
                pid = rank_pid(self.marker, rank)
                if pid is None:
                    continue
                netns = subprocess.run(["ip", "netns", "identify", str(pid)],
                                       capture_output=True, text=True).stdout.strip()
                try:
                    environ = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
                except OSError:
                    continue                  # gone before we looked: seen on the next job
                host = next((e.split(b"=", 1)[1].decode() for e in environ
                             if e.startswith(b"HOROVOD_HOSTNAME=")), None)
                if netns:
                    self.seen[rank] = (netns, host)
            time.sleep(0.05)
