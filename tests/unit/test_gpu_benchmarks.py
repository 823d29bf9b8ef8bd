"""benchmarks/gpu_step.py runs its methods on a CPU (--device cpu --small): the per-layer
variants set their thresholds for their run only, and every row has its phases."""
import subprocess
import sys
from pathlib import Path

import pytest

from gravac import memory
from gravac.compressors import powersgd

from bench_module import load_benchmark

REPO = Path(__file__).resolve().parents[2]
gpu_step = load_benchmark("gpu_step")


def test_the_per_layer_variants_change_their_threshold_for_their_run_only():
    import torch
    before = (memory.FLAT_UPDATE_MIN_LAYERS, powersgd.BATCH_MIN_MATRICES)
    seen = {}
    real = gpu_step._measure

    def spy(*args, **kwargs):
        seen[args[5]] = (memory.FLAT_UPDATE_MIN_LAYERS, powersgd.BATCH_MIN_MATRICES)
        return real(*args, **kwargs)
    gpu_step._measure = spy
    try:
        for method in ("topk10_layerwise_residual", "powersgd4_layerwise_orthogonalize",
                       "powersgd4"):
            row = gpu_step.measure("lstm", method, torch.device("cpu"), steps=1, warmup=1,
                                   small=True)
            assert row["step"] > 0 and row["compress"] > 0 and row["sent"] == ["min"]
    finally:
        gpu_step._measure = real
    assert seen["topk10_layerwise_residual"][0] >= 1 << 30
    assert seen["powersgd4_layerwise_orthogonalize"][1] >= 1 << 30
    assert seen["powersgd4"] == before
    assert (memory.FLAT_UPDATE_MIN_LAYERS, powersgd.BATCH_MIN_MATRICES) == before


def test_gpu_step_refuses_cuda_without_a_gpu_in_one_line():
    proc = subprocess.run([sys.executable, "benchmarks/gpu_step.py", "--device", "cuda"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    if "sees no CUDA GPU" not in proc.stderr:
        pytest.skip("this machine sees a CUDA GPU: nothing to refuse")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
