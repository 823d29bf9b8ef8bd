"""train.py's loop on 2 ranks: every controller end to end, and exact resume."""
import json
from pathlib import Path

import pytest
import torch

from gravac.train.loop import train
from helpers import BACKEND, COMM, ONE_TRANSPORT, barrier, demo_config


# A run's report (plots, report.md) is written after its last checkpoint, on rank 0.
NO_REPORT = "run.report=false"
#: gravac as DDP's communication hook: torchrun only.
DDP_HOOK = pytest.mark.skipif(BACKEND != "torch", reason="DDP runs on torch.distributed only")


def _cfg(out, name, *files, steps=40, extra=()):
    return demo_config(out, name, *files, steps=steps,
                       extra=["run.eval_interval=20", "run.checkpoint_interval=0", *extra])


@pytest.mark.parametrize("files,extra", [
    (["dense.yaml"], []),
    (["horovod_fp16.yaml"], []),
    # (gravac's optimizer on Horovod: the gravac case; the others' controllers under torchrun)
    pytest.param(["static_topk_10x.yaml"], [], marks=ONE_TRANSPORT),
    ([], ["compression.gravac.window=10"]),            # the demo's GraVAC
    pytest.param(["accordion_cnn.yaml"], ["compression.accordion.interval_steps=5",
                                          "compression.accordion.switch_freq=2"],
                 marks=ONE_TRANSPORT),
    pytest.param([], ["compression.gravac.window=10", "compression.front_end=ddp_hook"],
                  marks=DDP_HOOK),
], ids=["dense", "horovod-fp16", "static-topk", "gravac", "accordion", "gravac-ddp-hook"])
def test_every_controller_trains_and_writes_events_metrics_report(files, extra, shared_tmp, rank):
    name = "e2e-" + (files[0].split(".")[0] if files else "gravac")
    summary = train(_cfg(shared_tmp, name, *files, extra=extra))
    run_dir = Path(shared_tmp) / name
    assert summary["steps"] == 40
    assert summary["final"]["top1"] > 0.2          # 40 steps on digits: clearly above 10% chance
    if rank == 0:
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        kinds = {r["kind"] for r in records}
        assert {"run_start", "step", "eval", "run_end"} <= kinds
        steps = [r for r in records if r["kind"] == "step"]
        assert [r["step"] for r in steps] == list(range(1, 41))
        assert steps[-1]["cum_dense_floats"] == 40 * steps[-1]["dense_floats"]
        if files and files[0].startswith(("dense", "horovod")):
            assert all(r["cf"] == 1 for r in steps)
        else:
            assert steps[-1]["cum_floats_sent"] < 0.5 * steps[-1]["cum_dense_floats"]
        if not files:
            assert "window" in kinds
        assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
        assert (run_dir / "report.md").is_file() and (run_dir / "cf_vs_step.png").is_file()
        assert (run_dir / "config.yaml").is_file()
    assert (run_dir / "checkpoints" / "latest.json").is_file()


@pytest.mark.parametrize("files,extra", [
    pytest.param(["static_dgc_10x.yaml"], [], marks=ONE_TRANSPORT),
    # ω = 0: GraVAC's window decisions then depend only on (deterministic) gains, not on
    # this machine's timings, so a resumed run must replay them exactly.
    ([], ["compression.gravac.window=8", "compression.gravac.omega=0"]),
    pytest.param(["accordion_cnn.yaml"], ["compression.accordion.interval_steps=6",
                                          "compression.accordion.switch_freq=2"],
                 marks=ONE_TRANSPORT),
    # The DDP hook's state rides in the optimizer's checkpoint (optimizer_with_hook_state).
    pytest.param([], ["compression.gravac.window=8", "compression.gravac.omega=0",
                      "compression.front_end=ddp_hook", "compression.overlap=true",
                      "compression.bucket_cap_mb=0.05"], marks=DDP_HOOK),
], ids=["static-dgc", "gravac", "accordion", "gravac-ddp-hook"])
def test_resume_gives_identical_parameters(files, extra, shared_tmp):
    """2N steps straight == N steps, stop, resume, N more (crossing an epoch boundary)."""
    n = 30   # digits on 2 ranks at batch 16: 44 steps per epoch, so 60 crosses one
    # No report (plots) of the runs before the resume: nothing reads them, and the report
    # follows the checkpoint; the resumed run writes its own as usual.
    straight = _cfg(shared_tmp, "straight", *files, steps=2 * n, extra=[*extra, NO_REPORT])
    train(straight)
    first = _cfg(shared_tmp, "resumed", *files, steps=n, extra=[*extra, NO_REPORT])
    train(first)
    second = _cfg(shared_tmp, "resumed", *files, steps=2 * n, extra=extra)
    train(second, resume=True)
    a = torch.load(Path(shared_tmp) / "straight/checkpoints/step_00000060/common.pt",
                   weights_only=False)
    b = torch.load(Path(shared_tmp) / "resumed/checkpoints/step_00000060/common.pt",
                   weights_only=False)
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    assert a["cum_floats"] == b["cum_floats"]
    mine_a = torch.load(Path(shared_tmp) / f"straight/checkpoints/step_00000060/rank_{COMM.rank:05d}.pt",
                        weights_only=False)
    mine_b = torch.load(Path(shared_tmp) / f"resumed/checkpoints/step_00000060/rank_{COMM.rank:05d}.pt",
                        weights_only=False)
    for name, residual in mine_a["optimizer"]["gravac"]["memory"]["residuals"].items():
        assert torch.equal(residual, mine_b["optimizer"]["gravac"]["memory"]["residuals"][name])
    ctrl_a = mine_a["optimizer"]["gravac"]["controller"]
    ctrl_b = mine_b["optimizer"]["gravac"]["controller"]
    if "state" in ctrl_a and "decisions" in ctrl_a["state"]:
        strip = lambda ds: [{k: v for k, v in d.items() if k != "table"} for d in ds]
        assert strip(ctrl_a["state"]["decisions"]) == strip(ctrl_b["state"]["decisions"])


def test_occupied_run_dir_is_refused_on_every_rank(shared_tmp):
    from gravac.train.config import ConfigError

    cfg = _cfg(shared_tmp, "taken", "static_topk_10x.yaml", steps=2)
    train(cfg)
    with pytest.raises(ConfigError, match="already holds a run"):
        train(cfg)
    with pytest.raises(ConfigError, match="no checkpoint"):
        train(_cfg(shared_tmp, "never-ran", steps=2), resume=True)


def test_corrupt_latest_checkpoint_falls_back_to_the_previous_one(shared_tmp, rank, capsys):
    """Truncate one rank's file of the newest checkpoint: resume uses the one before it,
    and the run still ends exactly where an uninterrupted run ends."""
    extra = ["run.checkpoint_interval=10", "run.keep_checkpoints=3"]
    train(_cfg(shared_tmp, "straight30", "static_topk_10x.yaml", steps=30,
               extra=[*extra, NO_REPORT]))
    train(_cfg(shared_tmp, "broken", "static_topk_10x.yaml", steps=20, extra=[*extra, NO_REPORT]))
    victim = Path(shared_tmp) / "broken/checkpoints/step_00000020/rank_00001.pt"
    if rank == 0:
        data = victim.read_bytes()
        victim.write_bytes(data[: len(data) // 3])          # a crash mid-write
    barrier("corrupt.done")
    train(_cfg(shared_tmp, "broken", "static_topk_10x.yaml", steps=30, extra=extra), resume=True)
    out = capsys.readouterr().out
    if rank == 0:
        assert "step_00000020 is unreadable on rank(s) [1]" in out
        assert "resuming from step 10" in out
    a = torch.load(Path(shared_tmp) / "straight30/checkpoints/step_00000030/common.pt",
                   weights_only=False)
    b = torch.load(Path(shared_tmp) / "broken/checkpoints/step_00000030/common.pt",
                   weights_only=False)
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
