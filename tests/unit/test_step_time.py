"""The controller's step time is training time only: ``train.py``'s loop restarts the
optimizer's step clock before every step, after the logging, evaluation and checkpoint of
the previous one (docs/ALGORITHM.md §7; what a restart leaves out is tested in
test_engine_measures.py)."""
from pathlib import Path

from gravac.engine.optimizer import DistributedOptimizerMixin
from gravac.train.config import load_config
from gravac.train.loop import Trainer, train

REPO = Path(__file__).resolve().parents[2]


def test_every_step_starts_its_clock_after_the_evaluation_and_checkpoint_before_it(
        tmp_path, monkeypatch):
    events = []

    def spy(cls, name, label):
        original = getattr(cls, name)

        def wrapped(self, *args, **kwargs):
            events.append(label)
            return original(self, *args, **kwargs)
        monkeypatch.setattr(cls, name, wrapped)
    spy(DistributedOptimizerMixin, "restart_step_clock", "restart")
    spy(DistributedOptimizerMixin, "synchronize", "step")
    spy(Trainer, "evaluate", "evaluate")
    spy(Trainer, "checkpoint", "checkpoint")
    cfg = load_config([str(REPO / "configs/demo.yaml")],
                      [f"run.output_dir={tmp_path}", "run.name=clock", "run.steps=6",
                       "run.backend=local", "run.progress=never", "run.report=false",
                       "run.eval_interval=2", "run.checkpoint_interval=3"])
    train(cfg)
    # Each step's clock restarts right before it, so nothing between steps is in it.
    steps = [i for i, e in enumerate(events) if e == "step"]
    assert len(steps) == 6
    assert all(events[i - 1] == "restart" for i in steps)
    between = events[steps[0]:steps[-1]]
    assert between.count("evaluate") == 2 and between.count("checkpoint") == 1
