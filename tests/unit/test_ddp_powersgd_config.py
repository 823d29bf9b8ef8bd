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
