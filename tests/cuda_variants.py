"""The CUDA step's test cases, shared by the one-process suite (tests/unit/
test_cuda_engine.py, over ``LocalComm``) and the two-rank one (tests/parallel/
test_cuda_two_ranks.py, over torch.distributed): one model, one table of variants, one
way to make gradients, one comparison of a CUDA run with the CPU run, so that both suites
test the same steps with the same tolerances.

Example::

    cpu, gpu = build("cpu", "topk", comm), build("cuda", "topk", comm)
    for step in range(4):
        for model, opt in (gpu, cpu):
            set_grads(model, step_grads(model, step))
            opt.step()
    assert_match(cpu, gpu, exact="topk" not in LOWRANK, what="topk")
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from gravac.controllers import Accordion, GraVAC, Static
from gravac.engine.optimizer import wrap_optimizer

VOCAB, WIDTH = 64, 48


class Net(torch.nn.Module):
    """An embedding (3072 entries, compressed; sparse gradients), ``hidden`` Linear 48x48
    (2304, compressed) and a head (480, dense, below min_compress_numel), with biases."""

    def __init__(self, hidden: int = 2):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, WIDTH)
        self.hidden = torch.nn.ModuleList(torch.nn.Linear(WIDTH, WIDTH) for _ in range(hidden))
        self.head = torch.nn.Linear(WIDTH, 10)

    def forward(self, tokens):
        x = self.emb(tokens).mean(1)
        for layer in self.hidden:
            x = torch.relu(layer(x))
        return self.head(x)


def _gravac(**kw):
    return GraVAC(theta_min=2, theta_max=8, epsilon=kw.pop("epsilon", 0.3), window=2, **kw)


#: name -> the optimizer's options (a fresh controller each time).
VARIANTS = {
    "dense": lambda: dict(compressor="none"),
    "topk": lambda: dict(controller=Static(cf=10)),
    "topk_fp16_wire": lambda: dict(controller=Static(cf=10), dense_wire="fp16"),
    "gravac": lambda: dict(controller=_gravac()),
    "gravac_previous": lambda: dict(controller=_gravac(decide="previous")),
    "gravac_norm": lambda: dict(controller=_gravac(gain_measure="norm")),
    "dgc": lambda: dict(compressor="dgc", controller=Static(cf=10)),
    "randomk": lambda: dict(compressor="randomk", controller=Static(cf=10)),
    "accordion": lambda: dict(controller=Accordion(low_cf=2, high_cf=8, switch_freq=1,
                                                   interval_steps=2)),
    "powersgd": lambda: dict(compressor="powersgd", controller=Static(cf=4)),
    "powersgd_gravac": lambda: dict(compressor="powersgd", controller=_gravac(epsilon=0.05)),
    "shared_index": lambda: dict(controller=Static(cf=10), exchange="shared_index"),
    "shared_index_gravac": lambda: dict(controller=_gravac(), exchange="shared_index"),
    "shared_index_randomk": lambda: dict(compressor="randomk", controller=Static(cf=10),
                                         exchange="shared_index"),
    "hierarchical": lambda: dict(controller=Static(cf=10), exchange="hierarchical"),
    "overlap": lambda: dict(controller=Static(cf=10), overlap=True, bucket_cap_mb=0.01),
    "overlap_gravac": lambda: dict(controller=_gravac(decide="previous"), overlap=True,
                                   bucket_cap_mb=0.01),
}
LOWRANK = ("powersgd", "powersgd_gravac")
#: Compressors that draw on the tensor's device (a CUDA generator draws other numbers than
#: a CPU one from the same seed): the CPU run replays the GPU's picks (``replay``).
REPLAYED = ("dgc", "randomk", "shared_index_randomk")


def build(device, variant: str, comm, hidden: int = 2, model=None, **overrides):
    """A model (seed 0, the same on every rank, unless ``model`` is given) on ``device``
    and gravac's optimizer (SGD with momentum, ``VARIANTS[variant]``) over ``comm``."""
    if model is None:
        torch.manual_seed(0)
        model = Net(hidden).to(device)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = wrap_optimizer(sgd, model.named_parameters(), comm,
                         **{**VARIANTS[variant](), **overrides})
    return model, opt


def step_grads(model, step: int, bad: tuple[str, float] | None = None,
               rows: int = 16) -> dict:
    """Gradients of ``step`` on the CPU, fp32, continuous random values (no ties); the
    embedding's sparse (``rows`` of 64 rows), as ``Embedding(sparse=True)`` makes them.
    Its other rows are zeros, tied: a level that keeps more entries than the rows hold
    picks among them as it likes (the GPU otherwise than the CPU)."""
    g = torch.Generator().manual_seed(100 + step)
    out = {}
    for name, p in model.named_parameters():
        if name == "emb.weight":
            picked = torch.randperm(VOCAB, generator=g)[:rows].sort().values
            values = torch.randn(rows, WIDTH, generator=g)
            out[name] = torch.sparse_coo_tensor(picked[None], values, (VOCAB, WIDTH),
                                                check_invariants=True).coalesce()
        else:
            out[name] = torch.randn(tuple(p.shape), generator=g)
    if bad is not None:
        out[bad[0]].view(-1)[3] = bad[1]
    return out


def set_grads(model, grads: dict) -> None:
    for name, p in model.named_parameters():
        p.grad = grads[name].to(p.device)


def residuals(opt) -> dict:
    return {name: opt.memory[name] for name in opt.memory.names()}


def assert_match(cpu, gpu, exact: bool, what: str) -> None:
    """CUDA results (``gpu``: model, optimizer) against the CPU's: residuals bitwise when
    ``exact`` (error feedback and sparse aggregation are exact), else to fp32 rounding
    (PowerSGD's matmuls sum in another order); parameters and momentum to fp32 rounding
    (the update may fuse a multiply-add on the GPU)."""
    (cpu_model, cpu_opt), (gpu_model, gpu_opt) = cpu, gpu
    res_tol = dict(rtol=0, atol=0) if exact else dict(rtol=1e-4, atol=1e-5)
    cpu_res, gpu_res = residuals(cpu_opt), residuals(gpu_opt)
    assert sorted(cpu_res) == sorted(gpu_res), what
    for name, res in gpu_res.items():
        assert res.is_cuda, f"{what}: residual {name} on {res.device}"
        torch.testing.assert_close(res.cpu(), cpu_res[name], **res_tol,
                                   msg=lambda m, n=name: f"{what}: residual {n}: {m}")
    tol = dict(rtol=1e-6, atol=1e-6) if exact else dict(rtol=1e-4, atol=1e-5)
    for (name, a), (_, b) in zip(cpu_model.named_parameters(), gpu_model.named_parameters()):
        assert b.is_cuda and b.grad.is_cuda, f"{what}: {name}"
        torch.testing.assert_close(b.detach().cpu(), a.detach(), **tol,
                                   msg=lambda m, n=name: f"{what}: parameter {n}: {m}")
        buf_a = cpu_opt.state[a].get("momentum_buffer")
        buf_b = gpu_opt.state[b].get("momentum_buffer")
        assert (buf_a is None) == (buf_b is None), f"{what}: {name}"
        if buf_b is not None:
            assert buf_b.is_cuda
            # A sparse gradient's momentum is sparse: compared by value, since CUDA's and
            # the CPU's sparse adds keep different (uncoalesced) entry lists for it.
            torch.testing.assert_close(_dense(buf_b.cpu()), _dense(buf_a), **tol)
    for name, q in gpu_opt.compressor.state_dict().get("q", {}).items():
        assert q.is_cuda, f"{what}: PowerSGD Q of {name} on {q.device}"
    for name, acc in gpu_opt.controller.state_dict().get("accumulators", {}).items():
        assert acc.is_cuda, f"{what}: Accordion's accumulator of {name} on {acc.device}"
    for name, spare in gpu_opt.memory._spares.items():
        assert spare.is_cuda, f"{what}: the spare residual buffer of {name} on {spare.device}"


def _dense(t: torch.Tensor) -> torch.Tensor:
    return t.to_dense() if t.is_sparse else t


def same_stats(a, b, what: str, same_buffers: bool = True) -> None:
    """The same step record (gains to fp32 rounding); ``same_buffers``: the same wire
    buffers too (not so with overlap's buckets against the plain step: a header each)."""
    assert (a.sent, a.cf, a.theta_min, a.theta_c, a.sparse_layers, a.values_sent,
            a.floats_sent, a.nonfinite_ranks) == \
        (b.sent, b.cf, b.theta_min, b.theta_c, b.sparse_layers, b.values_sent,
         b.floats_sent, b.nonfinite_ranks), what
    if same_buffers:
        assert a.bytes_sent == b.bytes_sent, what
    for gain in ("gain_min", "gain_c"):
        x, y = getattr(a, gain), getattr(b, gain)
        assert (x is None) == (y is None), what
        if x is not None:
            assert abs(x - y) <= 1e-5 * max(1.0, abs(x)), f"{what}: {gain} {x} vs {y}"


@contextmanager
def full_fp32_matmuls():
    """fp32 matmuls in full precision (no TF32) while a test compares with the CPU."""
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


def replay(gpu_opt, cpu_opt) -> list:
    """The CPU optimizer's compressor returns the indices the GPU's picked, call by call
    (the GPU's step must run first): the engines are compared on the same selections.
    Returns the queue of picks not yet replayed."""
    picks = []
    gpu_select = gpu_opt.compressor.select

    def recording(x, k, ctx=None):
        idx = gpu_select(x, k, ctx)
        picks.append(idx.cpu())
        return idx

    def replaying(x, k, ctx=None):
        assert picks, "the CPU step selected more often than the GPU step"
        idx = picks.pop(0)
        assert idx.numel() <= min(k, x.numel()) and idx.device == x.device
        return idx
    gpu_opt.compressor.select = recording
    cpu_opt.compressor.select = replaying
    return picks

