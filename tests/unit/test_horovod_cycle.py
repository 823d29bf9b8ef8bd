"""Horovod's background cycle (gravac/comm/horovod_cycle.py): what "auto" picks, and
that a config's value reaches the environment hvd.init() reads."""
import pytest

from gravac.comm.horovod_cycle import (CROWDED_CYCLE_MS, ENV, apply_cycle_time,
                                       resolve_cycle_time)
from gravac.train.config import ConfigError, load_config


def test_auto_lengthens_the_cycle_when_ranks_crowd_the_cores():
    # 2 ranks on 2 cores: each rank's thread and Horovod's thread cannot have a core each.
    assert resolve_cycle_time("auto", {"HOROVOD_LOCAL_SIZE": "2"}, cpu_count=2) == \
        (f"{CROWDED_CYCLE_MS:g}", "auto: 2 ranks on 2 cores")
    assert resolve_cycle_time("auto", {"OMPI_COMM_WORLD_LOCAL_SIZE": "3"}, cpu_count=4)[0] == \
        f"{CROWDED_CYCLE_MS:g}"


def test_auto_leaves_roomy_hosts_and_user_settings_alone():
    assert resolve_cycle_time("auto", {"HOROVOD_LOCAL_SIZE": "2"}, cpu_count=16) == \
        (None, "Horovod's default")
    # Not launched by horovodrun/mpirun: nothing known, nothing changed.
    assert resolve_cycle_time("auto", {}, cpu_count=1)[0] is None
    # The user's own HOROVOD_CYCLE_TIME wins over auto ...
    assert resolve_cycle_time("auto", {ENV: "0.5", "HOROVOD_LOCAL_SIZE": "2"}, cpu_count=2) == \
        (None, f"{ENV} from the environment")
    # ... but not over an explicit number in the config.
    assert resolve_cycle_time(2, {ENV: "0.5"}, cpu_count=2) == ("2", "run.horovod_cycle_time_ms")
    assert resolve_cycle_time("horovod", {"HOROVOD_LOCAL_SIZE": "8"}, cpu_count=2)[0] is None


@pytest.mark.parametrize("bad", [0, -1, True, "fast", None, float("inf")])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError, match="horovod_cycle_time_ms"):
        resolve_cycle_time(bad, {}, cpu_count=2)


def test_apply_sets_the_environment(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert apply_cycle_time(2.5) == ("2.5", "run.horovod_cycle_time_ms")
    import os
    assert os.environ[ENV] == "2.5"


def test_config_validates_the_setting(tmp_path):
    cfg = load_config(["configs/demo.yaml"], ["run.horovod_cycle_time_ms=3",
                                              f"run.output_dir={tmp_path}"])
    assert cfg.run.horovod_cycle_time_ms == 3
    with pytest.raises(ConfigError, match=r"run.horovod_cycle_time_ms=0\.0: must be 'auto'"):
        load_config(["configs/demo.yaml"], ["run.horovod_cycle_time_ms=0",
                                            f"run.output_dir={tmp_path}"])
