"""benchmarks/gpu_step.py runs its methods on a CPU (--device cpu --small): the per-layer
variants set their thresholds for their run only, and every row has its phases."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gravac import memory
from gravac.compressors import powersgd
from gravac.engine import selection

from bench_module import load_benchmark

REPO = Path(__file__).resolve().parents[2]
gpu_step = load_benchmark("gpu_step")


def _thresholds():
    return (memory.FLAT_UPDATE_MIN_LAYERS, powersgd.BATCH_MIN_MATRICES,
            selection.GATHER_MIN_LAYERS)


def test_the_per_layer_variants_change_their_threshold_for_their_steps_only():
    """The methods run in interleaved rounds: each variant's threshold is out of reach
    exactly while its own steps run, every method gets its share of the steps."""
    import torch
    before = _thresholds()
    seen = {}
    real = gpu_step._steps

    def spy(setup, *args, **kwargs):
        step = setup.opt.step
        if not getattr(step, "spied", False):     # note the thresholds each step sees
            def noting(*a, **k):
                seen.setdefault(setup.method, set()).add(_thresholds())
                return step(*a, **k)
            noting.spied = True
            setup.opt.step = noting
        real(setup, *args, **kwargs)
    gpu_step._steps = spy
    methods = ["topk10_layerwise_residual", "powersgd4_layerwise_orthogonalize", "powersgd4",
               "topk10_layerwise_gather"]
    try:
        rows = gpu_step.measure_all("lstm", methods, torch.device("cpu"), steps=5, warmup=1,
                                    rounds=2, small=True)
    finally:
        gpu_step._steps = real
    for method in methods:
        assert rows[method]["step"] > 0 and rows[method]["compress"] > 0
        assert rows[method]["sent"] == ["min"]
    assert seen == {"topk10_layerwise_residual": {(1 << 30, before[1], before[2])},
                    "powersgd4_layerwise_orthogonalize": {(before[0], 1 << 30, before[2])},
                    "powersgd4": {before},
                    "topk10_layerwise_gather": {(before[0], before[1], 1 << 30)}}
    assert _thresholds() == before


def test_gpu_step_refuses_cuda_without_a_gpu_in_one_line():
    proc = subprocess.run([sys.executable, "benchmarks/gpu_step.py", "--device", "cuda"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    if "sees no CUDA GPU" not in proc.stderr:
        pytest.skip("this machine sees a CUDA GPU: nothing to refuse")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


def test_the_profile_names_the_engine_functions_the_host_spends_its_step_in(tmp_path):
    """--profile: torch's operator tables, then opt.step's Python function by function
    (cProfile over three more steps), where the engine's own functions show by name."""
    import torch
    gpu_step.measure_all("lstm", ["topk10"], torch.device("cpu"), steps=2, warmup=1,
                         rounds=1, small=True, profile=tmp_path)
    text = (tmp_path / "lstm_topk10.txt").read_text()
    assert "by host time" in text and "every operator, by count" in text
    python = text.split("opt.step's Python, by own time")[1]
    assert "gravac/engine/optimizer.py" in python and "ncalls" in python


def test_two_ranks_over_torch_distributed_train_together_and_rank_0_reports(tmp_path):
    """--comm torch under torchrun: the ranks exchange over gloo, every method trains its
    steps, rank 0 alone writes the JSON; auto's cell names what each step sent."""
    out = tmp_path / "two.json"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "benchmarks/gpu_step.py", "--comm", "torch", "--device", "cpu", "--small",
         "--models", "lstm", "--methods", "dense", "auto", "--steps", "30", "--warmup", "2",
         "--rounds", "1", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600, env={**os.environ,
                                                                  "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r["method"]: r for r in json.loads(out.read_text())["results"]}
    assert rows["dense"]["sent_steps"] == {"dense": 30}
    assert sum(rows["auto"]["sent_steps"].values()) == 30
    assert rows["auto"]["last_sent"] in rows["auto"]["sent_steps"]
    assert proc.stdout.count("| lstm | 4 |") == 2          # one table, from rank 0
