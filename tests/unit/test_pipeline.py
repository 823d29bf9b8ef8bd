"""The one step pipeline: what it defines once holds for every exchange, with and without
overlap (4 thread ranks on 2 hosts of 2). ``t_discarded`` is the ``DISCARDED_PHASES``
of a step that compressed and went dense, and the controller's t_iter leaves exactly that
out; the options and the exchanges come from one registry."""
import dataclasses

import pytest
import torch

from gravac.controllers import SENT_DENSE, Controller, StepPlan
from gravac.engine import EXCHANGE_KINDS, EXCHANGES, GravacOptions
from gravac.engine.optimizer import wrap_optimizer
from gravac.engine.phases import DISCARDED_PHASES, PHASES
from gravac.train.config import CompressionConfig

from thread_comm import run_ranks

HOSTS = [0, 0, 1, 1]
#: (exchange, overlap, compressor): every step shape the pipeline has.
SHAPES = [("allgather", False, "topk"), ("allgather", True, "topk"),
          ("allgather_coded", False, "topk"), ("allgather_coded", True, "topk"),
          ("shared_index", False, "topk"), ("hierarchical", False, "topk"),
          ("allgather", False, "powersgd")]


class _AlwaysDense(Controller):
    """Plans two levels, then sends dense: every step throws its compression away."""

    def __init__(self):
        self.records = []

    def plan(self, step):
        return StepPlan(theta_min=4.0, theta_c=8.0, needs_gains=True)

    def decide(self, gain_min, gain_c):
        return SENT_DENSE

    def end_step(self, record, sync):
        self.records.append(record)


def _steps(comm, exchange, overlap, compressor, steps=3):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(48, 64), torch.nn.ReLU(), torch.nn.Linear(64, 40))
    ctrl = _AlwaysDense()
    opt = wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.01), model.named_parameters(),
                         comm, compressor=compressor, controller=ctrl, min_compress_numel=256,
                         exchange=exchange, overlap=overlap)
    torch.manual_seed(comm.rank + 1)
    out = []
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 48)).square().mean().backward()
        opt.step()
        out.append((opt.last_stats, ctrl.records[-1]))
    return out


@pytest.mark.parametrize("exchange, overlap, compressor", SHAPES)
def test_a_dense_step_tells_the_controller_t_iter_without_its_discarded_phases(
        exchange, overlap, compressor):
    result = run_ranks(len(HOSTS), lambda comm: _steps(comm, exchange, overlap, compressor),
                       hosts=HOSTS)
    for rank_steps in result:
        for stats, record in rank_steps[1:]:          # the first step has no t_iter
            assert stats.sent == SENT_DENSE and record.sent == SENT_DENSE
            discarded = sum(getattr(stats, p) for p in DISCARDED_PHASES)
            assert stats.t_discarded == discarded > 0
            assert record.t_iter == pytest.approx(stats.t_iter - stats.t_discarded, abs=1e-12)
            assert 0 < record.t_iter < stats.t_iter


@pytest.mark.parametrize("exchange, compressor", [("shared_index", "topk"),
                                                  ("allgather", "powersgd")])
def test_a_selection_round_is_charged_to_its_own_phase(exchange, compressor):
    """The index sets' allreduce and PowerSGD's P travel before the decision: their wait
    is t_wait_select, which a dense step discards; not the exchange's wait."""
    assert "t_wait_select" in DISCARDED_PHASES and set(DISCARDED_PHASES) <= set(PHASES)
    result = run_ranks(2, lambda comm: _steps(comm, exchange, False, compressor, steps=2))
    for rank_steps in result:
        for stats, _ in rank_steps:
            assert stats.t_wait_select > 0


def test_options_registry_and_config_section_are_one_definition():
    names = {f.name for f in dataclasses.fields(GravacOptions)}
    config = {f.name: f for f in dataclasses.fields(CompressionConfig)}
    for f in GravacOptions.config_fields():
        assert config[f.name].default == f.default
    assert {"batch_size", "name_prefix", "defer_agreement"} <= names - set(config)
    assert EXCHANGE_KINDS == tuple(k for k, c in EXCHANGES.items() if c.selectable)
    assert "lowrank" in EXCHANGES and "lowrank" not in EXCHANGE_KINDS
    for kind in EXCHANGE_KINDS:
        assert EXCHANGES[kind].__module__.rsplit(".", 1)[1] in (kind, "allgather")


def test_both_front_ends_document_every_option_from_the_one_definition():
    import gravac
    import gravac.torch
    for front_end in (gravac.DistributedOptimizer, gravac.torch.DistributedOptimizer):
        for f in dataclasses.fields(GravacOptions):
            assert f"{f.name} (default {f.default!r}):" in front_end.__doc__
