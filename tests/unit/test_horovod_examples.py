"""Horovod's three PyTorch examples (MNIST, the synthetic benchmark, ImageNet ResNet),
as examples/horovod/ has them on synthetic data with only the optimizer line changed to
``gravac.DistributedOptimizer``, train for real under ``horovodrun -np 2``: the ranks end
with the same parameters, the loss goes down, and the ImageNet script resumes from its
checkpoint as Horovod's does (rank 0 loads, then the broadcasts)."""
import json
import subprocess
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]
HOROVODRUN = str(Path(sys.executable).parent / "horovodrun")


def run_example(script: str, *args: str) -> dict:
    """``horovodrun -np 2`` of examples/horovod/``script``; its rank 0's JSON line."""
    command = [HOROVODRUN, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
               str(REPO / "examples/horovod" / script), "--no-cuda", *args]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{proc.stdout[-4000:]}\n" \
                                 f"{proc.stderr[-4000:]}"
    lines = [ln.split(":", 1)[1] for ln in proc.stdout.splitlines()
             if ln.startswith('[0]<stdout>:{"example"')]
    assert len(lines) == 1, f"expected one JSON line from rank 0, got:\n{proc.stdout[-3000:]}"
    result = json.loads(lines[0])
    assert result["world_size"] == 2 and result["params_equal_rank0"] == [True, True], result
    return result


def test_mnist_trains_with_gravacs_optimizer():
    # AMP with Horovod's synchronize/unscale_/skip_synchronize pattern: in the parallel
    # suites (tests/parallel/test_horovod_patterns.py), on both transports.
    result = run_example("mnist.py", "--epochs", "2", "--lr", "0.05", "--train-samples", "1024",
                         "--fp16-allreduce", "--gradient-predivide-factor", "2")
    assert result["steps"] == 2 * 1024 // 2 // 64
    assert result["test_loss_after"] < result["test_loss_before"], result
    assert result["train_loss_last"] < result["train_loss_first"], result


def test_synthetic_benchmark_runs_with_gravacs_optimizer():
    result = run_example("synthetic_benchmark.py", "--model", "resnet18", "--batch-size", "8",
                         "--image-size", "16", "--num-warmup-batches", "2",
                         "--num-batches-per-iter", "2", "--num-iters", "2")
    assert result["steps"] == 6 and result["img_sec"] > 0
    assert result["loss_last"] < result["loss_first"], result


def test_imagenet_example_accumulates_checkpoints_and_resumes(tmp_path):
    common = ["--model", "resnet18", "--image-size", "16", "--batch-size", "8",
              "--batches-per-allreduce", "2", "--train-samples", "128", "--warmup-epochs", "1",
              "--base-lr", "0.01", "--checkpoint-format", str(tmp_path / "checkpoint-{epoch}.pt")]
    first = run_example("imagenet_resnet.py", "--epochs", "1", *common)
    assert first["resumed_from_epoch"] == 0 and first["epochs"] == 1
    assert first["val_loss_after"] < first["val_loss_before"], first
    resumed = run_example("imagenet_resnet.py", "--epochs", "2", *common)
    assert resumed["resumed_from_epoch"] == 1 and resumed["epochs"] == 1
    assert (tmp_path / "checkpoint-2.pt").exists()
