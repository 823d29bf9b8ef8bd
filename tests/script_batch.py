"""Several ``python SCRIPT ARGS`` command lines in ONE python process, each with the exit
status, standard output and standard error it has as a process of its own.

For tests whose subject is what a command prints and returns, not the interpreter's
start-up (importing torch alone takes seconds here, once per process). Each command runs
as ``python SCRIPT ARGS`` runs it: ``runpy.run_path(SCRIPT, run_name="__main__")`` with
``sys.argv = [SCRIPT, *ARGS]``, the script's folder first on ``sys.path``, from its working
directory; its file descriptors 1 and 2 point at files of its own (prints, warnings,
faulthandler output and tracebacks all land there); the warning filters and the
"shown once" registries start afresh; an uncaught exception is printed as the
interpreter prints it, with exit status 1. What carries over from one command to the next
is what imports and process-wide settings leave behind: put only commands in one batch
whose outcome does not hang on a fresh process.

Example::

    done = run_scripts([(REPO, ["train.py", "--help"]),
                        (REPO, ["train.py", "--config", "configs/demo.yaml", "--check"])])
    done[0].returncode, done[0].stdout, done[1].stderr
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

DRIVER = r"""
import json, os, runpy, sys, traceback, warnings

commands, out_dir = json.loads(sys.argv[1]), sys.argv[2]
filters, path, cwd = list(warnings.filters), list(sys.path), os.getcwd()
codes = []
for i, (where, argv) in enumerate(commands):
    sys.stdout.flush(); sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(os.path.join(out_dir, f"{i}.out"), "wb") as out, \
            open(os.path.join(out_dir, f"{i}.err"), "wb") as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        warnings.filters[:] = filters
        warnings._filters_mutated()
        warnings.onceregistry.clear()
        os.chdir(where)
        script = os.path.abspath(argv[0])
        sys.argv = list(argv)
        sys.path[:] = ([os.path.dirname(script)] if os.path.isfile(script) else []) + path[1:]
        try:
            runpy.run_path(argv[0], run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = exc.code
            if code is None:
                code = 0
            elif not isinstance(code, int):
                print(code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush(); sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0]); os.close(saved[1])
        os.chdir(cwd)
    codes.append(code)
with open(os.path.join(out_dir, "codes.json"), "w") as f:
    json.dump(codes, f)
"""


def run_scripts(commands: list[tuple[Path | str, list[str]]], python: str = sys.executable,
                timeout: float = 600) -> list[subprocess.CompletedProcess]:
    """Run ``python ARGV`` from the folder ``cwd`` for each ``(cwd, ARGV)``, in that order, in
    one process; one ``CompletedProcess`` (returncode, stdout, stderr as text) per command."""
    with tempfile.TemporaryDirectory(prefix="script-batch-") as out_dir:
        driver = subprocess.run(
            [python, "-c", DRIVER, json.dumps([(str(cwd), list(map(str, argv)))
                                               for cwd, argv in commands]), out_dir],
            capture_output=True, text=True, timeout=timeout)
        codes_file = Path(out_dir) / "codes.json"
        assert driver.returncode == 0 and codes_file.exists(), \
            f"the batch itself failed ({driver.returncode}):\n{driver.stdout}\n{driver.stderr}"
        codes = json.loads(codes_file.read_text())
        return [subprocess.CompletedProcess(
                    [python, *map(str, argv)], code,
                    (Path(out_dir) / f"{i}.out").read_text(errors="replace"),
                    (Path(out_dir) / f"{i}.err").read_text(errors="replace"))
                for i, ((_, argv), code) in enumerate(zip(commands, codes))]
