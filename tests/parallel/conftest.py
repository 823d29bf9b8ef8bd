"""Parallel tests run on 2 ranks under either launcher, the same tests on both:

    horovodrun -np 2 -H localhost:2 --gloo python -m pytest tests/parallel
    torchrun --nproc-per-node 2 -m pytest tests/parallel

(``tests/run.sh parallel`` runs both.) Every rank runs the same tests in the same order,
so collectives line up. Tests compute everything collectively first and assert
afterwards, on data both ranks share where they can, so that a failure fails on every
rank instead of leaving one waiting.
"""
import pytest

from gravac.comm import end_process
from helpers import BACKEND, COMM


def pytest_configure(config):
    if COMM.size < 2:
        raise pytest.UsageError("tests/parallel must run on at least 2 ranks: make test-parallel "
                                "(or horovodrun -np 2 -H localhost:2 --gloo python -m pytest "
                                "tests/parallel, or torchrun --nproc-per-node 2 -m pytest "
                                "tests/parallel)")
    config.addinivalue_line("markers", "horovod_only: needs Horovod (e.g. Horovod Elastic)")


_exit_status = {}


def pytest_sessionfinish(session, exitstatus):
    _exit_status["code"] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    # Every rank, after its last test and the reports: torch.distributed's group ends in
    # order (a barrier, then destroy_process_group), not by exit order; under Horovod
    # nothing happens. Then the process ends as train.py does: after gloo, without the
    # interpreter's finalization (gravac/comm/process_exit.py).
    COMM.close()
    if "code" in _exit_status:
        end_process(_exit_status["code"])


def pytest_collection_modifyitems(config, items):
    if BACKEND != "horovod":
        skip = pytest.mark.skip(reason=f"Horovod only; this run uses the {BACKEND} transport")
        for item in items:
            if "horovod_only" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def comm():
    return COMM


@pytest.fixture
def backend():
    return BACKEND


@pytest.fixture
def rank():
    return COMM.rank


@pytest.fixture
def size():
    return COMM.size


@pytest.fixture
def shared_tmp(tmp_path):
    """A temporary directory that every rank sees (rank 0's, broadcast)."""
    return COMM.broadcast_object(str(tmp_path), name="test.shared_tmp")
