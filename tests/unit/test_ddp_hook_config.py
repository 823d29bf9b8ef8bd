"""compression.front_end: gravac as PyTorch DDP's communication hook in train.py, refused in
one line wherever it cannot apply; in one process (--dry-run) gravac's optimizer."""
import pytest

from gravac.comm.local import LocalComm
from gravac.train.config import ConfigError, load_config
from gravac.train.method import Gravac, build_method

DEMO = "configs/demo.yaml"


def _load(tmp_path, *sets, files=()):
    return load_config([DEMO, *files], [f"run.output_dir={tmp_path}", *sets])


@pytest.mark.parametrize("sets, message", [
    (["compression.front_end=hook"], "compression.front_end='hook': must be one of "
                                     "optimizer, ddp_hook"),
    (["compression.front_end=ddp_hook", "compression.controller=dense"],
     "with controller dense the run is plain DDP already"),
])
def test_bad_settings_are_one_line(tmp_path, sets, message):
    with pytest.raises(ConfigError, match=message):
        _load(tmp_path, *sets)


class _HorovodLike(LocalComm):
    backend = "horovod"


def test_refused_under_horovod(tmp_path):
    cfg = _load(tmp_path, "compression.front_end=ddp_hook")
    with pytest.raises(ConfigError, match="front_end=.ddp_hook.: PyTorch DDP runs on "
                                         "torch.distributed"):
        build_method(cfg, _HorovodLike())


def test_one_process_runs_gravacs_optimizer(tmp_path):
    cfg = _load(tmp_path, "compression.front_end=ddp_hook")
    assert type(build_method(cfg, LocalComm())) is Gravac
