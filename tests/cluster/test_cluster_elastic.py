"""Horovod Elastic across two sandbox hosts: h1 leaves while the run goes on (its 2 ranks are
ended by Horovod), training continues on h0's 2 ranks, h1 comes back and the run finishes
on 4. horovodrun runs on h0 with `--host-discovery-script hvd_scripts/discover_hosts.sh`,
which prints a file that the test rewrites."""
import time
from pathlib import Path

from jobs import read_records

# h1 leaves after step 10 and is back as soon as the job runs on 2 ranks: the new workers
# start (ssh, imports) while h0's ranks train on, and join at a commit some 20-60 steps
# later. Horovod noticed the departure itself as late as step 190 once (4 ranks on 2
# loaded cores, 0.07 s a step): 500 steps leave room for both.
STEPS = 500
GUARD_S = 300     # a broken set-up must fail, not hang; not a speed limit


def _wait_for(job, metrics: Path, predicate, what: str):
    deadline = time.time() + GUARD_S
    while time.time() < deadline:
        found = predicate(read_records(metrics))
        if found:
            return found
        if job.proc.poll() is not None:
            raise AssertionError(f"the job ended before {what}:\n{job.digest(4000)}")
        time.sleep(0.1)
    raise AssertionError(f"no {what} within {GUARD_S} s (hang guard):\n{job.digest(4000)}")


def _last_step(records) -> int:
    steps = [r["step"] for r in records if r.get("kind") == "step"]
    return steps[-1] if steps else 0


def _resets(records) -> list[dict]:
    return [r for r in records if r.get("kind") == "elastic_reset"]


def test_a_host_leaves_and_comes_back_while_training_goes_on(sandbox, tmp_path):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("h0:2\nh1:2\n")
    out = tmp_path / "runs"
    command = (".venv/bin/horovodrun -np 4 --min-np 2 --max-np 4 "
               "--host-discovery-script hvd_scripts/discover_hosts.sh --gloo "
               '--network-interfaces "$GRAVAC_NICS" --ssh-port "$GRAVAC_SSH_PORT" '
               '--ssh-identity-file "$GRAVAC_SSH_KEY" '
               ".venv/bin/python train.py --config configs/demo.yaml "
               f"--set run.output_dir={out} --set run.name=elastic --set run.steps={STEPS} "
               "--set run.elastic=true --set run.elastic_commit_interval=10 "
               "--set run.log_interval=1 --set run.eval_interval=0 "
               "--set run.checkpoint_interval=0 --set run.progress=never --set run.report=false")
    job = sandbox(command, hosts=2, slots=2, link="1gbit",
                  env={"GRAVAC_HOSTS_FILE": str(hosts)})
    metrics = out / "elastic/metrics.jsonl"
    _wait_for(job, metrics, lambda r: _last_step(r) >= 10, "step 10")
    hosts.write_text("h0:2\n")                              # h1 leaves
    shrink = _wait_for(job, metrics, lambda r: _resets(r)[:1], "the reset to 2 ranks")[0]
    hosts.write_text("h0:2\nh1:2\n")                        # and comes back
    grow = _wait_for(job, metrics, lambda r: _resets(r)[1:], "the reset to 4 ranks")[0]
    assert job.wait() == 0, job.digest()

    output = job.output()
    assert "h1[0] has been removed from elastic job" in output      # Horovod ends h1's ranks
    assert "h1[1] has been removed from elastic job" in output
    records = read_records(metrics)
    assert (shrink["previous_world_size"], shrink["world_size"]) == (4, 2)
    assert (grow["previous_world_size"], grow["world_size"]) == (2, 4)
    assert shrink["step"] % 10 == 0 and grow["step"] % 10 == 0     # resets happen at commits
    steps = [r["step"] for r in records if r.get("kind") == "step"]
    assert steps == list(range(1, STEPS + 1)), "every step logged exactly once, in order"
    world = {r["step"]: r["world_size"] for r in records if r.get("kind") == "step"}
    assert {world[s] for s in range(1, shrink["step"] + 1)} == {4}
    assert {world[s] for s in range(shrink["step"] + 1, grow["step"] + 1)} == {2}
    assert {world[s] for s in range(grow["step"] + 1, STEPS + 1)} == {4}
    final = [r for r in records if r.get("kind") == "run_end"]
    assert len(final) == 1 and final[0]["step"] == STEPS
    print(f"resets: 4 -> 2 ranks at step {shrink['step']}, 2 -> 4 at step {grow['step']}")
