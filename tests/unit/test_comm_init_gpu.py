"""``gravac.comm.init("torch")`` on GPUs: more ranks on a host than GPUs stop in one line
that names NCCL's rule and gloo as the way out, before ``set_device`` fails with "invalid
device ordinal". No process group starts here: ``set_device`` and
``init_process_group`` are replaced by stand-ins that record the call."""
import pytest
import torch
import torch.distributed as dist

import gravac.comm


class _Reached(Exception):
    """``init`` went on to this call (its name is the message)."""


@pytest.fixture
def torchrun_host(monkeypatch):
    """A torchrun rank on a host with ``gpus`` GPUs and ``ranks`` local ranks."""
    def host(gpus: int, ranks: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
        monkeypatch.setattr(dist, "is_initialized", lambda: False)

        def reached(name):
            def call(*args, **kwargs):
                raise _Reached(name)
            return call
        monkeypatch.setattr(torch.cuda, "set_device", reached("set_device"))
        monkeypatch.setattr(dist, "init_process_group", reached("init_process_group"))
        for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "RANK": "1",
                           "WORLD_SIZE": str(ranks), "LOCAL_RANK": "1",
                           "LOCAL_WORLD_SIZE": str(ranks)}.items():
            monkeypatch.setenv(key, value)
    return host


@pytest.mark.parametrize("gpu", [None, True])
def test_two_ranks_on_one_gpu_name_nccl_and_gloo(torchrun_host, gpu):
    torchrun_host(gpus=1, ranks=2)
    with pytest.raises(RuntimeError) as caught:
        gravac.comm.init("torch", gpu=gpu)
    message = str(caught.value)
    assert "\n" not in message
    for part in ("NCCL", "one GPU per rank", "2 ranks share 1 GPU", "gpu=False",
                 "run.device=cpu"):
        assert part in message, (part, message)


def test_a_gpu_per_rank_goes_on_to_set_device(torchrun_host):
    torchrun_host(gpus=2, ranks=2)
    with pytest.raises(_Reached, match="set_device"):
        gravac.comm.init("torch", gpu=True)


def test_gloo_does_not_count_gpus(torchrun_host):
    torchrun_host(gpus=1, ranks=2)
    with pytest.raises(_Reached, match="init_process_group"):
        gravac.comm.init("torch", gpu=False)
