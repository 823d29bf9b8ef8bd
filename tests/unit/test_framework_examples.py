"""The framework examples (examples/lightning_ddp_hook.py, examples/accelerate_ddp_hook.py)
train for real on 2 CPU ranks with gravac's DDP communication hook: the hook runs every
step on every rank, the ranks end with the same parameters, the loss goes down, and the
hook's scalars and state reach the frameworks' loggers and checkpoints. Each example runs
as its own job (Lightning starts its second rank itself; Accelerate under torchrun).
Skipped where requirements-frameworks.txt is not installed."""
import csv
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
STEPS = 30
LOG_EVERY = 5


def _missing(package: str) -> bool:
    return importlib.util.find_spec(package) is None


def run_example(command: list[str]) -> dict:
    """Run an example job from the repository root; its rank 0's JSON line."""
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{command} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n" \
                                 f"{proc.stderr[-6000:]}"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('{"example"')]
    assert len(lines) == 1, f"expected one JSON line from rank 0, got:\n{proc.stdout[-3000:]}"
    return json.loads(lines[0])


def check_training(result: dict, example: str) -> None:
    assert result["example"] == example and result["world_size"] == 2
    assert result["steps"] == STEPS
    assert result["hook_steps"] == [STEPS, STEPS]            # every step, every rank
    assert result["params_equal_rank0"] == [True, True]
    assert result["test_loss_after"] < 0.9 * result["test_loss_before"], result
    assert result["train_loss_last"] < result["train_loss_first"], result


def residuals(state: dict) -> dict[str, torch.Tensor]:
    return state["memory"]["residuals"]


def check_hook_state_files(out: Path, rank0_in_checkpoint: dict, prefix: str) -> None:
    """Each rank's own hook state file; the framework's checkpoint holds rank 0's."""
    ranks = [torch.load(out / f"hook_state_rank{r}.pt", map_location="cpu", weights_only=False)
             for r in (0, 1)]
    assert [s["step"] for s in ranks] == [STEPS, STEPS]
    assert rank0_in_checkpoint["step"] == STEPS
    names = sorted(residuals(rank0_in_checkpoint))
    # SmallCNN's two layers above min_compress_numel, named as the hook state's model names them
    assert names == [f"{prefix}conv2.weight", f"{prefix}fc1.weight"]
    for name in names:
        assert torch.equal(residuals(rank0_in_checkpoint)[name], residuals(ranks[0])[name])
        assert residuals(ranks[0])[name].abs().sum() > 0
    # residuals are per rank: rank 1's differ (its own data)
    assert any(not torch.equal(residuals(ranks[0])[n], residuals(ranks[1])[n]) for n in names)


def check_logged(rows: list[dict[str, float]]) -> None:
    """The hook's scalars of the logged steps: a compressed step among them."""
    assert len(rows) == STEPS // LOG_EVERY, rows
    for row in rows:
        assert {"compression/cf_sent", "compression/theta_min", "traffic/floats_sent",
                "traffic/dense_floats", "train/loss"} <= set(row), sorted(row)
    assert any(r["compression/cf_sent"] >= 10 and
               r["traffic/floats_sent"] < r["traffic/dense_floats"] for r in rows), rows


@pytest.mark.skipif(_missing("lightning"),
                    reason="lightning is not installed: pip install -r "
                           "requirements-frameworks.txt -c requirements.txt")
def test_lightning_example_trains_with_the_hook(tmp_path):
    # The script starts its second rank itself (Lightning's subprocess launcher).
    result = run_example([sys.executable, "examples/lightning_ddp_hook.py", "--steps",
                          str(STEPS), "--log-every", str(LOG_EVERY), "--out", str(tmp_path)])
    check_training(result, "lightning")
    assert result["controller"] == "gravac"

    # Lightning's checkpoint: the optimizer's state dict carries the hook's (rank 0's).
    ckpt = torch.load(result["checkpoint"], map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == STEPS
    [opt_state] = ckpt["optimizer_states"]
    assert "gravac" in opt_state and opt_state["state"]        # the hook's and SGD's own
    check_hook_state_files(tmp_path, opt_state["gravac"], prefix="net.")

    # Lightning's CSV logger got the hook's scalars, step by step.
    with open(result["metrics_csv"]) as f:
        rows = [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]
    check_logged(rows)
    assert any((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


@pytest.mark.skipif(_missing("accelerate"),
                    reason="accelerate is not installed: pip install -r "
                           "requirements-frameworks.txt -c requirements.txt")
def test_accelerate_example_trains_with_the_hook(tmp_path):
    result = run_example([TORCHRUN, "--standalone", "--nproc-per-node", "2",
                          "examples/accelerate_ddp_hook.py", "--steps", str(STEPS),
                          "--log-every", str(LOG_EVERY), "--out", str(tmp_path),
                          "--controller", "static", "--cf", "20"])
    check_training(result, "accelerate")
    assert (result["controller"], result["last_sent"], result["last_cf"]) == ("static", "min", 20.0)

    # accelerator.save_state: the optimizer's state dict carries the hook's (rank 0's).
    opt_state = torch.load(Path(result["state_dir"]) / "optimizer.bin", map_location="cpu",
                           weights_only=False)
    assert "gravac" in opt_state and opt_state["state"]
    assert "controller" in opt_state["gravac"]
    check_hook_state_files(tmp_path, opt_state["gravac"], prefix="")

    # accelerator.log wrote the hook's scalars to TensorBoard.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(result["tensorboard_dir"])
    events.Reload()
    steps = [e.step for e in events.Scalars("compression/cf_sent")]
    assert steps == list(range(LOG_EVERY, STEPS + 1, LOG_EVERY))
    rows = [{tag: events.Scalars(tag)[i].value for tag in events.Tags()["scalars"]}
            for i in range(len(steps))]
    check_logged(rows)
    assert all(r["compression/cf_sent"] == 20.0 for r in rows)
