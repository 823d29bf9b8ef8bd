"""torch.distributed across two sandbox hosts: one torchrun per host (`cluster_sandbox.sh
--each`), 2 ranks each, as README shows: GRAVAC_NODE_RANK fixes each host's ranks, so
run_torchrun.sh takes the static rendezvous, hosted on h0."""
import json

from jobs import read_records
from sandbox_jobs import RankWatcher

STEPS = 40


def test_torchrun_trains_with_four_ranks_on_two_hosts(sandbox, tmp_path):
    out = tmp_path / "runs"
    command = ("GRAVAC_NNODES=2 GRAVAC_RDZV_ENDPOINT=$GRAVAC_HOST0_ADDR:29400 "
               f"hvd_scripts/run_torchrun.sh 2 configs/demo.yaml -- --set run.output_dir={out} "
               f"--set run.name=torchrun4 --set run.steps={STEPS} --set run.eval_interval=0 "
               "--set run.progress=never --set run.report=false")
    ranks = RankWatcher("run.name=torchrun4", 4).start()
    job = sandbox(command, hosts=2, slots=2, link="1gbit", each=True)
    code = job.wait()
    seen = ranks.stop()
    assert code == 0, job.digest()
    # GRAVAC_NODE_RANK=k on host hk: ranks 0-1 on h0, 2-3 on h1
    pid = job.proc.pid
    assert {rank: netns for rank, (netns, _) in seen.items()} == {
        0: f"gravac-cl-{pid}-h0", 1: f"gravac-cl-{pid}-h0",
        2: f"gravac-cl-{pid}-h1", 3: f"gravac-cl-{pid}-h1"}, seen
    records = read_records(out / "torchrun4/metrics.jsonl")
    start = next(r for r in records if r["kind"] == "run_start")
    assert (start["world_size"], start["backend"]) == (4, "torch")
    steps = [r for r in records if r["kind"] == "step"]
    assert steps[-1]["step"] == STEPS and {r["world_size"] for r in steps} == {4}
    assert [r["kind"] for r in records][-1] == "run_end"
    latest = json.loads((out / "torchrun4/checkpoints/latest.json").read_text())
    assert (latest["step"], latest["world_size"]) == (STEPS, 4)
