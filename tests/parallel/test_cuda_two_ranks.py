"""gravac's step on CUDA tensors over 2 ranks of torch.distributed (gloo: two ranks may
share one GPU, which NCCL refuses; gloo's wire is the host, TorchDistComm._on_wire).

For every variant of tests/cuda_variants.py (the one-process suite's table): each rank
builds the same model (seed 0) on its GPU and on the CPU, gives both its own gradients
(a seed per rank), and steps the GPU's optimizer, then the CPU's, 4 times (the same order
on both ranks, so the collectives line up; variants that draw their picks on the device
replay the GPU's picks on the CPU). Then, per rank, the CUDA run equals the CPU run with
the one-process suite's tolerances; both ranks' CUDA parameters are bitwise equal; and
dense steps equal SGD with momentum on the ranks' mean gradient, computed here by hand.

Skipped where a rank sees no CUDA GPU (the ranks agree first, so both skip alike).
Launch (one GPU is enough)::

    torchrun --standalone --nproc-per-node 2 -m pytest tests/parallel/test_cuda_two_ranks.py
"""
from __future__ import annotations

import pytest
import torch

from cuda_variants import (LOWRANK, REPLAYED, VARIANTS, Net, assert_match, build,
                           full_fp32_matmuls, replay, same_stats, set_grads, step_grads)
from helpers import BACKEND, COMM

#: Every test of the module, skipped alike on both ranks (they agree on it). A mark, not
#: pytest.skip(allow_module_level=True): a run of this file alone that collects nothing
#: exits 5, which torchrun reports as a failed rank.
pytestmark = pytest.mark.skipif(
    BACKEND != "torch" or not all(COMM.allgather_object(torch.cuda.is_available(),
                                                        name="test.cuda_available")),
    reason="needs a CUDA GPU on every rank and torchrun (torch.distributed): compares "
           "gravac's 2-rank step on CUDA with the same step on the CPU")

#: Steps per variant; the learning rate and momentum of build's SGD (the dense reference).
STEPS, LR, MOMENTUM = 4, 0.1, 0.9


def _device() -> torch.device:
    """This rank's GPU: the ranks share one where the host has fewer GPUs than ranks."""
    return torch.device("cuda", COMM.local_rank % torch.cuda.device_count())


#: Embedding rows with a gradient per rank and step: more entries than GraVAC's first
#: level keeps (2x of 3072), so no level picks among tied zeros. With 2 ranks a shared
#: index set is the leader's; had it picked zeros (ties), the other rank's gains would
#: depend on which, and the GPU picks other ones than the CPU.
ROWS = 48


def _rank_grads(model, step: int, rank: int) -> dict:
    """Rank ``rank``'s gradients of ``step``: other values on every rank."""
    return step_grads(model, step + 1000 * rank, rows=ROWS)


def _failure(check, *args, **kwargs) -> str | None:
    """The message of ``check``'s failed assertion, None when it passes: gathered from every
    rank, a failure on one rank fails the test on both."""
    try:
        check(*args, **kwargs)
    except AssertionError as error:
        return f"rank {COMM.rank}: {error}"
    return None


def _run(variant: str):
    """4 steps of ``variant``, CUDA then CPU each step: the (model, optimizer) pairs, the
    step records (cpu, cuda) per step, and the GPU picks the CPU did not replay."""
    gpu, cpu = build(_device(), variant, COMM), build("cpu", variant, COMM)
    picks = replay(gpu[1], cpu[1]) if variant in REPLAYED else []
    stats = []
    for step in range(STEPS):
        records = []
        for model, opt in (gpu, cpu):
            set_grads(model, _rank_grads(model, step, COMM.rank))
            opt.step()
            records.append(opt.last_stats)
        stats.append(records[::-1])
    return cpu, gpu, stats, picks


def _check_run(variant: str, cpu, gpu, stats, picks) -> None:
    """This rank's CUDA run against its CPU run (the one-process suite's comparisons)."""
    for step, (a, b) in enumerate(stats):
        same_stats(a, b, f"{variant} step {step}")
        assert b.t_compress is not None and b.t_compress >= 0 and b.t_comm >= 0
    assert picks == [], f"{variant}: the GPU step selected more often than the CPU step"
    assert_match(cpu, gpu, exact=variant not in LOWRANK, what=variant)


def _dense_reference(model) -> dict:
    """SGD with momentum on the mean of every rank's gradients, by hand on the CPU from
    the shared initial parameters (seed 0): no gravac, no collective."""
    torch.manual_seed(0)
    params = {name: p.detach() for name, p in Net().named_parameters()}
    buffers: dict = {}
    for step in range(STEPS):
        per_rank = [_rank_grads(model, step, r) for r in range(COMM.size)]
        for name, p in params.items():
            mean = sum(g[name].to_dense() for g in per_rank) / COMM.size
            buf = buffers.get(name)
            buffers[name] = mean.clone() if buf is None else buf.mul_(MOMENTUM).add_(mean)
            p.add_(buffers[name], alpha=-LR)
    return params


def _check_dense(gpu_model) -> None:
    reference = _dense_reference(gpu_model)
    for name, p in gpu_model.named_parameters():
        torch.testing.assert_close(p.detach().cpu(), reference[name], rtol=1e-6, atol=1e-6,
                                   msg=lambda m, n=name: f"dense: parameter {n}: {m}")


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_two_rank_cuda_step_equals_the_cpu_step_and_the_other_rank(variant):
    with full_fp32_matmuls():
        cpu, gpu, stats, picks = _run(variant)
    failures = [_failure(_check_run, variant, cpu, gpu, stats, picks)]
    if variant == "dense":
        failures.append(_failure(_check_dense, gpu[0]))
    mine = {name: (p.detach().cpu(), _dense(p.grad).cpu(), p.grad.is_sparse)
            for name, p in gpu[0].named_parameters()}
    gathered = COMM.allgather_object((mine, failures), name=f"test.cuda_two_ranks.{variant}")
    failed = [f for _, rank_failures in gathered for f in rank_failures if f]
    assert not failed, "\n".join(failed)
    ranks = [m for m, _ in gathered]
    for name, (param, grad, sparse) in ranks[0].items():
        for rank in range(1, COMM.size):
            other_param, other_grad, _ = ranks[rank][name]
            # gravac's contract: every rank hands its optimizer the same gradients.
            assert torch.equal(other_grad, grad), \
                f"{variant}: the gradient of {name} on rank {rank} differs from rank 0's"
            if sparse:
                # torch's SGD adds a sparse momentum buffer to the parameter with CUDA
                # atomics, its duplicate entries in no fixed order: equal gradients give
                # parameters equal only to rounding (docs/notes/2026-11-benchmarks.md §7a).
                torch.testing.assert_close(other_param, param, rtol=1e-6, atol=1e-6)
            else:
                assert torch.equal(other_param, param), \
                    f"{variant}: parameter {name} of rank {rank} differs from rank 0's"


def _dense(grad: torch.Tensor) -> torch.Tensor:
    return grad.to_dense() if grad.is_sparse else grad
