"""Horovod across two sandbox hosts (2 ranks each, 1gbit links), launched as README shows:
``cluster_sandbox.sh ... -- run_multi_node.sh "$GRAVAC_HOSTFILE" 4 configs/demo.yaml``.

One sandbox runs three jobs of the demo's GraVAC: 40 steps straight; 20 steps; --resume of
those to 40. Checked: 4 ranks, two per host (each rank's network namespace, looked up while
it runs); every rank's controller (CFs, decisions) the same; the checkpoint; and the resumed
run equal to the straight one: same losses and decisions per step, bit-identical
parameters and residuals.
"""
import json
from pathlib import Path

import torch

from jobs import read_records
from sandbox_jobs import RankWatcher

STEPS = 40
# window 8: five GraVAC windows in 40 steps; ω = 0: its decisions then depend only on
# the (deterministic) gains, not on this machine's timings, so a resume replays them.
COMMON = ("--set run.progress=never --set run.report=false --set run.eval_interval=0 "
          "--set run.checkpoint_interval=0 --set run.log_interval=1 "
          "--set compression.gravac.window=8 --set compression.gravac.omega=0")
PER_STEP = ("loss", "cf", "sent", "theta_min", "theta_c", "gain_min", "gain_c", "floats_sent",
            "world_size")


def _job(out: Path, name: str, steps: int, extra: str = "") -> str:
    return (f'hvd_scripts/run_multi_node.sh "$GRAVAC_HOSTFILE" 4 configs/demo.yaml -- {COMMON} '
            f"--set run.output_dir={out} --set run.name={name} --set run.steps={steps} {extra}")


def _rank_files(run_dir: Path, step: int) -> list[dict]:
    folder = run_dir / "checkpoints" / f"step_{step:08d}"
    return [torch.load(folder / f"rank_{r:05d}.pt", weights_only=False) for r in range(4)]


def _without_tables(decisions: list[dict]) -> list[dict]:
    """GraVAC's decisions without their throughput tables (measured times: they differ
    from run to run, and with ω = 0 they do not steer anything)."""
    return [{k: v for k, v in d.items() if k != "table"} for d in decisions]


def test_four_ranks_on_two_hosts_agree_and_resume_exactly(sandbox, tmp_path):
    out = tmp_path / "runs"
    ranks = RankWatcher("run.name=straight", 4).start()
    job = sandbox(" && ".join([_job(out, "straight", STEPS),
                               _job(out, "resumed", STEPS // 2),
                               _job(out, "resumed", STEPS, "--resume")]),
                  hosts=2, slots=2, link="1gbit")
    code = job.wait()
    seen = ranks.stop()
    output = job.output()
    assert code == 0, output[-6000:]

    # 4 ranks, 2 on each host: the network namespace each rank process ran in
    pid = job.proc.pid
    assert seen == {0: (f"gravac-cl-{pid}-h0", "h0"), 1: (f"gravac-cl-{pid}-h0", "h0"),
                    2: (f"gravac-cl-{pid}-h1", "h1"), 3: (f"gravac-cl-{pid}-h1", "h1")}, seen
    assert "--network-interfaces eth0 --ssh-port" in output   # run_multi_node.sh's flags
    straight = read_records(out / "straight/metrics.jsonl")
    start = next(r for r in straight if r["kind"] == "run_start")
    assert (start["world_size"], start["backend"], start["controller"]) == (4, "horovod", "gravac")

    # a checkpoint of every rank; the controller (broadcast from rank 0) the same on all 4
    latest = json.loads((out / "straight/checkpoints/latest.json").read_text())
    assert (latest["step"], latest["world_size"]) == (STEPS, 4)
    files = _rank_files(out / "straight", STEPS)
    controllers = [f["optimizer"]["gravac"]["controller"] for f in files]
    assert all(c == controllers[0] for c in controllers[1:])
    decisions = controllers[0]["state"]["decisions"]
    assert len(decisions) == STEPS // 8
    # rank 0's per-window records say the same as every rank's controller
    windows = [r for r in straight if r["kind"] == "window"]
    assert [(w["step"], w["theta_min"], w["theta_c"]) for w in windows] == [
        (d["step"] + 1, d["theta_min"], d["theta_c"]) for d in decisions]
    steps = [r for r in straight if r["kind"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    assert len({r["cf"] for r in steps}) > 1, "GraVAC never moved the CF: the test shows little"

    # the resumed run is the straight run
    assert f"resuming from step {STEPS // 2}" in output
    resumed = read_records(out / "resumed/metrics.jsonl")
    resumed_steps = [r for r in resumed if r["kind"] == "step"]
    assert [r["step"] for r in resumed_steps] == list(range(1, STEPS + 1))
    for a, b in zip(steps, resumed_steps):
        assert {k: a[k] for k in PER_STEP} == {k: b[k] for k in PER_STEP}, a["step"]
    common_a = torch.load(out / f"straight/checkpoints/step_{STEPS:08d}/common.pt",
                          weights_only=False)
    common_b = torch.load(out / f"resumed/checkpoints/step_{STEPS:08d}/common.pt",
                          weights_only=False)
    for key, value in common_a["model"].items():
        assert torch.equal(value, common_b["model"][key]), key
    for rank, (a, b) in enumerate(zip(files, _rank_files(out / "resumed", STEPS))):
        residuals_a = a["optimizer"]["gravac"]["memory"]["residuals"]
        residuals_b = b["optimizer"]["gravac"]["memory"]["residuals"]
        for name, residual in residuals_a.items():
            assert torch.equal(residual, residuals_b[name]), (rank, name)
        assert _without_tables(a["optimizer"]["gravac"]["controller"]["state"]["decisions"]) \
            == _without_tables(b["optimizer"]["gravac"]["controller"]["state"]["decisions"])
