"""Parallel tests run under ``horovodrun -np 2 -H localhost:2 --gloo python -m pytest``.

Every rank runs the same tests in the same order, so collectives line up. Tests compute
everything collectively first and assert afterwards, on data both ranks share where they
can, so that a failure fails on every rank instead of leaving one waiting.
"""
import horovod.torch as hvd
import pytest
import torch

hvd.init()
torch.set_num_threads(1)


def pytest_configure(config):
    if hvd.size() < 2:
        raise pytest.UsageError("tests/parallel must run under horovodrun with at least 2 ranks: "
                                "make test-parallel (or horovodrun -np 2 -H localhost:2 --gloo "
                                "python -m pytest tests/parallel)")


@pytest.fixture
def rank():
    return hvd.rank()


@pytest.fixture
def size():
    return hvd.size()


@pytest.fixture
def shared_tmp(tmp_path):
    """A temporary directory that every rank sees (rank 0's, broadcast)."""
    return hvd.broadcast_object(str(tmp_path), root_rank=0, name="test.shared_tmp")
