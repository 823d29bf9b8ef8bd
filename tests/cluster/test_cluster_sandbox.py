"""hvd_scripts/cluster_sandbox.sh itself: bad arguments (no root needed), then what the hosts
look like from inside, --each, and the clean-up after a failure and after SIGTERM."""
import os
import signal
import subprocess
import sys
import time

import pytest

from jobs import REPO
from sandbox_jobs import SANDBOX


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", SANDBOX, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("args, message", [
    (["--hosts", "0", "--", "true"], "--hosts must be a whole number from 1 to 250, got '0'"),
    (["--hosts", "300", "--", "true"], "--hosts must be a whole number from 1 to 250, got '300'"),
    (["--slots", "two", "--", "true"], "--slots must be a whole number from 1 to 9999, got 'two'"),
    (["--link", "fast", "--", "true"],
     "--link 'fast' not understood; use a tc rate such as 100mbit, 1gbit or 10gbit, or none"),
    (["--hosts"], "--hosts needs a value, e.g. --hosts 2"),
    (["--nodes", "2", "--", "true"], "unknown option '--nodes'"),
])
def test_bad_arguments_are_refused_in_one_line_before_anything_is_made(args, message):
    proc = run(*args)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"cluster_sandbox.sh: {message}")


def test_without_root_it_says_so_in_one_line():
    as_user = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"] \
        if os.geteuid() == 0 else []
    proc = subprocess.run([*as_user, "bash", SANDBOX, "--", "true"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    if as_user and "Permission denied" in proc.stderr:
        pytest.skip("user nobody cannot read the repository here")
    assert proc.returncode == 2
    assert proc.stderr == ("cluster_sandbox.sh: needs root (it creates network namespaces, "
                           "writes /etc/netns/ and starts sshd); run it with sudo\n")


def test_bad_environment_and_usage():
    proc = run("--", "true", env={"GRAVAC_SANDBOX_MTU": "jumbo"})
    assert proc.returncode == 2
    assert "GRAVAC_SANDBOX_MTU must be a number from 576 to 65535, got 'jumbo'" in proc.stderr
    proc = run("--hosts", "2")                            # no COMMAND
    assert proc.returncode == 2 and "Usage:   hvd_scripts/cluster_sandbox.sh" in proc.stderr
    proc = run("--help")
    assert proc.returncode == 0 and "GRAVAC_HOST0_ADDR" in proc.stdout


def test_run_multi_node_hands_the_sandbox_ssh_settings_to_horovodrun(tmp_path):
    """GRAVAC_SSH_PORT / GRAVAC_SSH_KEY / GRAVAC_NICS become horovodrun flags (a stand-in
    horovodrun records them; nothing is launched)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    calls = tmp_path / "calls.txt"
    (venv / "bin/python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (venv / "bin/horovodrun").write_text(f'#!/bin/sh\necho "horovodrun $*" >> "{calls}"\n')
    for tool in ("python", "horovodrun"):
        (venv / "bin" / tool).chmod(0o755)
    hosts, key = tmp_path / "hosts", tmp_path / "key"
    hosts.write_text("h0 slots=2\nh1 slots=2\n")
    key.write_text("not a real key\n")
    env = {"PATH": "/usr/bin:/bin", "GRAVAC_VENV": str(venv), "GRAVAC_NICS": "eth0",
           "GRAVAC_SSH_PORT": "2222", "GRAVAC_SSH_KEY": str(key)}
    script = str(REPO / "hvd_scripts/run_multi_node.sh")
    # (a run folder of its own: the check refuses one that holds a run, e.g. the demo's)
    own = ["--", "--set", f"run.output_dir={tmp_path / 'runs'}"]
    proc = subprocess.run(["bash", script, str(hosts), "4", "configs/demo.yaml", *own],
                          cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert calls.read_text().startswith(
        f"horovodrun -np 4 -H h0:2,h1:2 --gloo --network-interfaces eth0 --ssh-port 2222 "
        f"--ssh-identity-file {key} ")
    proc = subprocess.run(["bash", script, str(hosts), "4", "configs/demo.yaml"], cwd=REPO,
                          capture_output=True, text=True, timeout=120,
                          env={**env, "GRAVAC_SSH_PORT": "ssh"})
    assert proc.returncode == 2
    assert "GRAVAC_SSH_PORT must be a port number from 1 to 65535, got 'ssh'" in proc.stderr


# The command that looks around inside the sandbox: from h0, then on h1 over plain ssh.
LOOK = r"""
echo "env $GRAVAC_SANDBOX_HOSTS|$GRAVAC_HOST0_ADDR|$GRAVAC_NICS|$GLOO_SOCKET_IFNAME|$GRAVAC_SSH_PORT"
echo "hostfile $(tr '\n' ',' < "$GRAVAC_HOSTFILE")"
echo "ns0 $(ip netns identify $$) $(getent hosts "$(uname -n)")"
echo "qdisc0 $(tc qdisc show dev eth0)"
echo "pwd $PWD"
ssh -p "$GRAVAC_SSH_PORT" -i "$GRAVAC_SSH_KEY" -o StrictHostKeyChecking=no \
    -o UserKnownHostsFile=/dev/null h1 'echo "ns1 $(ip netns identify $$) $(getent hosts $(uname -n))"'
ssh h1 true && echo "plain ssh ok"
exit 7
"""


def test_hosts_names_links_ssh_and_the_exit_status(sandbox):
    job = sandbox(LOOK, hosts=2, slots=3, link="100mbit")
    assert job.wait() == 7, job.output()                 # COMMAND's status
    lines = dict(line.split(" ", 1) for line in job.output().splitlines() if " " in line)
    assert lines["env"] == "h0 h1|10.77.0.1|eth0|eth0|2222"
    assert lines["hostfile"] == "h0 slots=3,h1 slots=3,"
    pid = job.proc.pid
    # this machine's hostname is each host's own address there, not 127.0.0.1
    assert lines["ns0"].split()[:2] == [f"gravac-cl-{pid}-h0", "10.77.0.1"]
    assert lines["ns1"].split()[:2] == [f"gravac-cl-{pid}-h1", "10.77.0.2"]
    assert "tbf" in lines["qdisc0"] and "rate 100Mbit" in lines["qdisc0"]
    assert lines["pwd"] == str(REPO)
    assert "plain ssh ok" in job.output()


def test_each_runs_on_every_host_and_a_failure_stops_the_others(sandbox):
    job = sandbox('echo "host $GRAVAC_NODE_RANK $(ip netns identify $$)"', hosts=3, each=True)
    assert job.wait() == 0, job.output()
    pid = job.proc.pid
    assert sorted(line for line in job.output().splitlines() if line.startswith("host ")) == [
        f"host {k} gravac-cl-{pid}-h{k}" for k in range(3)]
    # host 1 fails at once; the others would sleep for 10 minutes: they are stopped
    job = sandbox('[ "$GRAVAC_NODE_RANK" != 1 ] || exit 5; exec sleep 600', hosts=3, each=True)
    assert job.wait(timeout=120) == 5, job.output()
    assert "COMMAND on h1 failed (exit 5): stopping it on the other hosts" in job.output()


@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)],
                         ids=["TERM", "INT"])
def test_a_signal_stops_the_command_and_removes_everything(sandbox, signum, status):
    """Ctrl-C (INT) or TERM to the script: passed on to COMMAND, which ends (here an ssh
    session to h1, as horovodrun has), then everything is removed."""
    # INT as from a terminal: not ignored, whatever the test runner's parent did with it
    job = sandbox('ssh h1 "echo started; exec sleep 600"; echo "ssh ended $?"',
                  prefix=("env", "--default-signal=INT"))
    deadline = time.time() + 120
    while "started" not in job.output():
        assert job.proc.poll() is None and time.time() < deadline, job.output()
        time.sleep(0.1)
    os.kill(job.proc.pid, signum)
    assert job.wait(timeout=120) == status, job.output()
    assert f"{signum.name[3:]}: stopping COMMAND and removing the sandbox" in job.output()
    if signum == signal.SIGINT:     # ssh itself got the INT (not a KILL after a while)
        assert "ssh ended 255" in job.output()
    assert job.leftovers() == []                          # the fixture checks again
