"""Evaluation sets at their edges and what a run says at start: fewer test
samples than ranks, none at all, a PTB validation file of one row per rank; a GraVAC window
that no run step reaches the end of."""
from pathlib import Path

import pytest

from gravac.comm.local import LocalComm
from gravac.train.config import ConfigError, load_config
from gravac.train.loop import train
from gravac.train.tasks import build_task
from thread_comm import run_ranks
from tiny_data import write_ptb

REPO = Path(__file__).resolve().parents[2]


def _images(tmp_path, num_test: int):
    return load_config([str(REPO / "configs/demo.yaml")], [
        f"run.output_dir={tmp_path}", "data.name=synthetic_images", "data.batch_size=4",
        f"data.options={{num_train: 64, num_test: {num_test}, image_size: 8}}"])


def test_an_evaluation_set_smaller_than_the_ranks_is_measured_over_its_samples(tmp_path):
    """2 test samples, 4 ranks: ranks 2 and 3 hold none (the final evaluation crashed with
    "upper bound and lower bound inconsistent"); the result is the 1-rank evaluation's."""
    cfg = _images(tmp_path, num_test=2)
    alone = build_task(cfg, rank=0, world_size=1)
    expected = alone.evaluate(None, LocalComm())
    tasks = [build_task(cfg, rank=r, world_size=4) for r in range(4)]
    for task in tasks:
        task.model.load_state_dict(alone.model.state_dict())
    results = run_ranks(4, lambda comm: tasks[comm.rank].evaluate(None, comm))
    for result in results:
        assert result == pytest.approx(expected)
    assert expected["top1"] in (0.0, 0.5, 1.0)          # over the 2 samples, nothing else


def test_an_empty_evaluation_set_is_refused_not_reported_as_zero(tmp_path):
    with pytest.raises(ConfigError) as err:
        build_task(_images(tmp_path, num_test=0), rank=0, world_size=1)
    assert str(err.value) == ("data.options.num_test=0: the evaluation set is empty, so there "
                              "is nothing to measure the model on; set it >= 1")


def test_a_ptb_validation_file_of_one_row_per_rank_is_refused(tmp_path):
    """One row of data.eval_batch_size per rank holds inputs but no next words: the
    evaluation measured nothing and reported perplexity 1."""
    write_ptb(tmp_path)
    (tmp_path / "ptb.valid.txt").write_text(" w1 w2 w3 \n")       # 3 words + <eos>: 4 tokens
    cfg = load_config([str(REPO / "configs/models/lstm_ptb.yaml")],
                      [f"data.root={tmp_path}", f"run.output_dir={tmp_path / 'runs'}",
                       "data.batch_size=2", "data.eval_batch_size=2"])
    with pytest.raises(ConfigError) as err:
        build_task(cfg, rank=0, world_size=2)
    assert str(err.value) == (
        f"data.root={str(tmp_path)!r}: {tmp_path}/ptb.valid.txt: 4 tokens, fewer than one "
        "evaluation batch (data.eval_batch_size=2 per rank x 2 ranks x 2 rows) needs (8); use "
        "the full file, or a smaller data.eval_batch_size")


@pytest.mark.parametrize("steps, warned", [(50, True), (51, False)])
def test_a_gravac_window_the_run_never_finishes_is_said_at_start(tmp_path, capsys, steps,
                                                                  warned):
    cfg = load_config([str(REPO / "configs/demo.yaml")],       # GraVAC, window 50
                      [f"run.output_dir={tmp_path}", f"run.steps={steps}",
                       "run.backend=local"])
    train(cfg, dry_run=True)
    lines = capsys.readouterr().out.splitlines()
    warning = (f"warning: compression.gravac.window=50 is not shorter than the run's {steps} "
               "steps: no window ends before the run does, so GraVAC never changes its CFs; "
               "lower the window or raise run.steps")
    assert (warning in lines) == warned
