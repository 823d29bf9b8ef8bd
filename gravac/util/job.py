"""Run a launcher job (horovodrun, torchrun, a launch script) for gravac's sweep and launch
scripts, so that

* a signal to us stops the whole job: it runs in a session of its own, SIGINT, SIGTERM or
  SIGHUP is passed on to its process group (the launcher then stops its ranks its own way,
  which lets them checkpoint), and whatever is left after ``STOP_GRACE_S``, the launcher
  and every process it started, is killed. The group alone is not enough: horovodrun puts
  each rank in a session of its own;
* gravac's one-line error, when a rank printed one, can be shown last: horovodrun ends a
  failed job with its own 25-line traceback, after the ranks' output.

Standalone on purpose (the standard library, and psutil when installed): the launch scripts
run it by path, without importing gravac and torch::

    python gravac/util/job.py -- horovodrun -np 2 -H localhost:2 --gloo python train.py ...

The command line passes the job's output through, prints the last gravac error line the
job printed as its own last line when the job fails, and exits with the job's status (128 +
N when signal N stopped it, as a shell reports a process killed by N).
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Iterable, Iterator, Sequence

#: The signals that stop a job: Ctrl-C, what schedulers send, a closed terminal.
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: Seconds a signalled job gets to end on its own before it is killed: more than torchrun
#: gives its workers (30 s) and horovodrun its ranks (5 s) before they kill them.
STOP_GRACE_S = 45.0

# train.py's one-line errors (gravac/train/cli.py): "config error: ...", "checkpoint
# error: ...", "metrics error: ..." and "error: ...", each possibly behind a launcher's
# prefix ("[1]<stderr>:" from horovodrun, "[rank1]:" or "[default1]:" from torchrun).
_ERROR_LINE = re.compile(r"^(?:\[[^\]]*\](?:<std(?:out|err)>)?:\s?)?"
                         r"((?:(?:config|checkpoint|metrics) )?error: \S.*)$")


class Interrupted(Exception):
    """A signal stopped us (and the job we ran, if one was running)."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def error_line(lines: Iterable[str]) -> str | None:
    """The last of ``lines`` that is a gravac error line, without the launcher's prefix.

    >>> error_line(["[0]<stderr>:config error: x=1: must be 2", "RuntimeError: Horovod ..."])
    'config error: x=1: must be 2'
    """
    found = None
    for line in lines:
        match = _ERROR_LINE.match(line.rstrip("\r\n"))
        if match:
            found = match.group(1).rstrip()
    return found


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """Within: SIGINT, SIGTERM and SIGHUP raise ``Interrupted`` in the main thread. A signal
    ignored on entry (``nohup`` ignores SIGHUP) stays ignored; elsewhere than in the main
    thread, where Python cannot set handlers, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum, frame):
        raise Interrupted(signum)

    previous = {}
    for sig in SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            previous[sig] = signal.signal(sig, handle)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _family(pid: int) -> list:
    """The processes ``pid`` started, at any depth (psutil objects, which refuse to signal
    a reused pid); [] without psutil or once ``pid`` is gone."""
    try:
        import psutil
        return psutil.Process(pid).children(recursive=True)
    except Exception:   # psutil missing, or the process already ended
        return []


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def stop(proc: subprocess.Popen, signum: int, grace_s: float = STOP_GRACE_S) -> int:
    """Stop the job ``proc`` (started in a session of its own, so its pid is its process
    group): ``signum`` to the group, then, after at most ``grace_s`` seconds (a second
    signal cuts them short), SIGKILL to the group and to every process the job had started
    (found before the launcher could leave them orphaned). Returns the job's exit status."""
    family = {p.pid: p for p in _family(proc.pid)}
    deadline = time.monotonic() + grace_s
    _signal_group(proc.pid, signum)
    try:
        with signals_raise():
            proc.wait(timeout=grace_s)
            if family:     # ranks in sessions of their own may outlive their launcher
                import psutil
                psutil.wait_procs(list(family.values()),
                                  timeout=max(0.0, deadline - time.monotonic()))
    except (subprocess.TimeoutExpired, Interrupted):
        pass
    if proc.poll() is None:
        # Only while the launcher is not reaped: until then its pid, the group's id, is
        # ours; after, the launchers have waited for their own workers.
        family.update((p.pid, p) for p in _family(proc.pid))
        _signal_group(proc.pid, signal.SIGKILL)
    for process in family.values():
        with contextlib.suppress(Exception):   # gone already, or its pid reused
            process.kill()
    proc.wait()
    return _status(proc.returncode)


def _status(returncode: int) -> int:
    # Popen reports a process killed by signal N as -N; a shell as 128 + N.
    return 128 - returncode if returncode < 0 else returncode


def run(command: Sequence[str], cwd: str | os.PathLike | None = None,
        on_output: Callable[[bytes, bool], None] | None = None, merge: bool = False,
        terminal: bool = False, grace_s: float = STOP_GRACE_S) -> int:
    """Run ``command`` in a session of its own until it ends; returns its exit status.

    What it prints goes to ``on_output(chunk, from_stderr)`` as it comes (default: our
    own stdout or stderr), with ``merge`` its stderr as stdout. With ``terminal``, when our
    stdout and stderr are a terminal, the job gets a pseudo-terminal (its output then all
    comes as stdout): ranks that write to it directly, as torchrun's do, still see a
    terminal and draw their progress bars. SIGINT, SIGTERM or SIGHUP meanwhile stops the
    job (``stop``) and raises ``Interrupted``.

    Example::

        code = run(["horovodrun", "-np", "2", ...], cwd=repo)
    """
    def passthrough(chunk: bytes, from_stderr: bool) -> None:
        stream = sys.stderr if from_stderr else sys.stdout
        stream.flush()
        stream.buffer.write(chunk)
        stream.buffer.flush()

    emit = on_output or passthrough
    lock = threading.Lock()

    def pump(fd: int, from_stderr: bool) -> None:
        # chunks, not lines: a progress bar redraws its line without ending it
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:              # a pseudo-terminal whose job has ended: EIO
                chunk = b""
            if not chunk:
                break
            with lock:
                emit(chunk, from_stderr)
        os.close(fd)

    with signals_raise():
        if terminal and sys.stdout.isatty() and sys.stderr.isatty():
            import pty
            fd, job_side = pty.openpty()
            _copy_window_size(sys.stderr.fileno(), job_side)
            proc = subprocess.Popen(list(command), cwd=cwd, stdout=job_side, stderr=job_side,
                                    start_new_session=True)
            os.close(job_side)
            sources = [(fd, False)]
        else:
            proc = subprocess.Popen(list(command), cwd=cwd, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT if merge else subprocess.PIPE,
                                    start_new_session=True)
            pipes = [(proc.stdout, False)] + ([] if merge else [(proc.stderr, True)])
            sources = [(os.dup(pipe.fileno()), err) for pipe, err in pipes]
            for pipe, _ in pipes:
                pipe.close()
        # daemons: a process that outlived a kill and holds a pipe must not hold us too
        pumps = [threading.Thread(target=pump, args=source, daemon=True) for source in sources]
        for thread in pumps:
            thread.start()
        try:
            proc.wait()
        except Interrupted as signalled:
            stop(proc, signalled.signum, grace_s)
            for thread in pumps:
                thread.join(timeout=5)
            raise
        for thread in pumps:
            thread.join()
    return _status(proc.returncode)


def _copy_window_size(source: int, target: int) -> None:
    """Our terminal's size onto the job's pseudo-terminal, so that its bars fit."""
    with contextlib.suppress(OSError, ImportError):
        import fcntl
        import termios
        fcntl.ioctl(target, termios.TIOCSWINSZ,
                    fcntl.ioctl(source, termios.TIOCGWINSZ, b"\0" * 8))


class _Lines:
    """Cuts a stream of chunks into lines (the last, unfinished one kept for later)."""

    def __init__(self) -> None:
        self._rest = b""

    def feed(self, chunk: bytes) -> list[str]:
        *lines, self._rest = (self._rest + chunk).split(b"\n")
        return [line.decode(errors="replace") for line in lines]

    def close(self) -> list[str]:
        return [self._rest.decode(errors="replace")] if self._rest else []


def main(argv: Sequence[str] | None = None) -> int:
    """``python gravac/util/job.py -- COMMAND...`` (see the module docstring)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print("usage: python gravac/util/job.py -- COMMAND [ARG ...]", file=sys.stderr)
        return 2
    streams = {False: _Lines(), True: _Lines()}
    seen: list[str] = []

    def passthrough(chunk: bytes, from_stderr: bool) -> None:
        stream = sys.stderr if from_stderr else sys.stdout
        stream.buffer.write(chunk)
        stream.buffer.flush()
        seen.extend(filter(None, [error_line(streams[from_stderr].feed(chunk))]))

    try:
        code = run(args, on_output=passthrough, terminal=True)
    except Interrupted as signalled:
        return signalled.exit_code
    last = error_line(seen + [line for s in streams.values() for line in s.close()])
    if code != 0 and last:
        # after the launcher's own report of the failure, which would bury it
        print(last, file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
