"""The step engine on a GPU (issue "The CUDA path on a real GPU").

Differential tests (skipped without CUDA): the same small model (an embedding with sparse
gradients, Linear layers, dense biases), the same fp32 gradients set by hand, gravac's
optimizer over ``LocalComm`` on the CPU and on CUDA, a few steps, for every kind of step
(dense, Top-k, GraVAC's two levels and gains, DGC, Random-k with a shared seed, PowerSGD,
Accordion, the shared-index and hierarchical exchanges, overlap): the CUDA parameters and
residuals equal the CPU ones (residuals exactly where the math is exact: the data has no
tied magnitudes), every residual and state tensor lives on the GPU, NaN/Inf steps are
skipped alike, a state dict saved on the GPU resumes on the CPU (map_location="cpu") and
on the GPU, and a step's host syncs do not grow with the number of layers. The model, the
variants and the comparisons are tests/cuda_variants.py's, shared with the two-rank suite
(tests/parallel/test_cuda_two_ranks.py).

Tests of the device helpers run everywhere (CPU tensors, the meta device, dtypes, the
device-flag path of the NaN/Inf agreement forced on CPU tensors over 4 thread ranks).
"""
from __future__ import annotations

import copy
import io
import time
import warnings

import pytest
import torch

from gravac.comm.local import LocalComm
from gravac.engine import step as step_module
from gravac.engine.codec import SparseCodec, SparseLayer
from gravac.engine.optimizer import _to_cpu, wrap_optimizer
from gravac.engine.phases import PhaseClock
from gravac.engine.selection import has_nonfinite, nonfinite_flag
from gravac.memory import ResidualMemory, follow_devices

from cuda_sync import is_sync_warning
from cuda_variants import (LOWRANK, REPLAYED, VARIANTS, VOCAB, Net, assert_match, build,
                           full_fp32_matmuls, replay, residuals, same_stats, set_grads, step_grads)
from thread_comm import run_ranks

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(
    not CUDA, reason="needs a CUDA GPU: compares gravac's step on CUDA with the same step on "
                     "the CPU (torch.cuda.is_available() is False here)")


def _build(device, variant: str, hidden: int = 2, model=None, **overrides):
    return build(device, variant, LocalComm(), hidden, model, **overrides)


def _step(model, opt, step: int, bad=None):
    set_grads(model, step_grads(model, step, bad))
    opt.step()
    return opt.last_stats


@pytest.fixture
def ieee_fp32():
    """fp32 matmuls in full precision (no TF32) while a test compares with the CPU."""
    with full_fp32_matmuls():
        yield


# -- CPU versus CUDA ----------------------------------------------------------------------
@needs_cuda
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_cuda_step_equals_the_cpu_step(variant, ieee_fp32):
    cpu, gpu = _build("cpu", variant), _build("cuda", variant)
    picks = replay(gpu[1], cpu[1]) if variant in REPLAYED else []
    for step in range(4):
        b = _step(*gpu, step)
        a = _step(*cpu, step)
        same_stats(a, b, f"{variant} step {step}")
        assert b.t_compress is not None and b.t_compress >= 0 and b.t_comm >= 0
    assert picks == [], f"{variant}: the GPU step selected more often than the CPU step"
    assert_match(cpu, gpu, exact=variant not in LOWRANK, what=variant)


@needs_cuda
@pytest.mark.parametrize("variant", ["topk", "gravac", "shared_index", "overlap"])
def test_cuda_step_with_many_layers_equals_the_cpu_step(variant, ieee_fp32):
    """Enough compressed layers for the GPU's batched paths (``FLAT_UPDATE_MIN_LAYERS``:
    the residuals of all layers updated by one launch over their flat buffer; and a NaN
    step rolled back through it): the same residuals as the CPU's layer-by-layer ones."""
    from gravac.memory import FLAT_UPDATE_MIN_LAYERS
    hidden = FLAT_UPDATE_MIN_LAYERS + 2
    cpu, gpu = _build("cpu", variant, hidden), _build("cuda", variant, hidden)
    for step in range(5):
        bad = ("hidden.3.weight", float("nan")) if step == 2 else None
        b = _step(*gpu, step, bad)
        a = _step(*cpu, step, bad)
        same_stats(a, b, f"{variant} step {step}")
    assert_match(cpu, gpu, exact=True, what=f"{variant}, {hidden} hidden layers")


@needs_cuda
@pytest.mark.parametrize("variant, where, value", [
    ("topk", "head.bias", float("nan")),           # flags ride in the dense group
    ("topk", "hidden.0.weight", float("inf")),
    ("gravac", "hidden.1.weight", float("nan")),   # flags ride in the gains allreduce
    ("gravac_previous", "head.weight", float("-inf")),
    ("accordion", "hidden.0.weight", float("nan")),  # a round of their own
    ("powersgd", "hidden.0.weight", float("nan")),
    ("shared_index", "hidden.0.bias", float("nan")),
    ("overlap", "hidden.0.weight", float("nan")),    # or-ed over buckets on the device
    ("overlap_gravac", "head.bias", float("inf")),
])
def test_cuda_nonfinite_step_is_skipped_like_on_the_cpu(variant, where, value, ieee_fp32):
    cpu, gpu = _build("cpu", variant), _build("cuda", variant)
    for step in range(3):
        bad = (where, value) if step == 1 else None
        a, b = _step(*cpu, step, bad), _step(*gpu, step, bad)
        same_stats(a, b, f"{variant} step {step}")
        assert b.skipped == (step == 1) and b.nonfinite_ranks == ([0] if step == 1 else [])
    assert_match(cpu, gpu, exact=variant not in LOWRANK, what=variant)


@needs_cuda
@pytest.mark.parametrize("variant", ["gravac", "powersgd", "accordion", "overlap"])
def test_cuda_state_dict_resumes_on_cpu_and_on_cuda(variant, ieee_fp32):
    """Saved on the GPU after 3 steps (Accordion: mid-interval, with its accumulators),
    read back with map_location="cpu" into a CPU optimizer and as saved into a CUDA one:
    every tensor where its parameter is, and one more step gives the same result."""
    model, opt = _build("cuda", variant)
    for step in range(3):
        _step(model, opt, step)
    saved = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, saved)
    resumed = {}
    for label, device, map_location in (("cpu", "cpu", "cpu"), ("gpu", "cuda", None)):
        saved.seek(0)
        state = torch.load(saved, map_location=map_location, weights_only=False)
        m, o = _build(device, variant)
        m.load_state_dict(state["model"])
        o.load_state_dict(state["opt"])
        assert o.step_count == 3
        for name, res in residuals(o).items():
            assert res.device.type == device, f"residual {name} on {res.device}"
        for name, q in o.compressor.state_dict().get("q", {}).items():
            assert q.device.type == device, f"Q of {name} on {q.device}"
        acc = o.controller.state_dict().get("accumulators", {})
        if variant == "accordion":
            assert acc, "saved mid-interval: the accumulators must be in the state"
        for name, t in acc.items():
            assert t.device.type == device, f"accumulator {name} on {t.device}"
        for p in m.parameters():
            for t in o.state[p].values():
                if isinstance(t, torch.Tensor) and t.dim():
                    assert t.device.type == device
        resumed[label] = (m, o)
    stats = {key: _step(*pair, 3) for key, pair in
             (("orig", (model, opt)), ("cpu", resumed["cpu"]), ("gpu", resumed["gpu"]))}
    same_stats(stats["orig"], stats["gpu"], f"{variant} resumed on cuda")
    same_stats(stats["orig"], stats["cpu"], f"{variant} resumed on cpu")
    exact = variant not in LOWRANK
    assert_match(resumed["cpu"], (model, opt), exact=exact, what=f"{variant} (cpu resume)")
    assert_match(resumed["cpu"], resumed["gpu"], exact=exact, what=f"{variant} (cuda resume)")
    _assert_match_cuda((model, opt), resumed["gpu"], exact=exact)


@needs_cuda
@pytest.mark.parametrize("variant", ["overlap", "overlap_gravac"])
def test_cuda_overlap_hooks_match_the_plain_cuda_step(variant, ieee_fp32):
    """A real backward on the GPU: overlap's buckets leave from backward's hooks (several
    buckets, the NaN/Inf flag or-ed on the device). The plain step on the same GPU, given
    the gradients backward produced (captured by hooks that run before gravac's), ends
    with the same residuals and parameters."""
    torch.manual_seed(0)
    model = Net().cuda()
    captured = {}
    for name, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(
            lambda p, n=name: captured.__setitem__(n, p.grad.detach().clone()))
    model, opt = _build("cuda", variant, model=model)
    plain = _build("cuda", "topk" if variant == "overlap" else "gravac_previous")
    assert len(opt.buckets) > 1
    g = torch.Generator().manual_seed(7)
    for step in range(3):
        tokens = torch.randint(0, VOCAB, (8, 5), generator=g).cuda()
        target = torch.randn(8, 10, generator=g).cuda()
        opt.zero_grad()
        captured.clear()
        torch.nn.functional.mse_loss(model(tokens), target).backward()
        assert sorted(captured) == sorted(n for n, _ in model.named_parameters())
        opt.step()
        set_grads(plain[0], captured)
        plain[1].step()
        same_stats(plain[1].last_stats, opt.last_stats, f"{variant} step {step}",
                    same_buffers=False)
        assert not opt.last_stats.skipped
    _assert_match_cuda(plain, (model, opt))
    stats = opt.last_stats
    assert stats.t_compute is not None and stats.t_compute >= 0 and stats.t_compress >= 0


def _assert_match_cuda(a, b, exact: bool = True) -> None:
    """Two runs on the GPU: the same residuals (bitwise when ``exact``: the same kernels
    on the same data) and parameters."""
    for (name, x), (_, y) in zip(a[0].named_parameters(), b[0].named_parameters()):
        torch.testing.assert_close(y, x, rtol=1e-6, atol=1e-7, msg=lambda m, n=name: f"{n}: {m}")
    res_a, res_b = residuals(a[1]), residuals(b[1])
    assert sorted(res_a) == sorted(res_b)
    for name, res in res_b.items():
        assert res.is_cuda
        if exact:
            assert torch.equal(res, res_a[name]), name
        else:
            torch.testing.assert_close(res, res_a[name], rtol=1e-5, atol=1e-6)


@needs_cuda
def test_cuda_exact_phases_time_after_the_device_finished():
    """exact_phases: every phase boundary waits for the device; the phases are then
    consecutive slices of the step and add up to at most its wall time."""
    model, opt = _build("cuda", "gravac")
    opt._engine.exact_phases = True
    for step in range(3):
        stats = _step(model, opt, step)
        local = sum(getattr(stats, p) for p in ("t_control", "t_check", "t_feedback",
                                                "t_select", "t_norms", "t_residual",
                                                "t_pack", "t_unpack"))
        assert abs(local - stats.t_compress) < 1e-9
        if step:
            assert 0 < stats.t_compute + stats.t_compress + stats.t_comm + stats.t_update \
                <= stats.t_iter


def _sync_sites(variant: str, hidden: int, steps: int = 3) -> list[list[str]]:
    """Per step after the first (which allocates and draws PowerSGD's Q), where the
    step synchronised the host with the GPU (``torch.cuda.set_sync_debug_mode``).
    Overlap: one bucket (the default cap), whatever the layers: each bucket's sparse
    headers are one read."""
    overrides = {"bucket_cap_mb": 25.0} if variant.startswith("overlap") else {}
    model, opt = _build("cuda", variant, hidden, **overrides)
    _step(model, opt, 0)
    per_step = []
    for step in range(1, steps):
        set_grads(model, step_grads(model, step))
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                opt.step()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        per_step.append(sorted(f"{w.filename.rsplit('gravac/', 1)[-1]}:{w.lineno}"
                               for w in caught if is_sync_warning(w)))
    return per_step


@needs_cuda
@pytest.mark.parametrize("variant", ["dense", "topk", "gravac", "gravac_previous",
                                     "shared_index", "hierarchical", "powersgd",
                                     "powersgd_gravac", "overlap", "overlap_gravac"])
def test_cuda_host_syncs_per_step_do_not_grow_with_the_layers(variant):
    """Per step, the engine syncs the host a fixed number of times (the gains and flags,
    the headers, the timing boundaries), whatever the number of layers: 2 hidden layers
    and 8 give the same count. (Top-k on layers this small runs torch.topk: no sync.
    Not here: DGC and Random-k, whose selection syncs per layer in the compressor, and
    Accordion, whose interval end reads one norm per layer.)"""
    few, many = _sync_sites(variant, 2), _sync_sites(variant, 8)
    print(f"{variant}: host syncs per step, 2 hidden layers: {few}; 8: {many}")
    assert [len(s) for s in few] == [len(s) for s in many], \
        f"{variant}: syncs grow with the layers:\n  2 layers: {few}\n  8 layers: {many}"


# -- device helpers (run everywhere) --------------------------------------------------------
def test_follow_devices_moves_the_tensors_under_layer_names_only():
    like = {"fc.weight": torch.empty(2, device="meta"), "fc.bias": torch.zeros(1)}
    state = {"seed": 3, "q": {"fc.weight": torch.ones(2, 2, dtype=torch.float64),
                              "other": torch.ones(1)},
             "accumulators": {"fc.weight": [torch.ones(1), (torch.ones(1), 2)]},
             "table": {10.0: 1.5}, "fc.bias": torch.ones(3, dtype=torch.float16)}
    out = follow_devices(state, like)
    assert out["q"]["fc.weight"].device.type == "meta"
    assert out["q"]["fc.weight"].dtype == torch.float64          # dtypes are kept
    assert out["q"]["other"].device.type == "cpu"
    first, (second, two) = out["accumulators"]["fc.weight"]
    assert first.device.type == "meta" and second.device.type == "meta" and two == 2
    assert out["table"] == {10.0: 1.5} and out["seed"] == 3
    assert out["fc.bias"].device.type == "cpu" and out["fc.bias"].dtype == torch.float16
    # the input is not changed
    assert state["q"]["fc.weight"].device.type == "cpu"
    assert follow_devices({}, like) == {}


def test_memory_loads_residuals_onto_their_parameters_device_and_dtype():
    memory = ResidualMemory()
    state = {"residuals": {"a": torch.arange(6.0).view(2, 3), "b": torch.ones(4),
                           "c": torch.ones(2, dtype=torch.float64)}}
    like = {"a": torch.empty(2, 3, device="meta"), "b": torch.zeros(4, dtype=torch.float16),
            "c": torch.zeros(2, dtype=torch.float64)}
    memory.load_state_dict(state, like=like)
    assert memory["a"].device.type == "meta" and memory["a"].shape == (2, 3)
    assert memory["b"].dtype == torch.float32          # fp16 parameters: fp32 residuals
    assert memory["c"].dtype == torch.float64
    # a copy: the state dict's tensors are not shared
    assert memory["b"].data_ptr() != state["residuals"]["b"].data_ptr()
    state["residuals"]["c"].zero_()
    assert torch.equal(memory["c"], torch.ones(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="shape"):
        memory.load_state_dict({"residuals": {"a": torch.ones(5)}}, like=like)


def test_memory_residual_follows_its_gradient_to_another_device():
    memory = ResidualMemory()
    memory.load_state_dict({"residuals": {"w": torch.ones(4)}})     # no like: stays on CPU
    grad = torch.zeros(4, device="meta")
    g_ef = memory.compensate("w", grad)
    assert g_ef.device.type == "meta" and memory["w"].device.type == "meta"
    memory.update("w", g_ef, None)
    assert memory["w"].device.type == "meta"


def test_engine_state_loads_onto_the_parameters_device():
    """The residuals, PowerSGD's Q and Accordion's accumulators of a CPU state land on
    the device of the parameters they belong to (the meta device stands for a GPU)."""
    states = {}
    for variant in ("powersgd", "accordion"):
        model, opt = _build("cpu", variant)
        for step in range(3):
            _step(model, opt, step)
        states[variant] = copy.deepcopy(opt.state_dict())
        model, opt = _build("meta", variant)
        opt._engine.load_state_dict(states[variant]["gravac"])
        for name, res in residuals(opt).items():
            assert res.device.type == "meta", name
        for name, q in opt.compressor.state_dict().get("q", {}).items():
            assert q.device.type == "meta", name
        for name, t in opt.controller.state_dict().get("accumulators", {}).items():
            assert t.device.type == "meta", name
        assert opt._engine._cuda_devices == []
    assert states["powersgd"]["gravac"]["compressor"]["q"]
    assert states["accordion"]["gravac"]["controller"]["accumulators"]


def test_to_cpu_keeps_structure_and_dtypes():
    state = {"state": {0: {"momentum_buffer": torch.ones(2, dtype=torch.float16),
                           "step": torch.tensor(3.0)}},
             "param_groups": [{"lr": 0.1, "params": [0]}], "pair": (torch.ones(1), "x")}
    out = _to_cpu(state)
    assert out["state"][0]["momentum_buffer"].dtype == torch.float16
    assert out["param_groups"] == [{"lr": 0.1, "params": [0]}]
    assert isinstance(out["pair"], tuple) and out["pair"][1] == "x"


def test_nonfinite_flag_on_cpu_is_has_nonfinite():
    for grads in ([], [torch.ones(3)], [torch.ones(3), torch.tensor([1.0, float("nan")])],
                  [torch.full((4,), 3e38), torch.full((4,), 3e38)]):
        flag = nonfinite_flag(grads)
        assert isinstance(flag, bool) and flag == has_nonfinite(grads)


def _device_flag(grads):
    """What ``nonfinite_flag`` gives on a GPU (a 0-dim bool tensor), made on the CPU."""
    return torch.tensor(has_nonfinite(grads))


def test_flags_from_a_device_flag_equal_the_flags_from_a_bool():
    model, opt = _build("cpu", "topk")
    engine = opt._engine
    for bad in (False, True):
        expected = engine.flags(bad)
        assert torch.equal(engine.flags(torch.tensor(bad)), expected)
        assert torch.equal(engine.flags(bad, device="cpu"), expected)
        assert engine.flags(torch.tensor(bad)).dtype == torch.float64
    rows = [torch.tensor([1.0, 0.5, 2.0]), torch.tensor([3.0, 1.0, 4.0])]
    assert engine.agree_gain_rows(rows, local_bad=torch.tensor(False)) == \
        engine.agree_gain_rows(rows, local_bad=False)
    assert engine.agree_gain_rows(rows, local_bad=torch.tensor(True))[2] == [0]
    assert engine.agree_gain_rows([], local_bad=torch.tensor(True))[2] == [0]


N = 4
#: (variant, parameter with the NaN, rank): each way the flags travel.
FLAG_CASES = [("topk", "head.bias", 2),              # in the exchange's dense group
              ("gravac", "hidden.0.weight", 1),      # in the gains allreduce
              ("gravac_previous", "head.weight", 3),
              ("accordion", "hidden.1.weight", 0),   # a round of their own
              ("powersgd", "hidden.0.weight", 2),
              ("shared_index", "hidden.0.bias", 1),  # beside the exchange
              ("overlap", "hidden.0.weight", 3),     # or-ed over the buckets
              ("overlap_gravac", "head.bias", 2)]


def _thread_run(variant: str, bad_at: tuple[str, int]) -> list:
    """4 thread ranks, 3 steps, a NaN on one rank at step 1: per rank, the stats and the
    parameters and residuals after each step."""
    torch.manual_seed(0)
    base = Net()

    def body(comm):
        model = copy.deepcopy(base)
        opt = wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                             model.named_parameters(), comm, **VARIANTS[variant]())
        out = []
        for step in range(3):
            grads = step_grads(model, 10 * step + comm.rank)
            if step == 1 and comm.rank == bad_at[1]:
                grads[bad_at[0]].view(-1)[3] = float("nan")
            set_grads(model, grads)
            opt.step()
            out.append((opt.last_stats.sent, opt.last_stats.nonfinite_ranks,
                        [p.detach().clone() for p in model.parameters()],
                        {n: r.clone() for n, r in residuals(opt).items()}))
        return out
    return run_ranks(N, body)


@pytest.mark.parametrize("variant, where, rank", FLAG_CASES)
def test_device_flags_agree_like_bool_flags_over_ranks(variant, where, rank, monkeypatch):
    """The NaN/Inf flag as a GPU gives it (a 0-dim tensor, never read on the host before
    it travels), forced on CPU tensors: over 4 ranks, the same skip, the same flagged
    rank, the same parameters and residuals as with the bool flag."""
    expected = _thread_run(variant, (where, rank))
    monkeypatch.setattr(step_module, "nonfinite_flag", _device_flag)
    got = _thread_run(variant, (where, rank))
    for r in range(N):
        assert [s[0] for s in got[r]][1] == "skipped" and got[r][1][1] == [rank]
        for (sent_a, bad_a, params_a, res_a), (sent_b, bad_b, params_b, res_b) in \
                zip(expected[r], got[r]):
            assert (sent_a, bad_a) == (sent_b, bad_b)
            assert all(torch.equal(a, b) for a, b in zip(params_a, params_b))
            assert res_a.keys() == res_b.keys()
            assert all(torch.equal(res_a[n], res_b[n]) for n in res_a)


def test_equal_chunks_are_parsed_from_one_read_of_their_headers(monkeypatch):
    layers = [SparseLayer("a", 100, torch.float32), SparseLayer("b", 50, torch.float32)]
    codec = SparseCodec(layers)
    g = torch.Generator().manual_seed(0)
    buffers = []
    for _ in range(3):
        picks = [torch.randperm(100, generator=g)[:7], torch.randperm(50, generator=g)[:4]]
        buffer, ctx = codec.pack([(torch.randn(len(i), generator=g), i) for i in picks])
        buffers.append(buffer)
    gathered = torch.cat(buffers)
    reads = []
    original = torch.Tensor.cpu

    def counting(self, *args, **kwargs):
        reads.append(tuple(self.shape))
        return original(self, *args, **kwargs)
    monkeypatch.setattr(torch.Tensor, "cpu", counting)
    one_by_one = codec.aggregate(gathered, ctx, world_size=3)
    assert len(reads) == 3
    reads.clear()
    at_once = codec.aggregate(gathered, ctx, world_size=3, same_size=True)
    assert len(reads) == 1
    assert torch.equal(one_by_one, at_once)
    # a wrong promise (chunks of different sizes) falls back to parsing one by one
    short, ctx = codec.pack([(torch.ones(1), torch.tensor([5])), (torch.ones(2),
                                                                    torch.tensor([1, 2]))])
    uneven = torch.cat([buffers[0], short])
    torch.testing.assert_close(codec.aggregate(uneven, ctx, world_size=2, same_size=True),
                               codec.aggregate(uneven, ctx, world_size=2))


def test_phase_clock_without_exact_phases_starts_on_the_host_clock():
    calls = []

    def synced():
        calls.append(1)
        return time.perf_counter()
    clock = PhaseClock(synced, exact=False)
    assert calls == []                                # no device sync to start
    clock.lap("t_control")
    assert calls == []
    end = clock.lap("t_wait_gains", sync=True)
    assert calls == [1] and clock.charged() == pytest.approx(end - clock.start)
    PhaseClock(synced)
    assert len(calls) == 2                            # exact: the synced clock starts it


def test_engine_on_cpu_waits_for_no_device():
    model, opt = _build("cpu", "gravac")
    assert opt._engine._cuda_devices == [] and not opt._engine._cuda
    assert opt._engine.device == torch.device("cpu")
