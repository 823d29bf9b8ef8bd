"""controller: auto in the engine (2 thread ranks): every rank runs the same method at
every step; switching methods carries the error-feedback residual over exactly (PowerSGD:
residual + M̂ = gradient + previous residual; dense: the residual is sent whole); the
checkpoint holds Auto's state and PowerSGD's Q, and a resumed optimizer steps as the
original does."""
import pytest
import torch

from gravac.controllers import Auto, Method
from gravac.engine.optimizer import wrap_optimizer

from thread_comm import run_ranks


def _model():
    """The same model on every rank (thread ranks share torch's global generator)."""
    model = torch.nn.Sequential(torch.nn.Linear(48, 96), torch.nn.ReLU(), torch.nn.Linear(96, 40))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    return model


def _optimizer(comm, model, **auto):
    ctrl = Auto(**{"trial_steps": 2, "settle_steps": 1, "recheck_every": 6, **auto})
    opt = wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.05), model.named_parameters(),
                         comm, compressor="topk", controller=ctrl, min_compress_numel=256)
    return opt, ctrl


def _backward(model, gen):
    model(torch.randn(8, 48, generator=gen)).square().mean().backward()


def test_every_rank_runs_the_same_methods_and_decisions():
    def job(comm):
        model = _model()
        opt, ctrl = _optimizer(comm, model)
        gen = torch.Generator().manual_seed(comm.rank + 1)
        methods = []
        for _ in range(40):
            opt.zero_grad()
            _backward(model, gen)
            opt.step()
            methods.append((opt.last_stats.method, opt.last_stats.sent))
        return methods, ctrl.decisions, [p.detach().clone() for p in model.parameters()]
    (m0, d0, p0), (m1, d1, p1) = run_ranks(2, job)
    assert m0 == m1 and d0 == d1
    assert {m for m, _ in m0} >= {"dense", "fp16"}
    assert any(d["event"] == "chosen" for d in d0)
    for a, b in zip(p0, p1):
        assert torch.equal(a, b)                  # the same averaged update on both ranks


def _forced_step(opt, ctrl, model, gen, key):
    """One step of method ``key``: (grad + residual before, residual after, synced grad)
    per compressed layer."""
    ctrl._switch(key, "run")
    opt.zero_grad()
    _backward(model, gen)
    names = opt.compressed_layer_names
    params = dict(model.named_parameters())
    before = {n: params[n].grad.detach().clone().view(-1) + _residual(opt, n, params[n])
              for n in names}
    opt.synchronize()
    after = {n: _residual(opt, n, params[n]) for n in names}
    synced = {n: params[n].grad.detach().clone().view(-1) for n in names}
    with opt.skip_synchronize():
        opt.step()
    assert opt.last_stats.method == key
    assert opt.last_stats.sent == ("dense" if Method.parse(key.split("/")[0]).dense else "min")
    return before, after, synced


def _residual(opt, name, param):
    if name not in opt.memory:
        return torch.zeros(param.numel())
    return opt.memory[name].detach().clone().view(-1)


def test_switching_methods_carries_the_residual_over():
    def job(comm):
        model = _model()
        opt, ctrl = _optimizer(comm, model, recheck_every=1000, epsilon=1e-6)
        gen = torch.Generator().manual_seed(comm.rank + 1)
        out = {}
        for key in ("sparse:10", "powersgd:4", "sparse:20", "dense", "fp16"):
            out[key] = _forced_step(opt, ctrl, model, gen, key)
        return out
    ranks = run_ranks(2, job)
    for rank in ranks:
        before, after, synced = rank["sparse:10"]
        for n in before:                           # Top-k kept 1/10 of g_ef, the rest stays
            assert after[n].abs().sum() > 0
            kept = (after[n] == 0) & (before[n] != 0)
            assert int(kept.sum()) == -(-before[n].numel() // 10)
        before, after, synced = rank["powersgd:4"]
        for n in before:                           # residual + M̂ = g + previous residual
            torch.testing.assert_close(after[n] + synced[n], before[n], rtol=0, atol=1e-6)
            assert after[n].abs().sum() > 0
    for key in ("dense", "fp16"):                  # dense sends g_ef whole: no residual left
        for n in ranks[0][key][0]:
            mean = (ranks[0][key][0][n] + ranks[1][key][0][n]) / 2
            for rank in ranks:
                assert torch.count_nonzero(rank[key][1][n]) == 0
                tol = 0 if key == "dense" else 1e-3
                torch.testing.assert_close(rank[key][2][n], mean, rtol=tol, atol=tol)


def test_a_checkpoint_holds_auto_and_powersgd_and_resumes_the_same_step():
    def job(comm):
        model = _model()
        opt, ctrl = _optimizer(comm, model, recheck_every=1000, epsilon=1e-6)
        gen = torch.Generator().manual_seed(comm.rank + 1)
        for key in ("powersgd:4", "sparse:10", "powersgd:1"):
            _forced_step(opt, ctrl, model, gen, key)
        state = opt.state_dict()
        params = {n: p.detach().clone() for n, p in model.named_parameters()}
        twin = _model()
        twin.load_state_dict(model.state_dict())
        opt2, ctrl2 = _optimizer(comm, twin, recheck_every=1000, epsilon=1e-6)
        opt2.load_state_dict(state)
        assert ctrl2.state_dict() == ctrl.state_dict()
        q = state["gravac"]["lowrank"]["q"]
        assert set(q) == set(opt.compressed_layer_names)
        assert all(v.shape[1] == 4 for v in q.values())   # the rank-4 warm start, kept
        results = []
        for o, c, m in ((opt, ctrl, model), (opt2, ctrl2, twin)):
            g = torch.Generator().manual_seed(100 + comm.rank)
            _forced_step(o, c, m, g, "powersgd:4")
            results.append([p.detach().clone() for p in m.parameters()])
        return results, params
    for (orig, resumed), _ in run_ranks(2, job):
        for a, b in zip(orig, resumed):
            assert torch.equal(a, b)


def test_overlap_gives_the_same_parameters_for_every_method():
    """With overlap, dense, fp16 and sparse steps leave from backward's hooks (several
    buckets) and PowerSGD's runs in synchronize: bit for bit what the step sends without
    overlap, through every switch."""
    keys = ("dense", "sparse:10", "powersgd:4", "fp16", "sparse:20", "powersgd:1", "dense")

    def job(comm, overlap):
        model = _model()
        ctrl = Auto(recheck_every=1000, epsilon=1e-6)
        extra = {"overlap": True, "bucket_cap_mb": 0.005} if overlap else {}
        opt = wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                             model.named_parameters(), comm, compressor="topk",
                             controller=ctrl, min_compress_numel=256, **extra)
        gen = torch.Generator().manual_seed(comm.rank + 1)
        for key in keys:
            ctrl._switch(key, "run")
            opt.zero_grad()
            _backward(model, gen)
            state = opt._engine._state            # what backward's hooks started
            started = state is not None and bool(state.pendings)
            assert started == (overlap and not key.startswith("powersgd"))
            opt.step()
            assert opt.last_stats.method == key
        return (len(opt.buckets or [None]), [p.detach().clone() for p in model.parameters()])
    plain = run_ranks(2, lambda comm: job(comm, False))
    overlapped = run_ranks(2, lambda comm: job(comm, True))
    assert overlapped[0][0] == 2                 # two buckets left from the hooks
    for (_, a), (_, b) in zip(plain, overlapped):
        for x, y in zip(a, b):
            assert torch.equal(x, y)


def test_a_low_rank_compressor_is_refused_in_one_line():
    def job(comm):
        model = _model()
        with pytest.raises(ValueError, match=r"^compressor='powersgd': controller Auto"):
            wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                           comm, compressor="powersgd", controller=Auto())
        # Without sparse methods PowerSGD is fine as the configured compressor.
        wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                       comm, compressor="powersgd",
                       controller=Auto(methods=["dense", "powersgd:2"]))
        return True
    assert all(run_ranks(1, job))


@pytest.mark.parametrize("exchange", ["ring", "lowrank"])
def test_a_method_naming_an_unknown_exchange_is_refused_in_one_line(exchange):
    """Refused when the optimizer is built, not at the method's first step."""
    def job(comm):
        model = _model()
        with pytest.raises(ValueError, match=rf"^auto.methods='sparse:10@{exchange}': names "
                                             rf"exchange '{exchange}': write sparse:<cf>@"):
            wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                           comm, compressor="topk",
                           controller=Auto(methods=["dense", f"sparse:10@{exchange}"]))
        return True
    assert all(run_ranks(1, job))


def test_the_step_record_names_the_method():
    assert Method.parse("sparse:40").key == "sparse:40"
    from gravac.engine.run_record import KINDS, METHOD, STEP, STEP_FIELDS
    assert "method" in STEP_FIELDS and KINDS[STEP].fields["method"] == "text"
    assert {"event", "method", "reason", "scores"} <= set(KINDS[METHOD].fields)


@pytest.mark.parametrize("key", ["fp16", "powersgd:4", "sparse:10"])
def test_a_skipped_steps_record_names_its_method(key):
    """A NaN on one rank skips the step on both; its record still names the method that
    ran, so the report's exploration cost counts the step under that method."""
    def job(comm):
        model = _model()
        opt, ctrl = _optimizer(comm, model)
        ctrl._switch(key, "run")
        opt.zero_grad()
        _backward(model, torch.Generator().manual_seed(1))
        if comm.rank == 1:
            next(model.parameters()).grad[0, 0] = float("nan")
        opt.step()
        return opt.last_stats.sent, opt.last_stats.method
    assert run_ranks(2, job) == [("skipped", key)] * 2


def test_per_layer_gains_are_the_ranks_sums_and_a_split_sends_its_layers_dense():
    """With split_layers a Top-k step agrees its gains per layer: each layer's row is the
    sum over ranks of its kept energy and g_ef's (independent Top-k here), and the whole
    gains are their ratio. A split method sends its dense layers as the exact average of
    g_ef (no residual left), compresses the others, and its step record names it."""
    def job(comm, overlap):
        model = _model()
        ctrl = Auto(recheck_every=1000, epsilon=1e-6, split_layers=True)
        extra = {"overlap": True, "bucket_cap_mb": 0.005} if overlap else {}
        opt = wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                             model.named_parameters(), comm, compressor="topk",
                             controller=ctrl, min_compress_numel=256, **extra)
        seen = []
        observe = ctrl.observe_layer_gains
        ctrl.observe_layer_gains = lambda rows: (seen.append(dict(rows)), observe(rows))
        gen = torch.Generator().manual_seed(comm.rank + 1)
        before, _, _ = _forced_step(opt, ctrl, model, gen, "sparse:10")
        whole = (opt.last_stats.gain_min, opt.last_stats.gain_c)
        names = opt.compressed_layer_names
        ctrl._s["splits"]["sparse:10/split"] = [names[0]]
        split = _forced_step(opt, ctrl, model, gen, "sparse:10/split")
        return before, seen, whole, split, opt.last_stats.layer_cf, names
    for overlap in (False, True):
        ranks = run_ranks(2, lambda comm: job(comm, overlap))
        before = [r[0] for r in ranks]
        seen, whole, _, layer_cf, names = ranks[0][1:]
        assert len(seen) == 1 and seen == ranks[1][1]     # the split step asks for none
        rows = seen[0]
        assert set(rows) == set(names)           # (with overlap: in the buckets' order)
        for n in names:
            g = [b[n] for b in before]
            kept = sum(float(x[x.abs().topk(-(-x.numel() // 10)).indices].square().sum())
                       for x in g)
            ef = sum(float(x.square().sum()) for x in g)
            assert rows[n][0] == pytest.approx(kept, rel=1e-6)      # float32 norms
            assert rows[n][2] == pytest.approx(ef, rel=1e-6)
        assert whole[0] == pytest.approx(sum(r[0] for r in rows.values())
                                         / sum(r[2] for r in rows.values()), rel=1e-12)
        assert layer_cf == {names[0]: 1.0}
        split_before = [r[3][0] for r in ranks]
        for rank in ranks:
            _, after, synced = rank[3]
            dense = names[0]
            mean = (split_before[0][dense] + split_before[1][dense]) / 2
            assert torch.count_nonzero(after[dense]) == 0
            torch.testing.assert_close(synced[dense], mean, rtol=0, atol=1e-7)
            assert torch.count_nonzero(after[names[1]]) > 0        # compressed: residual


def test_a_step_whose_level_is_known_starts_its_exchange_before_the_gains():
    """A trial's level is known before the step (it sends its method), and so is a run's
    under decide="previous": the exchange (PowerSGD's Q round) is issued before the
    gains' allreduce. Under decide="current" a run's Q round waits for the gains. Where
    the smoothed gain never falls below ε both rules send the same: the parameters are
    the same bit for bit."""
    def job(comm, decide):
        issued = []
        collective = comm._collective

        def record(kind, name, value, combine):
            issued.append(name)
            return collective(kind, name, value, combine)
        comm._collective = record
        model = _model()
        opt, ctrl = _optimizer(comm, model, methods=["dense", "powersgd:4"],
                               epsilon=1e-6, recheck_every=1000, decide=decide)
        gen = torch.Generator().manual_seed(comm.rank + 1)
        order = []
        for step in range(14):
            if step == 9:                # after the trials: a run of PowerSGD, whatever won
                assert "powersgd:4" in ctrl.table
                ctrl._switch("powersgd:4", "run")
            phase = ctrl._s["phase"]
            issued.clear()
            opt.zero_grad()
            _backward(model, gen)
            opt.step()
            if opt.last_stats.method == "powersgd:4":
                q = next(i for i, n in enumerate(issued) if ".lowrank.q" in n)
                gains = next(i for i, n in enumerate(issued) if n.endswith(".gains"))
                order.append((phase, "exchange first" if q < gains else "gains first"))
        return order, [p.detach().clone() for p in model.parameters()]
    runs = {rule: run_ranks(2, lambda comm, rule=rule: job(comm, rule))
            for rule in ("current", "previous")}
    for rule, run_first in (("current", "gains first"), ("previous", "exchange first")):
        order = runs[rule][0][0]
        assert {o for phase, o in order if phase == "trial"} == {"exchange first"}
        assert {o for phase, o in order if phase == "run"} == {run_first}
    for a, b in zip(runs["current"][0][1], runs["previous"][0][1]):
        assert torch.equal(a, b)


def test_the_lag_is_the_residuals_projection_on_the_gradient_summed_over_ranks():
    """Under ``low_rank_lag`` a PowerSGD step records lag = Σ⟨r, g⟩ / Σ‖g‖² over the
    compressed layers and both ranks (r: the residual before the step, g: the raw
    gradient), the same on every rank, and hands it to the controller; a sparse step
    does not measure it."""
    def job(comm):
        model = _model()
        opt, ctrl = _optimizer(comm, model, recheck_every=1000, epsilon=1e-6,
                               low_rank_lag=0.5)
        seen = []
        ctrl.observe_lag = seen.append
        gen = torch.Generator().manual_seed(comm.rank + 1)
        params = dict(model.named_parameters())
        out = []
        for key in ("powersgd:4", "powersgd:4", "sparse:10", "powersgd:4"):
            ctrl._switch(key, "run")
            opt.zero_grad()
            _backward(model, gen)
            names = opt.compressed_layer_names
            dot = sum(float(torch.dot(_residual(opt, n, params[n]).double(),
                                      params[n].grad.view(-1).double())) for n in names)
            g_sq = sum(float(params[n].grad.double().square().sum()) for n in names)
            opt.step()
            out.append((key, dot, g_sq, opt.last_stats.lag))
        return out, seen
    (r0, seen0), (r1, seen1) = run_ranks(2, job)
    lags = []
    for (key, dot0, sq0, lag0), (_, dot1, sq1, lag1) in zip(r0, r1):
        assert lag0 == lag1
        if key.startswith("sparse"):
            assert lag0 is None
            continue
        assert lag0 == pytest.approx((dot0 + dot1) / (sq0 + sq1), rel=1e-5)   # (float32)
        lags.append(lag0)
    assert lags[0] == 0.0                      # no residual yet
    assert lags[1] != 0.0 and lags[2] != 0.0   # rank 4 of a 96 x 40 layer leaves one
    assert seen0 == seen1 == lags


def test_a_plan_asking_for_the_lag_without_gains_is_refused_in_one_line():
    from dataclasses import replace

    from gravac.controllers import Static

    class _LagOnly(Static):
        def plan(self, step):
            return replace(super().plan(step), measure_lag=True)

    from gravac.comm import LocalComm

    model = _model()
    opt = wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.05), model.named_parameters(),
                         LocalComm(), compressor="topk", controller=_LagOnly(cf=10),
                         min_compress_numel=256)
    _backward(model, torch.Generator().manual_seed(1))
    with pytest.raises(RuntimeError, match="measure_lag needs needs_gains"):
        opt.step()
