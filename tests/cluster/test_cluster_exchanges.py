"""The exchanges on 4 ranks over 2 sandbox hosts (2 ranks each), on both transports:
tests/parallel/test_exchanges.py, whose references are written for any layout (the hosts
come from the launcher: Horovod's cross rank, torchrun's node rank), run by its ranks.
Hierarchical here has two hosts of two ranks, so every one of its steps is exercised: the
host average, the shards, the exchange across hosts and the host allgather."""
import re

PYTEST = "-q -p no:cacheprovider -k test_exchanges"
#: The tests of tests/parallel/test_exchanges.py (with their parameters): every one must
#: pass on every rank, none may be skipped or left out. Update it with that file.
EXPECTED_PASSED = 9


def _passed(job, ranks: int) -> None:
    """Every rank's pytest summary: EXPECTED_PASSED passed, none failed. Only the summaries
    count: the launchers' own log lines may say "failed" of a benign shutdown."""
    output = job.output()
    counts = re.findall(r"(\d+) passed", output)
    assert len(counts) >= ranks and all(int(c) == EXPECTED_PASSED for c in counts[-ranks:]), \
        job.digest()
    assert not re.search(r"\d+ (failed|errors?)\b", output), job.digest()


def test_exchanges_exact_on_two_hosts_horovod(sandbox, tmp_path):
    command = ('HOROVOD_DYNAMIC_PROCESS_SETS=1 .venv/bin/horovodrun -np 4 -H h0:2,h1:2 --gloo '
               '--network-interfaces "$GRAVAC_NICS" --ssh-port "$GRAVAC_SSH_PORT" '
               f'--ssh-identity-file "$GRAVAC_SSH_KEY" bash tests/parallel/run_rank.sh '
               f'{tmp_path}/results {PYTEST}')
    job = sandbox(command, hosts=2, slots=2, link="1gbit")
    assert job.wait() == 0, job.digest()
    _passed(job, 4)


def test_exchanges_exact_on_two_hosts_torchrun(sandbox, tmp_path):
    # the c10d rendezvous (no fixed node ranks): the training test uses the static one
    command = ('.venv/bin/torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d '
               '--rdzv-endpoint "$GRAVAC_HOST0_ADDR:29400" --rdzv-id exchanges '
               '--no-python bash tests/parallel/run_rank.sh '
               f'{tmp_path}/results_$GRAVAC_NODE_RANK {PYTEST}')
    job = sandbox(command, hosts=2, slots=2, link="1gbit", each=True)
    assert job.wait() == 0, job.digest()
    _passed(job, 4)
