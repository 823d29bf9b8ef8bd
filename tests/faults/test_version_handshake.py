"""A job whose ranks run different gravacs stops at its first collective, in one line naming
the hosts and both versions, under both launchers; a rank that never joins the handshake
(a gravac from before it, which starts with other collectives) is not waited for forever.

Rank 1 of each job plays the other install: its source hash is replaced, or it starts its
transport and then does something else than the handshake, as an older gravac would. Every
launch of the parallel suites passes the handshake with equal records."""
import subprocess

import pytest

from jobs import HOROVODRUN, LAUNCHERS, PYTHON, REPO, TORCHRUN

JOB = """
import os, sys, time
import gravac.comm, gravac.comm.handshake as handshake
rank = int(os.environ.get("HOROVOD_RANK", os.environ.get("RANK", "0")))
if rank == 1 and sys.argv[1] == "other":
    handshake.source_id = lambda: "0123456789ab"          # an edited copy of gravac
if rank == 1 and sys.argv[1] == "absent":                  # a gravac from before the handshake
    if "HOROVOD_RANK" in os.environ:
        import horovod.torch as hvd
        hvd.init()
    else:
        import torch.distributed as dist
        dist.init_process_group("gloo")
    time.sleep(600)
try:
    comm = gravac.comm.init("auto", handshake_timeout_s=float(sys.argv[2]))
except gravac.comm.VersionMismatch as exc:
    print(f"rank {rank} refused: {exc}", flush=True)
    sys.exit(7)
print(f"rank {rank} joined", flush=True)
comm.close()
"""


def _run(launcher: str, mode: str, timeout_s: float) -> subprocess.CompletedProcess:
    script = ["-c", JOB, mode, str(timeout_s)]
    cmd = ([HOROVODRUN, "-np", "2", "-H", "localhost:2", "--gloo", PYTHON, *script]
           if launcher == "horovodrun" else
           [TORCHRUN, "--standalone", "--nproc-per-node", "2", "--no-python", PYTHON, *script])
    # The timeout guards a broken set-up; it is not a speed limit.
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_another_gravac_on_one_rank_is_refused_in_one_line_naming_both():
    # (torchrun's records travel by its store, Horovod's by an allgather: the parallel
    # suites pass Horovod's with equal records, the test below its timeout.)
    from gravac.comm.handshake import describe

    job = _run("torchrun", "other", 60)
    assert job.returncode != 0
    lines = [ln for ln in job.stdout.splitlines() if "refused: gravac's version handshake" in ln]
    assert lines, job.stdout[-3000:] + job.stderr[-3000:]
    text = "\n".join(lines)
    assert "(source 0123456789ab) on " in text and describe() in text


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_rank_that_never_joins_is_not_waited_for_forever(launcher):
    job = _run(launcher, "absent", 3)
    assert job.returncode != 0
    assert "rank 0 refused: gravac's version handshake: not every rank joined within 3s" \
        in job.stdout, job.stdout[-3000:] + job.stderr[-3000:]
