"""train.py's loop on a CUDA GPU, one process (run.backend=local): a compressed run trains
there, a checkpoint resumes exactly onto the GPU, and a CPU checkpoint resumes onto it.
Skipped where no GPU is visible (CI); run on the device machine by benchmarks/cuda_check.sh."""
import json
from pathlib import Path

import pytest
import torch

from gravac.train.config import load_config
from gravac.train.loop import train

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (torch.cuda.is_available() is False)")

REPO = Path(__file__).resolve().parents[2]
LSTM = ["model.name=lstm", "data.name=synthetic_text", "data.batch_size=8",
        "data.eval_batch_size=8", "data.bptt=10", "run.eval_batches=4",
        "data.options={num_tokens: 20000, valid_tokens: 2000, vocab_size: 500}",
        "optimizer.lr=1.0", "optimizer.lr_milestones=[]"]


def _lstm(dropout):
    return [*LSTM, f"model.options={{embedding_dim: 32, hidden_dim: 32, num_layers: 2, "
                   f"dropout: {dropout}, tie_weights: false}}"]


# "lstm_dropout" runs without cuDNN (see test_a_gpu_checkpoint_resumes_exactly_on_the_gpu).
WORKLOADS = {"cnn": [], "lstm": _lstm(0.0), "lstm_dropout": _lstm(0.2)}


@pytest.fixture(autouse=True)
def deterministic_kernels():
    """cuDNN's convolution algorithms may differ between two runs; exact resumes need one."""
    before = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    yield
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before


def _cfg(tmp_path, name, workload, steps, *extra):
    return load_config([str(REPO / "configs/demo.yaml")],
                       [f"run.output_dir={tmp_path}", f"run.name={name}", f"run.steps={steps}",
                        "run.backend=local", "run.progress=never", "run.report=false",
                        "run.log_interval=1", "run.eval_interval=0", "compression.gravac.window=10",
                        *WORKLOADS[workload], *extra])


def _final_model(run_dir: Path) -> dict:
    latest = json.loads((run_dir / "checkpoints/latest.json").read_text())
    return torch.load(run_dir / "checkpoints" / latest["dir"] / "common.pt",
                      map_location="cpu", weights_only=False)["model"]


def _losses(run_dir: Path) -> list[float]:
    return [r["loss"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if r["kind"] == "step"]


@pytest.mark.parametrize("workload", ["cnn", "lstm_dropout"])
def test_gravac_trains_on_the_gpu(tmp_path, workload):
    summary = train(_cfg(tmp_path, "gpu", workload, 60, "run.device=cuda"))
    records = [json.loads(line) for line in (tmp_path / "gpu/metrics.jsonl").read_text().splitlines()]
    start = next(r for r in records if r["kind"] == "run_start")
    assert start["device"].startswith("cuda:0")
    steps = [r for r in records if r["kind"] == "step"]
    assert len(steps) == 60 and all(r["sent"] in ("min", "candidate", "dense") for r in steps)
    assert any(r["sent"] != "dense" and r["cf"] > 1 for r in steps)
    losses = _losses(tmp_path / "gpu")
    assert sum(losses[-10:]) < sum(losses[:10]), losses
    assert summary["final"]["loss"] == summary["final"]["loss"]     # not NaN


@pytest.mark.parametrize("workload", ["cnn", "lstm", "lstm_dropout"])
def test_a_gpu_checkpoint_resumes_exactly_on_the_gpu(tmp_path, workload, monkeypatch):
    """20 steps straight against 10 + resume + 10: residuals, momentum, the LSTM's hidden
    state and the GPU's generator all come back.

    cuDNN's LSTM draws its dropout masks from a generator state of its own, seeded from
    torch's GPU generator once per process (again after a reseed) and not readable from
    torch: a resumed run restarts it, so with dropout and cuDNN the masks after a resume
    differ (seen on an H200: the first step after the resume differed). Without cuDNN the
    LSTM's dropout draws from torch's generator, which the checkpoint holds: exact."""
    if workload == "lstm_dropout":
        monkeypatch.setattr(torch.backends.cudnn, "enabled", False)
    whole = tmp_path / "whole"
    train(_cfg(whole, "r", workload, 20, "run.device=cuda"))
    split = tmp_path / "split"
    train(_cfg(split, "r", workload, 10, "run.device=cuda"))
    train(_cfg(split, "r", workload, 20, "run.device=cuda"), resume=True)
    assert _losses(split / "r") == _losses(whole / "r")
    a, b = _final_model(whole / "r"), _final_model(split / "r")
    assert all(torch.equal(a[k], b[k]) for k in a), \
        {k: float((a[k] - b[k]).abs().max()) for k in a if not torch.equal(a[k], b[k])}


def test_a_cpu_checkpoint_resumes_on_the_gpu(tmp_path):
    train(_cfg(tmp_path, "moved", "cnn", 10, "run.device=cpu"))
    summary = train(_cfg(tmp_path, "moved", "cnn", 20, "run.device=cuda"), resume=True)
    assert summary["steps"] == 20
    records = [json.loads(line) for line in
               (tmp_path / "moved/metrics.jsonl").read_text().splitlines()]
    starts = [r for r in records if r["kind"] == "run_start"]
    assert starts[-1]["device"].startswith("cuda") and starts[-1]["resumed"]
    assert [r["step"] for r in records if r["kind"] == "step"] == list(range(1, 21))
    # the GPU run's checkpoint loads back on a CPU-only machine
    model = _final_model(tmp_path / "moved")
    assert all(t.device.type == "cpu" for t in model.values())
