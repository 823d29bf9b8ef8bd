"""``Comm.close()``: torch.distributed's process group is ended by the Comm that started it
(a barrier, then ``destroy_process_group``), and left alone when the caller started it.
One process, a world of 1 over gloo: the same calls a torchrun job makes."""
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import gravac.comm
from gravac.comm.torchdist import TorchDistComm

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def world_of_one(monkeypatch):
    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
                       "RANK": "0", "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(key, value)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_close_ends_the_group_that_init_started(world_of_one):
    comm = gravac.comm.init("torch", gpu=False)
    assert dist.is_initialized()
    assert comm.allreduce(torch.tensor([3.0]), op="sum", name="t").item() == 3.0
    comm.close()
    assert not dist.is_initialized()
    comm.close()                                  # a second close does nothing
    assert not dist.is_initialized()


def test_close_leaves_a_group_the_caller_started(world_of_one):
    dist.init_process_group("gloo")
    comm = gravac.comm.init("torch", gpu=False)   # joins the caller's group
    comm.close()
    assert dist.is_initialized()
    assert comm.allreduce(torch.tensor([2.0]), op="sum", name="t").item() == 2.0
    TorchDistComm().close()                       # made directly: not its group either
    assert dist.is_initialized()


def test_the_local_transport_closes_without_effect():
    comm = gravac.comm.init("local")
    comm.close()
    assert comm.allreduce(torch.tensor([5.0]), op="average", name="t").item() == 5.0


# A process's end: the last words are flushed, the exit status kept; after a gloo group
# the interpreter is not finalized (an atexit handler does not run), so gloo's worker
# threads cannot ask a finalizing interpreter for the GIL (gravac/comm/process_exit.py).
END_SCRIPT = """
import atexit, sys
import torch
from gravac.comm import end_process, init
atexit.register(lambda: print(" finalized", flush=True))
if sys.argv[1] == "torch":
    comm = init("torch", gpu=False)
    assert comm.allreduce(torch.ones(1), op="sum", name="t").item() == 1.0
    comm.close()
sys.stdout.write("last words")          # no newline, not flushed: end_process flushes it
end_process(3)
"""


@pytest.mark.parametrize("backend, finalized", [("torch", False), ("local", True)])
def test_end_process_skips_finalization_after_gloo_only(tmp_path, backend, finalized):
    script = tmp_path / "end.py"
    script.write_text(END_SCRIPT)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
           "RANK": "0", "WORLD_SIZE": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(script), backend], capture_output=True,
                          text=True, env=env, cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    assert done.stdout == ("last words finalized\n" if finalized else "last words"), done.stdout
