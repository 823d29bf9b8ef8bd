"""Accordion driven by scripted gradients (no Horovod)."""
import pytest
import torch

from gravac.controllers import Accordion, LocalSync, StepRecord, base

SYNC = LocalSync()


def drive(ctrl, norms_per_interval, steps_per_interval=2):
    """Feed each layer a gradient whose accumulated norm over an interval is scripted."""
    plans = []
    step = 0
    for norms in norms_per_interval:
        for _ in range(steps_per_interval):
            plans.append(ctrl.plan(step).layer_cf)
            grads = {name: torch.full((4,), norm / steps_per_interval / 2.0)  # ‖·‖ = norm
                     for name, norm in norms.items()}
            ctrl.observe_gradients(grads)
            ctrl.end_step(StepRecord(step, "min", 1.0, 1.0, 0.1), SYNC)
            step += 1
    return plans


def test_switches_per_layer_on_norm_change():
    ctrl = Accordion(low_cf=10, high_cf=1000, switch_freq=2, interval_steps=2, eta=0.5)
    ctrl.bind(["a", "b"], SYNC)
    assert ctrl.layer_cf == {"a": 10, "b": 10}                       # first interval critical
    # intervals 0..4: 'a' changes by 75% between 0 and 2 (critical), 'b' by 10% (not)
    plans = drive(ctrl, [{"a": 4.0, "b": 1.0}, {"a": 4.0, "b": 1.0},
                         {"a": 1.0, "b": 0.9}, {"a": 1.0, "b": 0.9},
                         {"a": 0.9, "b": 0.2}])
    assert plans[0] == {"a": 10, "b": 10} and plans[5] == {"a": 10, "b": 10}
    assert plans[6] == {"a": 10, "b": 1000}                          # after interval 2
    assert ctrl.layer_cf == {"a": 1000, "b": 10}                     # after interval 4
    d = ctrl.decisions
    assert [x["interval"] for x in d] == [2, 4]
    assert d[0]["ratios"]["a"] == pytest.approx(0.75) and d[0]["ratios"]["b"] == pytest.approx(0.1)


def test_lr_decay_sends_every_layer_to_low_cf_and_epoch_intervals():
    ctrl = Accordion(low_cf=4, high_cf=64, switch_freq=1)             # intervals = epochs
    ctrl.bind(["a"], SYNC)
    for epoch, norm in enumerate([1.0, 1.05, 1.1]):
        drive(ctrl, [{"a": norm}], steps_per_interval=3)
        ctrl.end_interval()
    assert ctrl.layer_cf == {"a": 64}
    ctrl.on_lr_decay()
    assert ctrl.layer_cf == {"a": 4} and ctrl.plan(99).layer_cf == {"a": 4}


def test_state_roundtrip_and_errors():
    ctrl = Accordion(low_cf=10, high_cf=100, switch_freq=2, interval_steps=2)
    ctrl.bind(["a"], SYNC)
    drive(ctrl, [{"a": 1.0}, {"a": 2.0}])
    ctrl.observe_gradients({"a": torch.ones(4)})
    other = Accordion(low_cf=10, high_cf=100, switch_freq=2, interval_steps=2)
    other.bind(["a"], SYNC)
    other.load_state_dict(ctrl.state_dict())
    assert other.state_dict()["state"] == ctrl.state_dict()["state"]
    assert torch.equal(other.state_dict()["accumulators"]["a"], torch.ones(4))
    with pytest.raises(ValueError, match="saved with"):
        Accordion(low_cf=10, high_cf=200, switch_freq=2).load_state_dict(ctrl.state_dict())
    with pytest.raises(ValueError, match="high_cf"):
        Accordion(low_cf=100, high_cf=10, switch_freq=2)
    with pytest.raises(ValueError, match="switch_freq must be an int >= 1"):
        Accordion(low_cf=1, high_cf=10, switch_freq=0)
    with pytest.raises(ValueError, match="eta must be a number > 0"):
        Accordion(low_cf=1, high_cf=10, switch_freq=1, eta=0)
    with pytest.raises(RuntimeError, match="before the controller was given"):
        Accordion(low_cf=1, high_cf=10, switch_freq=1).end_interval()


class _Recording(LocalSync):
    def __init__(self):
        self.sent = []

    def broadcast_object(self, obj, name):
        self.sent.append(obj)
        return obj


def test_intervals_keep_the_latest_decisions_and_broadcast_no_history(monkeypatch):
    """An interval's broadcast carries its state and new record, not the records before
    (a per-layer dict each, so the message grew with every interval), and ``decisions``
    keeps the latest DECISIONS_KEPT, ``decisions_made`` counting all."""
    monkeypatch.setattr(base, "DECISIONS_KEPT", 3)
    sync = _Recording()
    ctrl = Accordion(low_cf=10, high_cf=100, switch_freq=1, interval_steps=1, eta=0.5)
    ctrl.bind(["a"], sync)
    drive(ctrl, [{"a": 1.0 + i} for i in range(10)], steps_per_interval=1)
    assert ctrl.decisions_made == 9 and [d["interval"] for d in ctrl.decisions] == [7, 8, 9]
    state, record = sync.sent[-1]
    assert "decisions" not in state and record["interval"] == 9
