"""--resume compares the config with the run's own and refuses what may not
change (gravac/train/resume.py), in one line, before anything is loaded or rewritten."""
import warnings
from pathlib import Path

import pytest

from gravac.train.config import Config, ConfigError, load_config, to_dict
from gravac.train.resume import MAY_CHANGE, check_resume_config, config_changes
from script_batch import run_scripts

REPO = Path(__file__).resolve().parents[2]
DEMO = str(REPO / "configs/demo.yaml")


def test_changes_are_listed_with_old_and_new_values():
    old = to_dict(load_config([DEMO]))
    new = load_config([DEMO], ["optimizer.lr=0.02", "run.steps=999", "data.root=/elsewhere"])
    assert config_changes(old, to_dict(new), to_dict(Config())) == {
        "optimizer.lr": (old["optimizer"]["lr"], 0.02), "run.steps": (old["run"]["steps"], 999),
        "data.root": (None, "/elsewhere")}
    problem, notes = check_resume_config(old, new)
    assert problem == (
        f"--resume: the config differs from the run's in optimizer.lr {old['optimizer']['lr']!r}"
        " -> 0.02; a resumed run continues the same experiment. Undo the change, start a new "
        "run (another run.name), or force it with --set run.resume_allow_changes="
        "[optimizer.lr] (or all)")
    forced = load_config([DEMO], ["optimizer.lr=0.02", "run.resume_allow_changes=[optimizer]"])
    assert check_resume_config(old, forced) == (
        None, [f"resume: allowed change optimizer.lr {old['optimizer']['lr']!r} -> 0.02"])
    everything = load_config([DEMO], ["model.name=resnet18", "run.resume_allow_changes=all"])
    assert check_resume_config(old, everything)[0] is None
    # a field the old config.yaml lacks (added since) counts as its default
    del old["run"]["stall_timeout"], old["compression"]["gravac"]["settle_dense"]
    assert check_resume_config(old, load_config([DEMO])) == (None, [])
    assert "run.steps" in MAY_CHANGE and "optimizer.lr" not in MAY_CHANGE


def test_unknown_allowed_names_are_refused():
    with pytest.raises(ConfigError, match=r"run.resume_allow_changes=\['optimiser.lr'\]: "
                                          "names no config key: optimiser.lr"):
        load_config([DEMO], ["run.resume_allow_changes=[optimiser.lr]"])


def _train_args(tmp_path, *args):
    return ["train.py", "--config", DEMO, *args, "--set", f"run.output_dir={tmp_path}",
            "--set", "run.name=r", "--set", "run.backend=local", "--set", "run.report=false"]


def _train(tmp_path, *commands):
    """``python train.py ...`` for each argument list in ``commands``, in one python process
    (tests/script_batch.py), each as a process of its own would run it."""
    return run_scripts([(REPO, _train_args(tmp_path, *args)) for args in commands], timeout=600)


def test_resume_with_another_method_or_model_is_refused_in_one_line(tmp_path):
    (first,) = _train(tmp_path, ["--set", "run.steps=2"])
    assert first.returncode == 0, first.stderr
    config_yaml = (tmp_path / "r" / "config.yaml").read_text()
    metrics = (tmp_path / "r" / "metrics.jsonl").read_text()
    dense, model, forced_model = _train(
        tmp_path,
        [str(REPO / "configs/compression/dense.yaml"), "--resume", "--set", "run.steps=3"],
        ["--resume", "--set", "run.steps=3", "--set", "model.name=wide_head_cnn"],
        ["--resume", "--set", "run.steps=3", "--set", "model.name=wide_head_cnn",
         "--set", "run.resume_allow_changes=all"])
    assert dense.returncode == 2
    lines = dense.stderr.strip().splitlines()
    assert len(lines) == 1 and "compression.controller 'gravac' -> 'dense'" in lines[0]
    assert "run.resume_allow_changes=[" in lines[0]
    assert model.returncode == 2 and "Traceback" not in model.stderr
    assert "model.name 'small_cnn' -> 'wide_head_cnn'" in model.stderr
    assert len(model.stderr.strip().splitlines()) == 1
    assert forced_model.returncode == 2 and "Traceback" not in forced_model.stderr
    assert "holds another model (" in forced_model.stderr
    # nothing was rewritten by the refused resumes
    assert (tmp_path / "r" / "config.yaml").read_text() == config_yaml
    assert (tmp_path / "r" / "metrics.jsonl").read_text() == metrics
    # a longer run is fine; a forced change is said and applied
    (forced,) = _train(tmp_path, ["--resume", "--set", "run.steps=3", "--set", "optimizer.lr=0.01",
                                  "--set", "run.resume_allow_changes=[optimizer.lr]"])
    assert forced.returncode == 0, forced.stderr
    assert "resume: allowed change optimizer.lr" in forced.stdout
    assert "lr: 0.01" in (tmp_path / "r" / "config.yaml").read_text()


def test_without_config_yaml_the_resume_compares_with_the_checkpoints_config(tmp_path):
    """A run folder copied without its config.yaml accepted any change; every checkpoint
    holds the run's config, so the comparison reads that one."""
    (first,) = _train(tmp_path, ["--set", "run.steps=2", "--set", "run.checkpoint_interval=1"])
    assert first.returncode == 0, first.stderr
    (tmp_path / "r" / "config.yaml").unlink()
    model, same = _train(
        tmp_path, ["--resume", "--set", "run.steps=3", "--set", "model.name=wide_head_cnn"],
        ["--resume", "--set", "run.steps=3"])
    assert model.returncode == 2 and "Traceback" not in model.stderr
    assert "model.name 'small_cnn' -> 'wide_head_cnn'" in model.stderr
    assert "comparing with the config saved in " in model.stdout
    assert same.returncode == 0, same.stderr


def _trainer(tmp_path, *sets):
    from gravac.comm.local import LocalComm
    from gravac.train.loop import Trainer

    cfg = load_config([DEMO], [f"run.output_dir={tmp_path}", "run.name=r", "run.backend=local",
                               "run.report=false", "run.checkpoint_interval=0",
                               "optimizer.lr_milestones=[2]", *sets])
    return Trainer(cfg, LocalComm())


def test_a_forced_optimizer_change_is_applied_not_undone_by_the_checkpoint(tmp_path):
    """torch's load_state_dict takes the saved param groups: a forced optimizer.lr or
    momentum was announced as allowed and then trained with the checkpoint's values."""
    from gravac.train.loop import train

    train(load_config([DEMO], [f"run.output_dir={tmp_path}", "run.name=r", "run.backend=local",
                               "run.report=false", "run.steps=4",
                               "optimizer.lr_milestones=[2]"]))
    same = _trainer(tmp_path, "run.steps=6")
    same.start(resume=True)
    group = same.opt.param_groups[0]
    assert (group["lr"], group["momentum"]) == (0.05 * 0.1, 0.9)   # past the milestone
    same.release_run_dir()
    forced = _trainer(tmp_path, "run.steps=6", "optimizer.lr=0.01", "optimizer.momentum=0.5",
                      "optimizer.lr_warmup_steps=8", "run.resume_allow_changes=[optimizer]")
    forced.start(resume=True)
    group = forced.opt.param_groups[0]
    # the new schedule at the saved step 4: half-way up the warm-up, past the milestone
    assert group["momentum"] == 0.5
    assert group["lr"] == pytest.approx(0.01 * (0.01 + 0.99 * 4 / 8) * 0.1)
    with warnings.catch_warnings():    # "scheduler.step() before optimizer.step()": no step here
        warnings.simplefilter("ignore")
        forced.scheduler.step()
    assert group["lr"] == pytest.approx(0.01 * (0.01 + 0.99 * 5 / 8) * 0.1)
    forced.release_run_dir()


def test_a_forced_controller_change_that_its_state_cannot_take_is_one_line(tmp_path):
    """The refusal offers run.resume_allow_changes; for a controller's settings that ended
    in the controller's ValueError traceback when the checkpoint was loaded."""
    from gravac.train.loop import train

    train(load_config([DEMO], [f"run.output_dir={tmp_path}", "run.name=r", "run.backend=local",
                               "run.report=false", "run.steps=2"]))
    for change in ("compression.gravac.window=30", "compression.controller=accordion"):
        trainer = _trainer(tmp_path, "run.steps=4", change, "run.resume_allow_changes=all")
        with pytest.raises(ConfigError, match=r"^--resume: the optimizer state in .*step_00000002 "
                                              r"does not fit this run's \(.*\); .* start a new run$"):
            trainer.start(resume=True)
        trainer.release_run_dir()


def test_check_refuses_a_resume_with_another_number_of_ranks_before_the_launch(tmp_path):
    """The launch scripts pass the ranks they start (--ranks): a checkpoint of another
    world size is the check's one line, not every launched rank's after the launcher
    started them."""
    import contextlib
    import io

    from gravac.train.cli import main

    (first,) = _train(tmp_path, ["--set", "run.steps=2"])
    assert first.returncode == 0, first.stderr
    # (No run.backend=local: the check names the launcher that starts the job.)
    args = ["--config", DEMO, "--resume", "--set", f"run.output_dir={tmp_path}", "run.name=r"]
    for ranks, code in ((2, 2), (1, 0)):
        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            assert main([*args, "--ranks", str(ranks), "--check", "horovodrun"]) == code
        if code:
            assert err.getvalue() == ("config error: --resume: the checkpoint was written by 1 "
                                      "ranks, this job has 2; run it with 1 ranks (horovodrun "
                                      "-np 1 or torchrun --nproc-per-node ...)\n")
