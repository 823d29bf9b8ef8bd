"""run.device: which device a rank trains on, and the one-line refusals (CPU-runnable; the
GPU runs themselves are tests/unit/test_cuda_train.py)."""
import types

import pytest
import torch

from gravac.comm import LocalComm
from gravac.train import device as D
from gravac.train.config import ConfigError, load_config
from gravac.train.device import rank_device, to_device, wants_gpu


def test_cpu_is_cpu_and_auto_without_a_gpu_is_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert rank_device("cpu", LocalComm()) == torch.device("cpu")
    assert rank_device("auto", LocalComm()) == torch.device("cpu")
    assert not wants_gpu("auto") and not wants_gpu("cuda")


def test_cuda_without_a_gpu_is_one_line_naming_the_field(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"^run.device='cuda': this process sees no CUDA GPU") as e:
        rank_device("cuda", LocalComm())
    assert "\n" not in str(e.value) and "run.device=cpu" in str(e.value)


def test_horovod_without_gpu_operations(monkeypatch):
    """A CPU-only Horovod cannot move CUDA tensors: auto falls back to the CPU, cuda is refused."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(D, "_horovod_gpu_ops", lambda: False)
    comm = types.SimpleNamespace(backend="horovod", local_rank=0)
    assert rank_device("auto", comm) == torch.device("cpu")
    with pytest.raises(ConfigError, match="HOROVOD_GPU_OPERATIONS=NCCL"):
        rank_device("cuda", comm)


def test_more_ranks_on_a_host_than_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    comm = types.SimpleNamespace(backend="local", local_rank=2)
    with pytest.raises(ConfigError, match=r"local rank 2 needs GPU 2 but this host has 2"):
        rank_device("cuda", comm)


def test_unknown_device_is_a_config_error():
    with pytest.raises(ConfigError, match=r"run.device"):
        load_config([], ["run.steps=1", "run.device=gpu"])
    assert load_config([], ["run.steps=1"]).run.device == "auto"


def test_to_device_keeps_cpu_batches_and_their_structure():
    batch = (torch.ones(2), torch.zeros(3, dtype=torch.long))
    assert to_device(batch, torch.device("cpu")) is batch
    moved = to_device([torch.ones(1), (torch.ones(1),)][:1], torch.device("cpu"))
    assert isinstance(moved, list)
