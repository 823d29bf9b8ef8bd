"""compression.ddp_powersgd_rank: PyTorch DDP's PowerSGD hook as a torchrun baseline,
refused in one line wherever it cannot apply."""
import pytest

from gravac.comm.local import LocalComm
from gravac.train.config import ConfigError, load_config
from gravac.train.method import build_method

DEMO = "configs/demo.yaml"


def _load(tmp_path, *sets, files=("configs/compression/ddp_powersgd_rank4.yaml",)):
    return load_config([DEMO, *files], [f"run.output_dir={tmp_path}", *sets])


def test_the_config_files_load(tmp_path):
    for r in (1, 4):
        cfg = _load(tmp_path, files=(f"configs/compression/ddp_powersgd_rank{r}.yaml",))
        assert cfg.compression.ddp_powersgd_rank == r
        assert cfg.compression.controller == "dense"


@pytest.mark.parametrize("sets, message", [
    (["compression.ddp_powersgd_rank=0"], "must be >= 1 or null"),
    (["compression.controller=static"], "needs compression.controller=dense"),
    (["compression.dense_wire=fp16"], "two DDP hooks"),
    (["compression.ddp_start_powersgd_iter=1"], "must be >= 2"),
])
def test_bad_settings_are_one_line(tmp_path, sets, message):
    with pytest.raises(ConfigError, match=message):
        _load(tmp_path, *sets)


class _HorovodLike(LocalComm):
    backend = "horovod"


def test_refused_under_horovod(tmp_path):
    cfg = _load(tmp_path)
    with pytest.raises(ConfigError, match=r"ddp_powersgd_rank=4: PyTorch DDP runs on "
                                          r"torch.distributed"):
        build_method(cfg, _HorovodLike())


class _TorchLike(LocalComm):
    backend = "torch"


@pytest.mark.parametrize("model_name", ["small_cnn", "resnet18", "lstm"])
def test_the_step_record_counts_what_the_powersgd_hook_sends(tmp_path, model_name):
    # PyTorch's own rule (_should_compress on each gradient's (shape[0], -1) view, at the
    # hook's default min_compression_rate) is the reference; dense before its start.
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

    from gravac.models import build_model
    from gravac.train.method import TorchDDP

    cfg = _load(tmp_path, "compression.ddp_start_powersgd_iter=5")
    method = TorchDDP(cfg, _TorchLike())
    kwargs = {"vocab_size": 1000} if model_name == "lstm" else {"num_classes": 10}
    model = build_model(model_name, **kwargs)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    numel = sum(p.numel() for p in model.parameters())
    expected = 0
    for p in model.parameters():
        n, m = p.reshape(p.shape[0], -1).shape
        worth, whole, factors = _should_compress(n, m, min(n, m, 4), 2)
        expected += factors if worth else whole
    early, late = method.step_stats(opt, 4, numel), method.step_stats(opt, 5, numel)
    assert (early.sent, early.floats_sent, early.bytes_sent) == ("dense", numel, 4 * numel)
    assert (late.sent, late.floats_sent, late.bytes_sent) == ("min", expected, 4 * expected)
    assert late.floats_sent < numel and late.cf == numel / expected


@pytest.mark.parametrize("file, width", [("configs/compression/dense.yaml", 4),
                                         ("configs/compression/horovod_fp16.yaml", 2)])
def test_dense_baselines_log_their_bytes(tmp_path, file, width):
    # Before: 0 bytes on every step line of the baselines (and in TensorBoard).
    import torch

    from gravac.train.method import TorchDDP

    model = torch.nn.Linear(8, 4)
    method = TorchDDP(_load(tmp_path, files=(file,)), _TorchLike())
    stats = method.step_stats(torch.optim.SGD(model.parameters(), lr=0.1), 0, 36)
    assert (stats.sent, stats.floats_sent, stats.bytes_sent) == ("dense", 36, width * 36)
