"""gravac/util/job.py: how the sweep and the launch scripts run a launcher job: gravac's
error line found behind a launcher's prefix and printed last, a signal stopping the job
with the processes it started in sessions of their own (as horovodrun starts its ranks)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from gravac.util import job

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "gravac/util/job.py"


@pytest.mark.parametrize("line, found", [
    ("[1]<stderr>:config error: run.steps=0: must be >= 1", "config error: run.steps=0: must be >= 1"),
    ("[rank0]: checkpoint error: disk full", "checkpoint error: disk full"),
    ("[default1]:metrics error: disk full", "metrics error: disk full"),
    ("error: gravac 0.1.0 on a, 0.0.9 on b", "error: gravac 0.1.0 on a, 0.0.9 on b"),
    ("config error: x\n", "config error: x"),
    ("RuntimeError: Horovod detected that one or more processes exited", None),
    ("[0]<stderr>:ValueError: bad", None),
    ("Exit code: 2", None),
])
def test_error_line_is_gravacs_line_without_the_launchers_prefix(line, found):
    assert job.error_line([line]) == found


def test_the_gravac_line_comes_last_and_the_exit_status_is_the_jobs():
    launcher = ("import sys; print('[0]<stdout>:step 1'); "
                "print('[0]<stderr>:config error: --resume: no checkpoint', file=sys.stderr); "
                "print('Traceback (most recent call last):\\nRuntimeError: Horovod detected', "
                "file=sys.stderr); sys.exit(1)")
    proc = subprocess.run([sys.executable, str(JOB), "--", sys.executable, "-c", launcher],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1
    assert proc.stdout == "[0]<stdout>:step 1\n"
    assert proc.stderr.splitlines() == ["[0]<stderr>:config error: --resume: no checkpoint",
                                        "Traceback (most recent call last):",
                                        "RuntimeError: Horovod detected",
                                        "config error: --resume: no checkpoint"]
    ok = subprocess.run([sys.executable, str(JOB), "--", sys.executable, "-c",
                         "print('config error: not a failure')"],
                        capture_output=True, text=True, timeout=600)
    assert (ok.returncode, ok.stderr) == (0, "")


def test_a_signal_stops_the_launcher_and_a_rank_in_a_session_of_its_own(tmp_path):
    """The launcher ignores SIGTERM and its rank runs in its own session (horovodrun's
    ranks do): both are killed after the grace, and ``run`` raises ``Interrupted``."""
    pid_file, handler = tmp_path / "rank.pid", signal.getsignal(signal.SIGTERM)
    launcher = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "rank = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)'],"
        " start_new_session=True)\n"
        f"open({str(pid_file)!r}, 'w').write(str(rank.pid))\n"
        "time.sleep(3600)\n")

    def signal_us_once_the_rank_runs():
        while not pid_file.exists() or not pid_file.read_text():
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=signal_us_once_the_rank_runs, daemon=True).start()
    with pytest.raises(job.Interrupted) as stopped:
        job.run([sys.executable, "-c", launcher], on_output=lambda line, err: None,
                grace_s=1.0)
    assert stopped.value.exit_code == 128 + signal.SIGTERM
    rank = int(pid_file.read_text())
    try:
        process = psutil.Process(rank)
        process.wait(timeout=60)              # a hang guard: it was sent SIGKILL already
    except psutil.NoSuchProcess:
        pass
    assert not psutil.pid_exists(rank) or psutil.Process(rank).status() == psutil.STATUS_ZOMBIE
    assert signal.getsignal(signal.SIGTERM) is handler      # ours is gone again


def test_on_a_terminal_the_job_writes_to_one_too():
    """torchrun's ranks write to the launch script's terminal directly: run through
    job.py, they still see one (their progress bar, run.progress=auto, needs it)."""
    import pty

    ours, theirs = pty.openpty()
    proc = subprocess.Popen([sys.executable, str(JOB), "--", sys.executable, "-c",
                             "import sys; print('tty', sys.stdout.isatty(), sys.stderr.isatty())"],
                            stdout=theirs, stderr=theirs)
    os.close(theirs)
    output = b""
    while True:
        try:
            chunk = os.read(ours, 4096)
        except OSError:                       # EIO: every writer has closed it
            break
        if not chunk:
            break
        output += chunk
    os.close(ours)
    assert proc.wait(timeout=600) == 0
    assert b"tty True True" in output, output
