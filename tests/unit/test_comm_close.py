"""``Comm.close()``: torch.distributed's process group is ended by the Comm that started it
(a barrier, then ``destroy_process_group``), and left alone when the caller started it.
One process, a world of 1 over gloo: the same calls a torchrun job makes."""
import socket

import pytest
import torch
import torch.distributed as dist

import gravac.comm
from gravac.comm.torchdist import TorchDistComm


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
