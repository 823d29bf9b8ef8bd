"""Residual memory: residual = g_ef − sent, in place, with a state dict."""
import pytest
import torch

from gravac.memory import ResidualMemory, SparseSent


def test_error_feedback_sparse_dense_and_none():
    mem = ResidualMemory()
    g1 = torch.tensor([[1.0, -2.0], [3.0, 0.5]])
    g_ef = mem.compensate("w", g1)
    assert torch.equal(g_ef, g1.view(-1))  # residual starts at zero
    idx = torch.tensor([2])
    mem.update("w", g_ef, SparseSent(idx, g_ef[idx]))
    assert torch.equal(mem["w"], torch.tensor([[1.0, -2.0], [0.0, 0.5]]))
    assert mem["w"].shape == g1.shape

    g2 = torch.ones(2, 2)
    g_ef = mem.compensate("w", g2)
    assert torch.equal(g_ef, torch.tensor([2.0, -1.0, 1.0, 1.5]))
    sent = torch.tensor([2.0, 0.0, 0.0, 1.5])
    mem.update("w", g_ef, sent)                      # dense equivalent of what was sent
    assert torch.equal(mem["w"].view(-1), torch.tensor([0.0, -1.0, 1.0, 0.0]))

    g_ef = mem.compensate("w", g2)
    mem.update("w", g_ef, None)                      # everything sent (dense fallback)
    assert torch.equal(mem["w"], torch.zeros(2, 2))


def test_update_with_external_g_ef_and_errors():
    mem = ResidualMemory()
    with pytest.raises(KeyError, match="before compensate"):
        mem.update("a", torch.zeros(3), None)
    mem.compensate("a", torch.zeros(3))
    mem.update("a", torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 0.0, 0.0]))
    assert torch.equal(mem["a"], torch.tensor([0.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="shapes must not change"):
        mem.compensate("a", torch.zeros(4))


def test_state_dict_roundtrip_and_validation():
    mem = ResidualMemory()
    g_ef = mem.compensate("a", torch.arange(6.0).view(2, 3))
    mem.update("a", g_ef, SparseSent(torch.tensor([5]), g_ef[torch.tensor([5])]))
    state = mem.state_dict()
    other = ResidualMemory()
    other.load_state_dict(state)
    assert torch.equal(other["a"], mem["a"]) and other["a"].shape == (2, 3)
    state["residuals"]["a"].add_(1)  # the state dict is a copy, not a view
    assert torch.equal(other["a"], mem["a"])
    with pytest.raises(ValueError, match="residuals"):
        other.load_state_dict({"a": torch.zeros(1)})
    bad = {"residuals": {"a": torch.zeros(7)}}
    with pytest.raises(ValueError, match="shape"):
        mem.load_state_dict(bad)
    mem.reset()
    assert float(mem["a"].abs().sum()) == 0.0


def test_flush_into_equals_compensate_copy_update_and_skips_zero_residuals():
    for dtype in (torch.float32, torch.float16):
        a, b = ResidualMemory(), ResidualMemory()
        g0 = torch.tensor([0.3, -1.7, 2.2, 0.01], dtype=dtype)
        for mem in (a, b):                              # leave a residual behind
            g_ef = mem.compensate("w", g0)
            mem.update("w", g_ef, SparseSent(torch.tensor([1]), g_ef[torch.tensor([1])]))
        g_a = torch.tensor([1.1, 0.2, -0.4, 3.0], dtype=dtype)
        g_b = g_a.clone()
        a.flush_into("w", g_a)
        g_ef = b.compensate("w", g_b)                   # the long way round
        g_b.view(-1).copy_(g_ef)
        b.update("w", g_ef, None)
        assert torch.equal(g_a, g_b) and torch.equal(a["w"], b["w"])
        assert float(a["w"].abs().sum()) == 0.0
        again = g_a.clone()
        a.flush_into("w", again)                        # residual zero: nothing changes
        assert torch.equal(again, g_a)
    fresh = ResidualMemory()
    g = torch.ones(3)
    fresh.flush_into("new", g)                          # no residual yet: created as zeros
    assert torch.equal(g, torch.ones(3)) and torch.equal(fresh["new"], torch.zeros(3))
    g_ef = fresh.compensate("new", g)                   # and error feedback works after it
    assert torch.equal(g_ef, torch.ones(3))


def test_loaded_residuals_follow_their_parameters_device_and_dtype():
    # A checkpoint read with map_location="cpu" must resume on the parameter's device (a GPU
    # in production; the meta device stands in for it here) and precision.
    saved = ResidualMemory()
    g_ef = saved.compensate("w", torch.arange(6, dtype=torch.float32))
    saved.update("w", g_ef, torch.zeros(6))             # nothing sent: residual = g_ef
    state = saved.state_dict()
    on_meta = ResidualMemory()
    on_meta.load_state_dict(state, like={"w": torch.empty(2, 3, device="meta")})
    assert on_meta["w"].device.type == "meta" and on_meta["w"].shape == (6,)
    doubled = ResidualMemory()
    doubled.load_state_dict(state, like={"w": torch.zeros(6, dtype=torch.float64)})
    assert doubled["w"].dtype == torch.float64
    assert torch.equal(doubled["w"], torch.arange(6, dtype=torch.float64))
    halved = ResidualMemory()
    halved.load_state_dict(state, like={"w": torch.zeros(6, dtype=torch.bfloat16)})
    assert halved["w"].dtype == torch.float32           # fp16/bf16 residuals stay fp32
    with pytest.raises(ValueError, match="shape"):
        ResidualMemory().load_state_dict(state, like={"w": torch.zeros(7)})


def test_rollback_step_restores_every_residual_the_step_changed():
    memory = ResidualMemory()
    memory.begin_step()
    g_ef = memory.compensate("a", torch.tensor([1.0, -2.0, 3.0]))
    memory.update("a", g_ef, SparseSent(torch.tensor([2]), torch.tensor([3.0])))
    memory.flush_into("b", torch.ones(2))               # created as zeros
    before = {"a": memory["a"].clone(), "b": memory["b"].clone()}
    assert torch.equal(before["a"], torch.tensor([1.0, -2.0, 0.0]))
    # A step that changes both residuals, then is skipped on every rank.
    memory.begin_step()
    g_ef = memory.compensate("a", torch.tensor([10.0, 10.0, 10.0]))
    assert torch.equal(memory["a"], before["a"])        # compensate leaves the residual alone
    memory.update("a", g_ef, None)
    grad_b = torch.full((2,), 5.0)
    g_ef_b = memory.compensate("b", grad_b)
    memory.update("b", g_ef_b, SparseSent(torch.tensor([0]), g_ef_b[:1].clone()))
    assert float(memory["a"].abs().sum()) == 0.0 and torch.equal(memory["b"], torch.tensor([0.0, 5.0]))
    memory.rollback_step()
    assert torch.equal(memory["a"], before["a"]) and torch.equal(memory["b"], before["b"])
    # The zero flag came back too: flushing "b" (zero again) changes nothing.
    grad = torch.full((2,), 7.0)
    memory.flush_into("b", grad)
    assert torch.equal(grad, torch.full((2,), 7.0))
    # And the next step works on the restored residuals.
    memory.begin_step()
    g_ef = memory.compensate("a", torch.zeros(3))
    assert torch.equal(g_ef, before["a"])
    memory.update("a", g_ef, None)
    memory.begin_step()
    memory.rollback_step()                              # nothing since begin_step: no-op
    assert float(memory["a"].abs().sum()) == 0.0


def test_clear_all_zeroes_every_residual_but_a_held_one_and_rolls_back():
    """clear_all is update(name, g_ef, None) of each: the residuals zero (flagged zero, so
    a flush skips them), a held residual untouched, and a rollback restores them all."""
    memory = ResidualMemory()
    memory.begin_step()
    for name, values in (("a", [1.0, -2.0]), ("b", [3.0]), ("c", [4.0, 5.0, 6.0])):
        g_ef = memory.compensate(name, torch.tensor(values))
        memory.update(name, g_ef, SparseSent(torch.tensor([0]), g_ef[:1].clone()))
    before = {n: memory[n].clone() for n in "abc"}
    memory.begin_step(held={"c"})
    g_efs = [memory.compensate(n, torch.ones(len(before[n]))) for n in "abc"]
    assert torch.equal(g_efs[0], torch.tensor([1.0, -1.0]))     # read before the clear
    memory.clear_all(["a", "b", "c"])
    assert torch.equal(memory["a"], torch.zeros(2)) and torch.equal(memory["b"], torch.zeros(1))
    assert torch.equal(memory["c"], before["c"])
    grad = torch.full((2,), 7.0)
    memory.flush_into("a", grad)                                # zero: nothing added
    assert torch.equal(grad, torch.full((2,), 7.0))
    memory.rollback_step()
    assert all(torch.equal(memory[n], before[n]) for n in "abc")
    with pytest.raises(KeyError, match="clear_all"):
        memory.clear_all(["never"])


def test_memory_iterates_like_a_mapping_of_residuals():
    mem = ResidualMemory()
    for name, n in (("a", 3), ("b", 2)):
        mem.update(name, mem.compensate(name, torch.full((n,), 2.0)), torch.ones(n))
    assert list(mem) == mem.keys() == mem.names() == ["a", "b"]
    assert [(n, r.tolist()) for n, r in mem.items()] == [("a", [1.0] * 3), ("b", [1.0] * 2)]
