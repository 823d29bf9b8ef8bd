"""The transport contract (gravac.comm.Comm) on the launcher's backend: exact results."""
import pytest
import torch

from helpers import COMM, BACKEND


def test_identity(rank, size):
    assert (COMM.rank, COMM.size) == (rank, size) and COMM.backend == BACKEND
    assert 0 <= COMM.local_rank < COMM.local_size <= COMM.size


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_allreduce_sum_and_average_are_exact(rank, size, dtype):
    x = torch.arange(6, dtype=dtype) * (rank + 1)
    total = COMM.allreduce(x, op="sum", name=f"t.sum.{dtype}")
    assert torch.equal(total, torch.arange(6, dtype=dtype) * sum(range(1, size + 1)))
    assert torch.equal(x, torch.arange(6, dtype=dtype) * (rank + 1))       # input untouched
    if dtype.is_floating_point:
        avg = COMM.allreduce(x, op="average", name=f"t.avg.{dtype}")
        assert torch.equal(avg, total / size)


def test_grouped_allreduce_is_in_place_over_mixed_shapes(rank, size):
    tensors = [torch.full((3, 2), float(rank)), torch.full((5,), 2.0 * rank), torch.ones(1)]
    handle = COMM.grouped_allreduce_async_(tensors, op="average", name="t.grouped")
    handle.wait()
    mean = sum(range(size)) / size
    assert torch.equal(tensors[0], torch.full((3, 2), mean))
    assert torch.equal(tensors[1], torch.full((5,), 2.0 * mean))
    assert torch.equal(tensors[2], torch.ones(1))


def test_allgather_bytes_takes_a_different_size_per_rank_even_zero(rank, size):
    mine = torch.arange(3 * rank, dtype=torch.uint8)           # rank 0 sends nothing
    gathered = COMM.allgather_bytes(mine, name="t.bytes")
    assert torch.equal(gathered, torch.cat([torch.arange(3 * r, dtype=torch.uint8)
                                            for r in range(size)]))
    empty = COMM.allgather_bytes(torch.zeros(0, dtype=torch.uint8), name="t.empty")
    assert empty.numel() == 0 and empty.dtype == torch.uint8


def test_allgather_bytes_of_promised_equal_sizes(rank, size):
    mine = torch.full((5,), rank + 1, dtype=torch.uint8)
    gathered = COMM.allgather_bytes(mine, name="t.same", same_size=True)
    assert torch.equal(gathered, torch.cat([torch.full((5,), r + 1, dtype=torch.uint8)
                                            for r in range(size)]))


def test_async_collectives_overlap_and_complete_in_any_wait_order(rank, size):
    a = COMM.allgather_bytes_async(torch.full((rank + 1,), rank, dtype=torch.uint8), name="t.a")
    b = COMM.allreduce_async(torch.tensor([1.0]), op="sum", name="t.b")
    assert torch.equal(b.wait(), torch.tensor([float(size)]))
    assert a.wait().tolist() == [r for r in range(size) for _ in range(r + 1)]


def test_broadcasts_from_any_root(rank, size):
    root = size - 1
    t = torch.full((4,), float(rank))
    COMM.broadcast_(t, root=root, name="t.bcast")
    assert torch.equal(t, torch.full((4,), float(root)))
    obj = COMM.broadcast_object({"rank": rank, "data": [rank] * 3}, name="t.obj", root=root)
    assert obj == {"rank": root, "data": [root] * 3}
    assert COMM.allgather_object(("r", rank), name="t.gobj") == [("r", r) for r in range(size)]


def test_broadcast_parameters_gives_every_rank_rank0s_model(rank):
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    COMM.broadcast_parameters(model.state_dict())
    states = COMM.allgather_object(model.state_dict(), name="t.states")
    for key, value in states[0].items():
        assert torch.equal(value, states[1][key]), key


def test_subgroups_reduce_among_their_members_only(rank, size):
    groups = [COMM.subgroup([r], name=f"t.solo{r}") for r in range(size)]
    mine = [g for g in groups if g is not None]
    assert len(mine) == 1 and (mine[0].rank, mine[0].size) == (0, 1)
    solo = mine[0].allreduce(torch.tensor([float(rank)]), op="sum", name="t.solo")
    assert solo.item() == rank
    # Roots are ranks of the sub-group (Horovod wants global ones: the Comm translates).
    t = torch.tensor([float(rank)])
    mine[0].broadcast_(t, root=0, name="t.solo.bcast")
    assert t.item() == rank
    assert mine[0].broadcast_object({"rank": rank}, name="t.solo.obj") == {"rank": rank}
    pair = COMM.subgroup(list(range(size))[::-1], name="t.all")     # members in rank order
    assert pair is not None and (pair.rank, pair.size) == (rank, size)
    total = pair.allreduce(torch.tensor([1.0]), op="sum", name="t.pair")
    assert total.item() == size
    with pytest.raises(ValueError, match="outside"):
        COMM.subgroup([size], name="t.bad")


def test_a_rank_waiting_for_a_late_one_leaves_the_core_free(rank, size):
    """Rank 0 arrives 1.2 s late; the others' main threads must sleep meanwhile, not spin
    (Horovod's own synchronize yields in a loop: a whole core; gravac's "sleep" wait polls
    and sleeps).
    CPU time of the waiting thread, not wall time: a loaded machine cannot fail it."""
    import time

    if BACKEND == "horovod":
        # what run.horovod_wait "auto" picks where ranks outnumber cores; here 2 ranks on 2
        # cores would keep Horovod's loop
        from gravac.comm.horovod import set_wait_mode, wait_mode
        before = wait_mode()
        set_wait_mode("sleep", "test")
    COMM.barrier(name="t.late.start")
    cpu0 = time.thread_time()
    if rank == 0:
        time.sleep(1.2)
    COMM.allreduce(torch.zeros(1), op="sum", name="t.late")
    cpu = torch.tensor([time.thread_time() - cpu0])
    if BACKEND == "horovod":
        set_wait_mode(*before)
    every = COMM.allgather_bytes(cpu.view(torch.uint8), name="t.late.cpu").view(torch.float32)
    waiters = every[1:].tolist()
    assert max(waiters) < 0.3, f"waiting ranks used {waiters} s of CPU in a 1.2 s wait"
