"""PowerSGD: the low-rank math (CF <-> rank, orthogonalisation, prefixes, warm start,
state) and the engine's low-rank path in one process; its config keys."""
import pytest
import torch

from gravac import compressors
from gravac.comm.local import LocalComm
from gravac.compressors.powersgd import (PowerSGD, compression_factor, matrix_shape,
                                         orthogonalize_, orthogonalize_all_, rank_for_cf)
from gravac.controllers import Accordion, GraVAC, Static
from gravac.engine import wrap_optimizer


# -- CF <-> rank ----------------------------------------------------------------------------
def test_matrix_view_is_first_dimension_by_the_rest():
    assert matrix_shape((64, 3, 3, 3)) == (64, 27)
    assert matrix_shape((10,)) == (10, 1)
    assert matrix_shape((6000, 1500)) == (6000, 1500)


def test_cf_of_a_rank_is_rows_cols_over_rank_times_sum():
    assert compression_factor(100, 300, 1) == 75.0
    assert compression_factor(100, 300, 4) == 18.75
    assert compression_factor(6000, 1500, 1) == 1200.0
    assert compression_factor(6000, 1500, 4) == 300.0
    with pytest.raises(ValueError, match="rank must be >= 1"):
        compression_factor(10, 10, 0)


@pytest.mark.parametrize("rows,cols,cf,rank", [
    (100, 300, 75, 1), (100, 300, 74.99, 1), (100, 300, 37.5, 2), (100, 300, 37.6, 1),
    (100, 300, 18.75, 4), (100, 300, 18.76, 3), (100, 300, 1000, 1), (100, 300, 1, 75),
    (6000, 1500, 300, 4), (6000, 1500, 1200, 1), (6000, 1500, 10, 120),
    (64, 576, 14.4, 4), (64, 576, 14.41, 3), (1, 2048, 10, 1),
])
def test_cf_maps_to_the_largest_rank_whose_cf_is_at_least_it(rows, cols, cf, rank):
    assert rank_for_cf(rows, cols, cf) == rank
    assert rank == 1 or compression_factor(rows, cols, rank) >= cf
    assert compression_factor(rows, cols, rank + 1) < cf


def test_rank_for_cf_refuses_cf_below_one():
    with pytest.raises(ValueError, match=">= 1"):
        rank_for_cf(10, 10, 0.5)


# -- orthogonalisation and prefixes ----------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_orthogonalize_gives_orthonormal_columns_spanning_the_input(dtype):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(200, 8, generator=g, dtype=dtype)
    p = orthogonalize_(a.clone())
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert torch.allclose(p.t() @ p, torch.eye(8, dtype=dtype), atol=tol)
    # Same span, in order: column j of a lies in the span of p's first j+1 columns.
    for j in range(8):
        proj = p[:, :j + 1] @ (p[:, :j + 1].t() @ a[:, j])
        assert torch.allclose(proj, a[:, j], atol=tol * 100)


def test_orthogonalize_zeroes_dependent_and_zero_columns_without_nan():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(50, 4, generator=g)
    a[:, 2] = 2 * a[:, 0] - a[:, 1]          # dependent
    a[:, 3] = 0                               # zero
    p = orthogonalize_(a.clone())
    assert torch.isfinite(p).all()
    assert float(p[:, 2].abs().max()) == 0 and float(p[:, 3].abs().max()) == 0
    assert torch.allclose(p[:, :2].t() @ p[:, :2], torch.eye(2), atol=1e-6)
    assert torch.equal(orthogonalize_(torch.zeros(5, 3)), torch.zeros(5, 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_orthogonalizing_many_matrices_at_once_equals_one_by_one(dtype):
    """The GPU's batched Gram-Schmidt (forced here on CPU tensors): matrices of several
    row counts and ranks (grouped by rank), a dependent and a zero column, a matrix that
    must stay alone in its group; equal to orthogonalize_ of each to rounding, the zero
    columns exactly zero, orthonormal, and still the prefix of a higher rank's result."""
    g = torch.Generator().manual_seed(3)
    shapes = [(64, 4), (2048, 4), (10, 4), (300, 4), (6000, 1), (7, 2), (50, 2), (99, 3)]
    mats = [torch.randn(*shape, generator=g, dtype=dtype) for shape in shapes]
    mats[2][:, 3] = 2 * mats[2][:, 0] - mats[2][:, 1]
    mats[3][:, 1] = 0
    one = [orthogonalize_(m.clone()) for m in mats]
    many = [m.clone() for m in mats]
    orthogonalize_all_(many, batched=True)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    for a, b, shape in zip(one, many, shapes):
        assert torch.allclose(a, b, atol=tol), shape
        live = b.abs().amax(0) > 0
        assert torch.allclose(b[:, live].t() @ b[:, live],
                              torch.eye(int(live.sum()), dtype=dtype), atol=tol), shape
    assert float(many[2][:, 3].abs().max()) == 0 and float(many[3][:, 1].abs().max()) == 0
    prefix = [m[:, :2].clone() for m in mats[:4]]
    orthogonalize_all_(prefix, batched=True)
    for full, head in zip(many[:4], prefix):
        assert torch.allclose(full[:, :2], head, atol=tol)


def test_orthogonalize_refuses_half_precision():
    with pytest.raises(ValueError, match="float32"):
        orthogonalize_(torch.randn(10, 2).half())


def test_rank_c_result_is_the_prefix_of_the_rank_r_result():
    """Multi-level for low rank: with one Q of r columns, the first c columns of the
    orthogonalised P and of Q = Mᵀ P are exactly the rank-c PowerSGD step."""
    g = torch.Generator().manual_seed(2)
    m = torch.randn(120, 80, generator=g)
    q = torch.randn(80, 6, generator=g)
    p = orthogonalize_(m @ q)
    q_new = m.t() @ p
    for c in (1, 2, 5):
        # Equal up to rounding: a matmul of c columns may sum in another order than of 6.
        p_c = orthogonalize_(m @ q[:, :c].contiguous())
        assert torch.allclose(p[:, :c], p_c, rtol=0, atol=1e-6)
        assert torch.allclose(q_new[:, :c], m.t() @ p_c, rtol=0, atol=1e-4)
        # Gram-Schmidt alone: column j depends only on columns 0..j.
        a = m @ q
        assert torch.allclose(orthogonalize_(a.clone())[:, :c], orthogonalize_(a[:, :c].clone()),
                              rtol=0, atol=1e-7)
        # and the gain identity: ‖P_c Q_cᵀ‖² = ‖Q_c‖² for orthonormal P_c
        m_hat = p_c @ (m.t() @ p_c).t()
        assert torch.allclose(m_hat.pow(2).sum(), (m.t() @ p_c).pow(2).sum(), rtol=1e-5)


def test_full_rank_reproduces_the_matrix():
    g = torch.Generator().manual_seed(3)
    for rows, cols in ((40, 30), (30, 40), (32, 32)):
        m = torch.randn(rows, cols, generator=g, dtype=torch.float64)
        comp = PowerSGD()
        r = min(rows, cols)
        p = orthogonalize_(m @ comp.warm_start("w", cols, r, like=m))
        m_hat = p @ (m.t() @ p).t()
        assert torch.allclose(m_hat, m, atol=1e-10)


# -- warm start and state ---------------------------------------------------------------------
def test_warm_start_is_seeded_alike_and_never_touches_the_global_rng():
    before = torch.get_rng_state()
    a = PowerSGD(seed=7).warm_start("fc.weight", 30, 4, like=torch.zeros(1))
    b = PowerSGD(seed=7).warm_start("fc.weight", 30, 4, like=torch.zeros(1))
    c = PowerSGD(seed=8).warm_start("fc.weight", 30, 4, like=torch.zeros(1))
    d = PowerSGD(seed=7).warm_start("fc.bias", 30, 4, like=torch.zeros(1))
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(a, b) and not torch.equal(a, c) and not torch.equal(a, d)
    assert a.dtype == torch.float32
    assert PowerSGD().warm_start("w", 5, 2, like=torch.zeros(1, dtype=torch.float16)).dtype \
        == torch.float32
    assert PowerSGD().warm_start("w", 5, 2, like=torch.zeros(1, dtype=torch.float64)).dtype \
        == torch.float64


def test_more_columns_later_are_the_columns_a_fresh_start_draws():
    comp = PowerSGD()
    one = comp.warm_start("w", 20, 1, like=torch.zeros(1)).clone()
    comp.adopt("w", torch.full((20, 1), 3.0))
    four = comp.warm_start("w", 20, 4, like=torch.zeros(1))
    fresh = PowerSGD().warm_start("w", 20, 4, like=torch.zeros(1))
    assert torch.equal(four[:, :1], torch.full((20, 1), 3.0))
    assert torch.equal(four[:, 1:], fresh[:, 1:])
    assert torch.equal(fresh[:, :1], one)
    with pytest.raises(ValueError, match="shapes must not change"):
        comp.warm_start("w", 21, 1, like=torch.zeros(1))


def test_state_dict_round_trip_restores_every_q():
    comp = PowerSGD(seed=3)
    comp.warm_start("a", 10, 2, like=torch.zeros(1))
    comp.warm_start("b", 7, 3, like=torch.zeros(1))
    comp.adopt("a", torch.arange(20.0).view(10, 2))
    state = comp.state_dict()
    other = PowerSGD(seed=3)
    other.load_state_dict(state)
    for name, cols, r in (("a", 10, 2), ("b", 7, 3)):
        assert torch.equal(other.warm_start(name, cols, r, like=torch.zeros(1)),
                           comp.warm_start(name, cols, r, like=torch.zeros(1)))
    state["q"]["a"].zero_()          # a copy: the compressor's state is its own
    assert not torch.equal(other.warm_start("a", 10, 2, like=torch.zeros(1)), state["q"]["a"])
    with pytest.raises(ValueError, match="seed 3"):
        PowerSGD(seed=4).load_state_dict(state)
    with pytest.raises(ValueError, match="not a PowerSGD state"):
        PowerSGD().load_state_dict({"generator": 1})


def test_powersgd_is_not_a_sparsifier_and_checks_its_options():
    comp = compressors.get("powersgd")
    assert comp.is_lowrank and not comp.is_dense
    with pytest.raises(TypeError, match="low-rank"):
        comp.select(torch.zeros(5), 2)
    with pytest.raises(ValueError, match="unknown option"):
        compressors.get("powersgd", sample_fraction=0.1)
    with pytest.raises(ValueError, match="min_cf"):
        compressors.get("powersgd", min_cf=-1)
    with pytest.raises(ValueError, match="seed"):
        compressors.get("powersgd", seed=1.5)
    assert not compressors.get("topk").is_lowrank


# -- the engine's low-rank path in one process ----------------------------------------------
def _model(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(),
                               torch.nn.Linear(96, 10)).to(dtype)


def _backward(model, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 64, generator=g).to(next(model.parameters()).dtype)
    model(x).float().pow(2).mean().backward()


def _opt(model, controller, **options):
    return wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                          LocalComm(), compressor="powersgd", controller=controller,
                          compressor_options=options, min_compress_numel=512)


def _reference(m, q):
    """Independent one-rank PowerSGD (QR instead of Gram-Schmidt: signs may differ, M̂ not)."""
    p, _ = torch.linalg.qr(m @ q)
    return p @ (m.t() @ p).t()


def test_one_rank_update_is_powersgd_of_g_ef_with_error_feedback():
    model = _model()
    opt = _opt(model, Static(rank=2))
    w = model[0].weight                     # 96 x 64: low-rank; model[2].weight is 10 x 96
    residual = torch.zeros(96, 64)
    q = PowerSGD().warm_start("0.weight", 64, 2, like=w).clone()
    for step in range(4):
        opt.zero_grad()
        _backward(model, step)
        g_ef = w.grad + residual
        opt.step()
        p, _ = torch.linalg.qr(g_ef @ q)
        q = g_ef.t() @ p
        m_hat = p @ q.t()
        assert torch.allclose(w.grad, m_hat, atol=1e-5), step
        residual = g_ef - m_hat
        assert torch.allclose(opt.memory["0.weight"], residual, atol=1e-5)
    s = opt.last_stats
    assert s.sent == "min" and s.sparse_layers == 2
    small = 10 * 2 + 96 * 2
    assert s.floats_sent == 96 * 2 + 64 * 2 + small + 96 + 10
    assert s.bytes_sent == 4 * s.floats_sent
    assert s.cf_actual == pytest.approx((96 * 64 + 960) / (96 * 2 + 64 * 2 + small))
    assert s.layer_cf == {"0.weight": compression_factor(96, 64, 2),
                          "2.weight": compression_factor(10, 96, 2)}


def test_full_rank_reproduces_the_dense_gradient_in_one_process():
    model, ref = _model(), _model()
    opt = _opt(model, Static(rank=1000), min_cf=0)
    plain = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(3):
        for mdl, o in ((model, opt), (ref, plain)):
            o.zero_grad()
            _backward(mdl, step)
            o.step()
        assert opt.last_stats.sparse_layers == 2          # min_cf=0: low-rank although larger
        for (name, a), b in zip(model.named_parameters(), ref.parameters()):
            assert torch.allclose(a.grad, b.grad, atol=1e-5), name
            assert torch.allclose(a, b, atol=1e-5), name
        assert float(opt.memory["0.weight"].abs().max()) < 1e-5


def test_layers_whose_factors_are_not_smaller_go_dense():
    model = _model()
    opt = _opt(model, Static(rank=8))       # 10 x 96 at rank 8: 848 floats < 960: low-rank
    _backward(model, 0)
    opt.step()
    assert opt.last_stats.sparse_layers == 2
    opt = _opt(model, Static(rank=9))       # 9 * 106 = 954 < 960: still smaller
    opt.zero_grad()
    _backward(model, 0)
    opt.step()
    assert opt.last_stats.sparse_layers == 2
    opt = _opt(model, Static(rank=10))      # rank 10 = min(rows, cols): 1060 > 960, dense
    opt.zero_grad()
    _backward(model, 0)
    raw = model[2].weight.grad.clone()
    opt.step()
    assert opt.last_stats.sparse_layers == 1
    assert torch.equal(model[2].weight.grad, raw)


def test_a_cf_plans_a_rank_per_layer():
    model = _model()
    opt = _opt(model, Static(cf=20))
    _backward(model, 0)
    opt.step()
    r0, r2 = rank_for_cf(96, 64, 20), rank_for_cf(10, 96, 20)
    assert (r0, r2) == (1, 1)
    assert opt.last_stats.cf == 20.0
    assert opt.last_stats.floats_sent == (96 + 64) * r0 + (10 + 96) * r2 + 96 + 10


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_gradients_are_compressed_in_float32(dtype):
    model = _model(dtype=dtype)
    opt = _opt(model, Static(rank=2))
    w = model[0].weight
    q = PowerSGD().warm_start("0.weight", 64, 2, like=torch.zeros(1)).clone()
    _backward(model, 0)
    g = w.grad.float()
    opt.step()
    assert opt.memory["0.weight"].dtype == torch.float32
    assert w.grad.dtype == dtype and torch.isfinite(w.grad).all()
    m_hat = _reference(g, q)
    assert torch.allclose(w.grad.float(), m_hat.to(dtype).float(), atol=1e-3)
    assert torch.allclose(opt.memory["0.weight"], g - m_hat, atol=1e-4)
    assert opt.last_stats.bytes_sent == 4 * ((96 + 64) * 2 + (10 + 96) * 2) + 2 * (96 + 10)


def test_gravac_gains_are_the_energy_of_both_ranks_approximations():
    model = _model()
    ctrl = GraVAC(theta_min=4, theta_max=16, window=100, epsilon=0.01)
    opt = _opt(model, ctrl)
    _backward(model, 0)
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    opt.step()
    s = opt.last_stats
    assert s.theta_min == 4 and s.theta_c == 8 and s.sent == "candidate"
    num_min = num_c = den = 0.0
    for name, (rows, cols) in (("0.weight", (96, 64)), ("2.weight", (10, 96))):
        m = grads[name]
        r_min, r_c = rank_for_cf(rows, cols, 4), rank_for_cf(rows, cols, 8)
        q = PowerSGD().warm_start(name, cols, r_min, like=m)
        num_min += float(_reference(m, q).pow(2).sum())
        num_c += float(_reference(m, q[:, :r_c]).pow(2).sum())
        den += float(m.pow(2).sum())
    assert s.gain_min == pytest.approx(num_min / den, rel=1e-4)
    assert s.gain_c == pytest.approx(num_c / den, rel=1e-4)
    assert s.gain_c < s.gain_min < 1


def test_gravac_dense_decision_sends_everything_and_clears_residuals():
    model = _model()
    opt = _opt(model, GraVAC(theta_min=4, theta_max=16, window=100, epsilon=1.0))
    _backward(model, 0)
    raw = {n: p.grad.clone() for n, p in model.named_parameters()}
    opt.step()
    s = opt.last_stats
    assert s.sent == "dense" and s.cf == 1.0
    for n, p in model.named_parameters():
        assert torch.equal(p.grad, raw[n])
    assert float(opt.memory["0.weight"].abs().max()) == 0
    p_floats = 96 * rank_for_cf(96, 64, 4) + 10 * rank_for_cf(10, 96, 4)
    assert s.floats_sent == s.dense_floats + p_floats      # P travelled before the decision


def test_accordion_in_ranks_switches_each_layer_between_two_ranks():
    model = _model()
    ctrl = Accordion(low_rank=4, high_rank=1, interval_steps=2, switch_freq=1, eta=1e9)
    opt = _opt(model, ctrl)
    cfs = []
    for step in range(6):
        opt.zero_grad()
        _backward(model, step)
        opt.step()
        cfs.append(opt.last_stats.layer_cf["0.weight"])
    # Critical first (rank 4); with eta huge nothing is critical after the first comparison.
    assert cfs[0] == compression_factor(96, 64, 4)
    assert cfs[-1] == compression_factor(96, 64, 1)


def test_resume_from_state_dict_repeats_the_next_steps_exactly():
    def run(steps, state=None):
        model = _model()
        opt = _opt(model, GraVAC(theta_min=4, theta_max=16, window=2, omega=0))
        if state is not None:
            model.load_state_dict(state[0])
            opt.load_state_dict(state[1])
        for step in range(*steps):
            opt.zero_grad()
            _backward(model, step)
            opt.step()
        return model, opt
    model, opt = run((0, 3))
    import copy
    state = (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()))
    assert set(state[1]["gravac"]["compressor"]["q"]) == {"0.weight", "2.weight"}
    straight_model, straight = run((0, 6))
    resumed_model, resumed = run((3, 6), state)
    for a, b in zip(straight_model.parameters(), resumed_model.parameters()):
        assert torch.equal(a, b)
    assert torch.equal(straight.memory["0.weight"], resumed.memory["0.weight"])


def test_ranks_need_powersgd():
    model = _model()
    with pytest.raises(ValueError, match="powersgd"):
        wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                       LocalComm(), compressor="topk", controller=Static(rank=4))


def test_rank_options_are_checked():
    with pytest.raises(ValueError, match=r"Static\(rank=0\)"):
        Static(rank=0)
    with pytest.raises(ValueError, match="both low_rank and high_rank"):
        Accordion(low_rank=4)
    with pytest.raises(ValueError, match=r"low_rank=1.*>= high_rank"):
        Accordion(low_rank=1, high_rank=4)
    with pytest.raises(ValueError, match="high_rank must be an int"):
        Accordion(low_rank=4, high_rank=0.5)
    assert "rank" not in Static(cf=10).describe()           # older set-ups still agree
    assert "low_rank" not in Accordion().describe()


# -- configuration ----------------------------------------------------------------------------
def _load(*overrides, files=("configs/demo.yaml",)):
    from gravac.train.config import load_config
    return load_config(list(files), list(overrides))


@pytest.mark.parametrize("overrides,message", [
    (["compression.controller=static", "compression.compressor=powersgd",
      "compression.compressor_options={sample_fraction: 0.1}"],
     "compression.compressor_options={'sample_fraction': 0.1} (compressor powersgd): "
     "unknown option"),
    (["compression.controller=static", "compression.compressor=topk", "compression.rank=4"],
     "compression.rank=4: PowerSGD ranks need compression.compressor=powersgd"),
    (["compression.controller=gravac", "compression.compressor=powersgd", "compression.rank=4"],
     "compression.rank=4: applies to compression.controller=static"),
    (["compression.controller=static", "compression.compressor=powersgd", "compression.rank=0"],
     "compression.rank=0: rank must be an int >= 1"),
    (["compression.controller=accordion", "compression.compressor=topk",
      "compression.accordion.low_rank=4", "compression.accordion.high_rank=1"],
     "compression.accordion.low_rank=4: PowerSGD ranks need compression.compressor=powersgd"),
    (["compression.controller=accordion", "compression.compressor=powersgd",
      "compression.accordion.low_rank=4"],
     "compression.accordion.low_rank=4: give both low_rank and high_rank"),
])
def test_bad_powersgd_configs_fail_in_one_line_naming_the_key(overrides, message):
    from gravac.train.config import ConfigError
    with pytest.raises(ConfigError) as info:
        _load(*overrides)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_powersgd_config_files_build_their_controllers():
    from gravac.train.config import build_controller
    cfg = _load(files=("configs/demo.yaml", "configs/compression/accordion_powersgd.yaml"))
    ctrl = build_controller(cfg.compression)
    assert cfg.compression.compressor == "powersgd"
    assert (ctrl.low_rank, ctrl.high_rank) == (4, 1) and ctrl.uses_ranks
    cfg = _load(files=("configs/demo.yaml", "configs/compression/static_powersgd_rank4.yaml"))
    assert build_controller(cfg.compression).rank == 4


def test_a_non_finite_step_leaves_residuals_and_q_untouched():
    model = _model()
    opt = _opt(model, Static(rank=2))
    _backward(model, 0)
    opt.step()
    memory = {n: opt.memory[n].clone() for n in opt.memory.names()}
    q = {n: t.clone() for n, t in opt.compressor.state_dict()["q"].items()}
    opt.zero_grad()
    _backward(model, 1)
    model[0].weight.grad[0, 0] = float("nan")
    opt.step()
    assert opt.last_stats.skipped
    assert all(torch.equal(opt.memory[n], memory[n]) for n in memory)
    assert all(torch.equal(t, q[n]) for n, t in opt.compressor.state_dict()["q"].items())


# -- against PyTorch's own PowerSGD hook ---------------------------------------------------
@pytest.mark.parametrize("rank", [2, 4, 8])
def test_steps_equal_torchs_powersgd_hook_in_a_world_of_one(monkeypatch, rank):
    """DDP's ``powerSGD_hook`` (error feedback, warm start; dense before its start step)
    and gravac's low-rank path from the same initial Q: the same gradients step by step,
    conv weights as (out channels) x (the rest), a rank above a layer's smaller side cut to
    it, and a layer whose factors are not smaller sent dense by both (5 x 96 at rank 8).
    The hook orthogonalises its warm-start Q and gravac does not: the same span, so the
    same M̂ up to rounding."""
    import copy
    import types

    import torch.distributed as dist
    import torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook as hook

    from gravac.controllers.base import Controller, StepPlan
    start = 2

    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(16 * 4 * 4, 96), torch.nn.ReLU(),
                              torch.nn.Linear(96, 5)).double()
    mine = copy.deepcopy(ref)
    cols = {"0.weight": 72, "3.weight": 256, "5.weight": 96}
    rows = {"0.weight": 16, "3.weight": 96, "5.weight": 5}
    g = torch.Generator().manual_seed(7)
    q0 = {c: torch.randn(c, rank, generator=g, dtype=torch.float64) for c in cols.values()}

    class _Torch(types.SimpleNamespace):       # the hook's torch, drawing q0 as its first Q
        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def randn(batch, rows, r, device=None, dtype=None):
            return q0[rows][:, :r].unsqueeze(0).to(dtype)
    monkeypatch.setattr(hook, "torch", _Torch())

    class Ranks(Controller):
        uses_ranks = True

        def plan(self, step):
            if step < start:
                return StepPlan(theta_min=1.0)
            return StepPlan(theta_min=2.0, layer_rank={name: rank for name in cols})

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(ref, bucket_cap_mb=100)
        ddp.register_comm_hook(hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=start,
            min_compression_rate=1, use_error_feedback=True, warm_start=True,
            batch_tensors_with_same_shape=False), hook.powerSGD_hook)
        opt_ref = torch.optim.SGD(ddp.parameters(), lr=0.1)
        opt = wrap_optimizer(torch.optim.SGD(mine.parameters(), lr=0.1),
                             mine.named_parameters(), LocalComm(), compressor="powersgd",
                             controller=Ranks(), min_compress_numel=1)
        for name, c in cols.items():      # gravac's first Q: q0 too
            r = min(rank, rows[name], c)
            opt.compressor.warm_start(name, c, r, like=q0[c]).copy_(q0[c][:, :r])
        for step in range(6):
            x = torch.randn(4, 8, 6, 6, generator=torch.Generator().manual_seed(step)).double()
            for model, o in ((ddp, opt_ref), (mine, opt)):
                o.zero_grad()
                model(x).pow(2).mean().backward()
                o.step()
            for (name, a), b in zip(ref.named_parameters(), mine.parameters()):
                assert torch.allclose(b.grad, a.grad, rtol=1e-9, atol=1e-12), (step, name)
            assert opt.last_stats.sent == ("dense" if step < start else "min")
            assert opt.last_stats.sparse_layers == (0 if step < start else 2 if rank == 8 else 3)
    finally:
        dist.destroy_process_group()
