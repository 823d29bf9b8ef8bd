"""PowerSGD across 2 ranks: the applied update equals an independent PowerSGD computed here
from both ranks' gathered gradients (P averaged, orthogonalised by QR, Q averaged, M̂ = P Qᵀ),
residuals are g_ef − M̂, full rank is the dense average, GraVAC over it decides alike on
every rank, and a resume from a state dict or a training checkpoint is exact."""
import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gravac.compressors.powersgd import PowerSGD, matrix_shape, rank_for_cf
from gravac.controllers import GraVAC, Static
from gravac.train.loop import train

from helpers import (COMM, ONE_TRANSPORT, barrier, demo_config, distributed_optimizer, gather_rows,
                     make_net, rank_batch)

COMPRESSED = ["fc1.weight", "fc2.weight"]


def _loss(model, step, rank):
    x, y = rank_batch(step, rank)
    return F.cross_entropy(model(x), y)


class Reference:
    """PowerSGD with error feedback for every rank at once, in plain torch: the warm start's
    first draw is the only thing taken from gravac (``PowerSGD.warm_start``: a seeded
    generator, the same on every rank)."""

    def __init__(self, params, size, seed=0):
        self.params, self.size = params, size
        self.residual = {(r, n): torch.zeros(params[n].numel()) for r in range(size)
                         for n in COMPRESSED}
        self.q = {}
        self.fresh = PowerSGD(seed=seed)

    def _q(self, name, cols, r):
        have = self.q.get(name)
        if have is None or have.shape[1] < r:
            draws = self.fresh.warm_start(name, cols, r, like=torch.zeros(1)).clone()
            self.q[name] = draws if have is None else torch.cat([have, draws[:, have.shape[1]:]], 1)
        return self.q[name][:, :r]

    def step(self, name, raw, r_min, r_sent, r_c=None):
        """(the averaged M̂ of layer ``name``, gain sums) from every rank's raw gradient
        (raw: size x numel). r_sent None: sent dense (the average of g_ef; residuals
        cleared). Gain sums: Σ‖Q_i‖², Σ‖Q_i[:, :r_c]‖², Σ‖g_ef‖² over ranks."""
        rows, cols = matrix_shape(self.params[name].shape)
        g_ef = [raw[r] + self.residual[(r, name)] for r in range(self.size)]
        ms = [g.view(rows, cols) for g in g_ef]
        q = self._q(name, cols, r_min)
        p = torch.stack([m @ q for m in ms]).mean(0)
        p, _ = torch.linalg.qr(p)            # another method than gravac's Gram-Schmidt
        local_q = [m.t() @ p for m in ms]
        energy = (sum(float(lq.pow(2).sum()) for lq in local_q),
                  sum(float(lq[:, :r_c or r_min].pow(2).sum()) for lq in local_q),
                  sum(float(g.pow(2).sum()) for g in g_ef))
        if r_sent is None:
            for r in range(self.size):
                self.residual[(r, name)] = torch.zeros_like(g_ef[r])
            return torch.stack(g_ef).mean(0), energy
        p = p[:, :r_sent]
        q_new = torch.stack([lq[:, :r_sent] for lq in local_q]).mean(0)
        m_hat = (p @ q_new.t()).reshape(-1)
        for r in range(self.size):
            self.residual[(r, name)] = g_ef[r] - m_hat
        self.q[name][:, :r_sent] = q_new
        return m_hat, energy


def _run_against_reference(opt, model, steps, rank, size, ranks_of):
    params = dict(model.named_parameters())
    ref = Reference(params, size)
    history = []
    for step in range(steps):
        opt.zero_grad()
        _loss(model, step, rank).backward()
        raw = {n: gather_rows(params[n].grad, f"test.psgd.raw.{n}") for n in params}
        opt.step()
        s = opt.last_stats
        history.append((s.sent, s.cf, s.gain_min, s.gain_c))
        sums = [0.0, 0.0, 0.0]
        for n in COMPRESSED:
            r_min, r_sent, r_c = ranks_of(s, *matrix_shape(params[n].shape))
            expected, energy = ref.step(n, raw[n], r_min, r_sent, r_c)
            assert torch.allclose(params[n].grad.view(-1), expected, rtol=1e-4, atol=1e-6), \
                f"{n} step {step}"
            assert torch.allclose(opt.memory[n].view(-1), ref.residual[(rank, n)],
                                  rtol=1e-4, atol=1e-6), f"residual of {n} step {step}"
            sums = [a + b for a, b in zip(sums, energy)]
        if s.gain_min is not None:
            assert s.gain_min == pytest.approx(sums[0] / sums[2], rel=1e-4), step
        if s.gain_c is not None:
            assert s.gain_c == pytest.approx(sums[1] / sums[2], rel=1e-4), step
        for n, rows in raw.items():
            if n not in COMPRESSED:
                assert torch.allclose(params[n].grad.view(-1), rows.mean(0), rtol=0, atol=1e-7)
    return history


def test_static_rank_update_equals_independent_powersgd(rank, size):
    model = make_net()
    opt = distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                model.named_parameters(), compressor="powersgd",
                                controller=Static(rank=3))
    assert opt.compressed_layer_names == COMPRESSED
    _run_against_reference(opt, model, 5, rank, size, lambda s, rows, cols: (3, 3, None))
    s = opt.last_stats
    # fc1 96 x 32, fc2 96 x 96 at rank 3 (P and Q), plus the dense layers.
    factors = 3 * (96 + 32) + 3 * (96 + 96)
    dense = sum(p.numel() for n, p in model.named_parameters() if n not in COMPRESSED)
    assert s.floats_sent == factors + dense and s.values_sent == factors
    assert s.bytes_sent == 4 * (factors + dense)
    barrier("test.psgd.static")


def test_static_cf_maps_to_a_rank_per_layer(rank, size):
    model = make_net()
    opt = distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                model.named_parameters(), compressor="powersgd",
                                controller=Static(cf=10))
    ranks = lambda s, rows, cols: (rank_for_cf(rows, cols, 10),) * 2 + (None,)
    _run_against_reference(opt, model, 3, rank, size, ranks)
    assert opt.last_stats.cf == 10.0
    barrier("test.psgd.cf")


def test_full_rank_reproduces_the_dense_average(rank, size):
    """rank = min(rows, cols) is exact while the gradients have full rank: a batch of 128
    per rank (at batch 16 a 96 x 96 gradient has rank <= 32, the warm-start Q = Mᵀ P then
    has that rank, and what the next P cannot reach goes to the residuals)."""
    model = make_net()
    opt = distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                model.named_parameters(), compressor="powersgd",
                                compressor_options={"min_cf": 0}, controller=Static(rank=96))
    params = dict(model.named_parameters())
    prev = {n: torch.zeros(params[n].numel()) for n in COMPRESSED}
    for step in range(3):
        opt.zero_grad()
        x, y = rank_batch(step, rank, batch=128)
        F.cross_entropy(model(x), y).backward()
        raw = {n: gather_rows(p.grad, f"test.psgd.full.{n}") for n, p in params.items()}
        opt.step()
        res = {n: gather_rows(opt.memory[n], f"test.psgd.full.res.{n}") for n in COMPRESSED}
        assert opt.last_stats.sparse_layers == 2
        for n, rows in raw.items():
            # fp32 Gram-Schmidt over up to 96 columns: equal to a few 1e-6 (entries up to 0.2)
            assert torch.allclose(params[n].grad.view(-1), rows.mean(0), rtol=1e-4, atol=1e-5), \
                (n, step, float((params[n].grad.view(-1) - rows.mean(0)).abs().max()))
        for n in COMPRESSED:
            # residual = g_ef - M̂ with M̂ the average: each rank keeps its distance to the
            # average, and the residuals cancel in the next step's average.
            g_ef = raw[n][rank] + prev[n]
            assert torch.allclose(res[n][rank], g_ef - params[n].grad.view(-1), atol=1e-5)
            assert float(res[n].sum(0).abs().max()) < 1e-5
            prev[n] = res[n][rank]
    barrier("test.psgd.full")


def _gravac_ranks(s, rows, cols):
    """(r_min, r_sent, r_c) of a GraVAC step from its record; r_sent None: sent dense;
    r_c None: no candidate."""
    r_min = rank_for_cf(rows, cols, s.theta_min)
    r_c = None if s.theta_c is None else min(rank_for_cf(rows, cols, s.theta_c), r_min)
    r_sent = {"dense": None, "candidate": r_c, "min": r_min}[s.sent]
    return r_min, r_sent, r_c


def test_gravac_over_powersgd_equals_reference_and_decides_alike_on_every_rank(rank, size):
    model = make_net()
    # ε and α chosen so that the 16 steps send the candidate, θmin and dense (seen: 2, 12, 2).
    ctrl = GraVAC(theta_min=4, theta_max=64, epsilon=0.4, window=4, alpha=0.5)
    opt = distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                model.named_parameters(), compressor="powersgd",
                                controller=ctrl, batch_size=16)
    history = _run_against_reference(opt, model, 16, rank, size, _gravac_ranks)
    everyone = COMM.allgather_object(history, name="test.psgd.history")
    decisions = COMM.allgather_object(
        [{k: v for k, v in d.items() if k != "table"} for d in ctrl.decisions],
        name="test.psgd.decisions")
    q = COMM.allgather_object({n: t.clone() for n, t in opt.compressor.state_dict()["q"].items()},
                              name="test.psgd.q")
    weights = {n: gather_rows(p.detach(), f"test.psgd.w.{n}") for n, p in model.named_parameters()}
    barrier("test.psgd.gravac")
    assert everyone[0] == everyone[1]
    assert decisions[0] == decisions[1] and len(decisions[0]) == 4
    sent = {h[0] for h in history}
    assert sent == {"candidate", "min", "dense"}, history    # every level checked above
    for n in q[0]:
        assert torch.equal(q[0][n], q[1][n]), f"warm start of {n} differs across ranks"
    for n, rows in weights.items():
        assert torch.equal(rows[0], rows[1]), f"{n} differs across ranks"


def test_reset_world_gives_every_rank_rank_0s_warm_start(rank):
    """An elastic reset: a joining process has no Q; after reset_world every rank has rank
    0's and the next steps match across ranks."""
    model = make_net()
    opt = distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                model.named_parameters(), compressor="powersgd",
                                controller=Static(rank=2))
    _train_steps(model, opt, range(3), rank)
    if rank == 1:
        opt.compressor.reset()                     # as a process that just joined
    opt.reset_world(COMM)
    q = COMM.allgather_object(opt.compressor.state_dict()["q"], name="test.psgd.reset.q")
    _train_steps(model, opt, range(3, 5), rank)
    weights = {n: gather_rows(p.detach(), f"test.psgd.reset.w.{n}")
               for n, p in model.named_parameters()}
    barrier("test.psgd.reset")
    assert q[0].keys() == q[1].keys() == set(COMPRESSED)
    assert all(torch.equal(q[0][n], q[1][n]) for n in COMPRESSED)
    for n, rows in weights.items():
        assert torch.equal(rows[0], rows[1]), n


def _train_steps(model, opt, steps, rank):
    for step in steps:
        opt.zero_grad()
        _loss(model, step, rank).backward()
        opt.step()


@pytest.mark.parametrize("controller", [
    lambda: GraVAC(theta_min=4, theta_max=64, epsilon=0.5, window=3, omega=0, alpha=0.5),
    lambda: Static(rank=2)], ids=["gravac", "static-rank2"])
def test_resume_from_state_dict_gives_identical_next_steps(controller, rank):
    def build():
        model = make_net()
        return model, distributed_optimizer(
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model.named_parameters(),
            compressor="powersgd", controller=controller())

    straight_model, straight = build()
    _train_steps(straight_model, straight, range(8), rank)
    first_model, first = build()
    _train_steps(first_model, first, range(4), rank)
    state = copy.deepcopy((first_model.state_dict(), first.state_dict()))
    resumed_model, resumed = build()
    resumed_model.load_state_dict(state[0])
    resumed.load_state_dict(state[1])
    _train_steps(resumed_model, resumed, range(4, 8), rank)
    barrier("test.psgd.resume")
    for (n, a), b in zip(straight_model.named_parameters(), resumed_model.parameters()):
        assert torch.equal(a, b), n
    for n in COMPRESSED:
        assert torch.equal(straight.memory[n], resumed.memory[n])
    qa, qb = straight.compressor.state_dict()["q"], resumed.compressor.state_dict()["q"]
    assert qa.keys() == qb.keys() and all(torch.equal(qa[n], qb[n]) for n in qa)


@pytest.mark.parametrize("files,extra", [
    pytest.param(["static_powersgd_rank4.yaml"], [], marks=ONE_TRANSPORT),
    pytest.param(["accordion_powersgd.yaml"], ["compression.accordion.interval_steps=6",
                                               "compression.accordion.switch_freq=2"],
                 marks=ONE_TRANSPORT),
    (["gravac_exp_powersgd.yaml"], ["compression.gravac.window=8", "compression.gravac.omega=0",
                                    "compression.gravac.theta_min=2"]),
], ids=["static-rank4", "accordion-rank4-1", "gravac"])
def test_training_checkpoint_resumes_exactly(files, extra, shared_tmp):
    """2N steps straight == N steps, stop, resume from the checkpoint, N more: the same
    weights, residuals and warm-start Q (the checkpoint holds both)."""
    n = 30
    cfg = lambda name, steps, *more: demo_config(shared_tmp, name, *files, steps=steps,
                                                 extra=["run.eval_interval=0",
                                                        "run.checkpoint_interval=0", *extra,
                                                        *more])
    # no report (plots) of the runs before the resume: nothing reads them (the resumed
    # run writes its own)
    train(cfg("straight", 2 * n, "run.report=false"))
    train(cfg("resumed", n, "run.report=false"))
    train(cfg("resumed", 2 * n), resume=True)
    root = Path(shared_tmp)
    a = torch.load(root / "straight/checkpoints/step_00000060/common.pt", weights_only=False)
    b = torch.load(root / "resumed/checkpoints/step_00000060/common.pt", weights_only=False)
    mine = f"checkpoints/step_00000060/rank_{COMM.rank:05d}.pt"
    ra = torch.load(root / "straight" / mine, weights_only=False)["optimizer"]["gravac"]
    rb = torch.load(root / "resumed" / mine, weights_only=False)["optimizer"]["gravac"]
    barrier("test.psgd.checkpoint")
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    assert a["cum_floats"] == b["cum_floats"]
    assert ra["compressor"]["q"], "no PowerSGD state in the checkpoint"
    for name, q in ra["compressor"]["q"].items():
        assert torch.equal(q, rb["compressor"]["q"][name]), name
    for name, residual in ra["memory"]["residuals"].items():
        assert torch.equal(residual, rb["memory"]["residuals"][name]), name
