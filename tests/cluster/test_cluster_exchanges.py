"""The exchanges on 4 ranks over 2 sandbox hosts (2 ranks each), on both transports:
tests/parallel/test_exchanges.py, whose references are written for any layout (the hosts
come from the launcher: Horovod's cross rank, torchrun's node rank), run by its ranks.
Hierarchical here has two hosts of two ranks, so every one of its steps is exercised: the
host average, the shards, the exchange across hosts and the host allgather."""
import re

PYTEST = "-q -p no:cacheprovider -k test_exchanges"


def _passed(output: str, ranks: int) -> None:
    counts = re.findall(r"(\d+) passed", output)
    assert len(counts) >= ranks and all(int(c) == 6 for c in counts[-ranks:]), output[-6000:]
    assert "failed" not in output.split("passed")[-1], output[-6000:]


def test_exchanges_exact_on_two_hosts_horovod(sandbox, tmp_path):
    command = ('HOROVOD_DYNAMIC_PROCESS_SETS=1 .venv/bin/horovodrun -np 4 -H h0:2,h1:2 --gloo '
               '--network-interfaces "$GRAVAC_NICS" --ssh-port "$GRAVAC_SSH_PORT" '
               f'--ssh-identity-file "$GRAVAC_SSH_KEY" bash tests/parallel/run_rank.sh '
               f'{tmp_path}/results {PYTEST}')
    job = sandbox(command, hosts=2, slots=2, link="1gbit")
    assert job.wait() == 0, job.output()[-6000:]
    _passed(job.output(), 4)


def test_exchanges_exact_on_two_hosts_torchrun(sandbox, tmp_path):
    command = ('.venv/bin/torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d '
               '--rdzv-endpoint "$GRAVAC_HOST0_ADDR:29400" --rdzv-id exchanges '
               '--node-rank "$GRAVAC_NODE_RANK" --no-python bash tests/parallel/run_rank.sh '
               f'{tmp_path}/results_$GRAVAC_NODE_RANK {PYTEST}')
    job = sandbox(command, hosts=2, slots=2, link="1gbit", each=True)
    assert job.wait() == 0, job.output()[-6000:]
    _passed(job.output(), 4)
