"""The hierarchical and shared-index exchanges on 4 ranks in one process (thread_comm.py),
each against a reference computed here from the ranks' gradients with torch.topk alone.

Gradients are set by hand (no backward), lr=0, so ``p.grad`` after ``step()`` is the
averaged gradient the exchange produced and ``opt.memory`` the residuals it left.
"""
from __future__ import annotations

import copy
import math

import pytest
import torch

from gravac.controllers import GraVAC, Static
from gravac.engine.exchanges import host_groups
from gravac.engine.optimizer import wrap_optimizer

from thread_comm import run_ranks

N = 4
SHAPES = {"0.weight": (48, 32), "0.bias": (48,), "2.weight": (10, 48), "2.bias": (10,)}
COMPRESSED = ("0.weight", "2.weight")        # min_compress_numel=256 leaves the biases dense


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.ReLU(), torch.nn.Linear(48, 10))


BASE = _model()


def grads_of(rank: int, step: int) -> dict[str, torch.Tensor]:
    """Rank- and step-specific gradients (distinct magnitudes: no Top-k ties)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return {name: torch.randn(shape, generator=g, dtype=torch.float64).float()
            for name, shape in SHAPES.items()}


def run(exchange: str, steps: int = 3, controller=None, hosts=None, compressor="topk",
        bad=None, record=None):
    """Every rank's [(averaged grads, residuals, stats)] per step."""
    def body(comm):
        model = copy.deepcopy(BASE)
        opt = wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.0), model.named_parameters(),
                             comm, compressor=compressor,
                             controller=copy.deepcopy(controller) or Static(cf=10),
                             min_compress_numel=256, exchange=exchange)
        out = []
        for step in range(steps):
            for name, p in model.named_parameters():
                p.grad = grads_of(comm.rank, step)[name].clone()
                if bad is not None and (comm.rank, step) == bad and name == "0.bias":
                    p.grad[3] = float("nan")
            opt.step()
            out.append(({n: p.grad.clone() for n, p in model.named_parameters()},
                        {n: opt.memory[n].clone() for n in COMPRESSED if n in opt.memory},
                        opt.last_stats))
        return out
    return run_ranks(N, body, hosts=hosts)


def k_of(name: str, cf: float = 10) -> int:
    return max(1, math.ceil(math.prod(SHAPES[name]) / cf))


def _top(x: torch.Tensor, k: int) -> torch.Tensor:
    return torch.topk(x.abs().view(-1), k).indices.sort().values


# -- shared index -----------------------------------------------------------------------------
#: Each compressed layer's leader at step 0: the larger layer (0.weight, 1536 entries) goes
#: to rank 0, the next (2.weight, 480) to the least-loaded rank, 1; at step s both move on
#: by s (mod N).
BASE_LEADER = {"0.weight": 0, "2.weight": 1}


def leader_of(name: str, step: int, n_ranks: int = N) -> int:
    return (BASE_LEADER[name] + step) % n_ranks


def test_shared_index_sends_every_rank_values_at_each_layers_leaders_topk():
    result = run("shared_index")
    residual = {r: {n: torch.zeros(SHAPES[n]) for n in COMPRESSED} for r in range(N)}
    for step in range(3):
        g_ef = {r: {n: grads_of(r, step)[n] + residual[r][n] for n in COMPRESSED}
                for r in range(N)}
        for name in COMPRESSED:
            idx = _top(g_ef[leader_of(name, step)][name], k_of(name))
            expected = torch.zeros(math.prod(SHAPES[name]))
            expected[idx] = torch.stack([g_ef[r][name].view(-1)[idx] for r in range(N)]).mean(0)
            for r in range(N):
                grads, memory, _ = result[r][step]
                torch.testing.assert_close(grads[name].view(-1), expected, rtol=0, atol=1e-6)
                left = g_ef[r][name].clone().view(-1)
                left[idx] = 0
                torch.testing.assert_close(memory[name].view(-1), left, rtol=0, atol=0)
                residual[r][name] = left.view(SHAPES[name])
        for name in ("0.bias", "2.bias"):
            mean = torch.stack([grads_of(r, step)[name] for r in range(N)]).mean(0)
            for r in range(N):
                torch.testing.assert_close(result[r][step][0][name], mean, rtol=0, atol=1e-6)


def test_shared_index_counts_values_without_indices_and_traffic_does_not_grow_with_ranks():
    per_rank = []
    for n_ranks in (2, 4):
        stats = run_ranks(n_ranks, lambda comm: _one_step_stats(comm, "shared_index"))
        per_rank.append(stats[0].bytes_sent)
        k = sum(k_of(n) for n in COMPRESSED)
        assert stats[0].values_sent == k
        assert stats[0].floats_sent == k + 48 + 10     # values + the dense biases
    assert per_rank[0] == per_rank[1]


def test_shared_index_leaders_rotate_per_layer_and_spread_the_selection():
    from gravac.compressors import get
    from gravac.engine.exchanges.shared_index import SharedIndexExchange
    from gravac.engine.layers import Layer
    sizes = [100, 2_560_000, 50, 2_560_000, 400, 600]
    layers = [Layer(i, f"l{i}", torch.zeros(1), n, True) for i, n in enumerate(sizes)]
    layers.append(Layer(6, "dense", torch.zeros(1), 10, False))
    compressible = [l for l in layers if l.compressible]
    route = SharedIndexExchange(type("C", (), {"size": 4})(), "gravac", "native", get("topk"))
    # Largest first onto the least-loaded rank: l1 -> 0, l3 -> 1, l5 -> 2, l4 -> 3, l0 -> 3
    # (3 holds 400 against 2's 600), l2 -> 3 (500 against 600).
    assert route.leaders(compressible, 0) == {"l0": 3, "l1": 0, "l2": 3, "l3": 1, "l4": 3,
                                              "l5": 2}
    assert route.leaders(compressible, 5) == {"l0": 0, "l1": 1, "l2": 0, "l3": 2, "l4": 0,
                                              "l5": 3}
    # every rank leads every layer once in N steps
    for name in route.leaders(compressible, 0):
        assert sorted(route.leaders(compressible, s)[name] for s in range(4)) == [0, 1, 2, 3]
    # a world of another size (an elastic reset) spreads again
    route.bind(type("C", (), {"size": 2})())
    assert route.leaders(compressible, 0) == {"l0": 1, "l1": 0, "l2": 1, "l3": 1, "l4": 1,
                                              "l5": 0}

def _one_step_stats(comm, exchange):
    model = copy.deepcopy(BASE)
    opt = wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.0), model.named_parameters(),
                         comm, controller=Static(cf=10), min_compress_numel=256,
                         exchange=exchange)
    for name, p in model.named_parameters():
        p.grad = grads_of(comm.rank, 0)[name].clone()
    opt.step()
    return opt.last_stats


def test_shared_index_gravac_gains_are_measured_at_the_shared_indices_and_agreed():
    ctrl = GraVAC(theta_min=4, theta_max=64, epsilon=0.5, window=2)
    result = run("shared_index", steps=2, controller=ctrl)
    step = 0
    stats = [result[r][step][2] for r in range(N)]
    theta_c = stats[0].theta_c
    assert theta_c is not None and theta_c > 4
    g = {r: grads_of(r, step) for r in range(N)}
    kept = {"min": 0.0, "c": 0.0}
    total = 0.0
    for name in COMPRESSED:
        leader = leader_of(name, step)
        idx_min = _top(g[leader][name], k_of(name, 4))
        vals = g[leader][name].view(-1)[idx_min]
        idx_c = idx_min[_top(vals, k_of(name, theta_c))]
        for r in range(N):
            flat = g[r][name].view(-1)
            kept["min"] += float(flat[idx_min].double().pow(2).sum())
            kept["c"] += float(flat[idx_c].double().pow(2).sum())
            total += float(flat.double().pow(2).sum())
    assert len({(s.sent, s.cf, s.gain_min, s.gain_c) for s in stats}) == 1   # agreed
    assert stats[0].gain_min == pytest.approx(kept["min"] / total, rel=1e-6)
    assert stats[0].gain_c == pytest.approx(kept["c"] / total, rel=1e-6)
    # Whatever level went, every rank holds the same gradients.
    for name in SHAPES:
        for r in range(1, N):
            assert torch.equal(result[r][step][0][name], result[0][step][0][name])


def test_shared_index_random_k_with_a_shared_seed_sends_no_index_round():
    names = []

    def body(comm):
        stats = _one_step_stats_with(comm, "randomk")
        return stats

    import thread_comm
    original = thread_comm.ThreadComm._collective

    def recording(self, kind, name, value, combine):
        if self.rank == 0:
            names.append(name)
        return original(self, kind, name, value, combine)
    thread_comm.ThreadComm._collective = recording
    try:
        run_ranks(N, body)
    finally:
        thread_comm.ThreadComm._collective = original
    assert "gravac.indices" not in names and "gravac.shared" in names


def _one_step_stats_with(comm, compressor):
    model = copy.deepcopy(BASE)
    opt = wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.0), model.named_parameters(),
                         comm, compressor=compressor, controller=Static(cf=10),
                         min_compress_numel=256, exchange="shared_index")
    for name, p in model.named_parameters():
        p.grad = grads_of(comm.rank, 0)[name].clone()
    opt.step()
    return opt.last_stats


@pytest.mark.parametrize("compressor", ["dgc", "redsync"])
def test_shared_index_with_a_threshold_compressor_sends_the_leaders_variable_count(compressor):
    from gravac.compressors import SelectContext, get
    result = run("shared_index", steps=1, compressor=compressor)
    comp = get(compressor)
    for layer_index, name in enumerate(SHAPES):
        if name not in COMPRESSED:
            continue
        leader = leader_of(name, 0)
        flat = grads_of(leader, 0)[name].view(-1)
        idx = comp.select(flat, k_of(name),
                          SelectContext(0, layer_index, leader, 0)).sort().values
        expected = torch.zeros_like(flat)
        expected[idx] = torch.stack([grads_of(r, 0)[name].view(-1)[idx] for r in range(N)]).mean(0)
        for r in range(N):
            torch.testing.assert_close(result[r][0][0][name].view(-1), expected, rtol=0, atol=1e-6)


# -- hierarchical -----------------------------------------------------------------------------
def test_hierarchical_averages_inside_hosts_and_exchanges_topk_across_hosts():
    hosts = [0, 0, 1, 1]
    result = run("hierarchical", hosts=hosts)
    groups = [[0, 1], [2, 3]]
    residual = {h: {n: torch.zeros(SHAPES[n]) for n in COMPRESSED} for h in range(2)}
    for step in range(3):
        for name in SHAPES:
            host_avg = [torch.stack([grads_of(r, step)[name] for r in g]).mean(0) for g in groups]
            if name not in COMPRESSED:
                expected = torch.stack(host_avg).mean(0)
            else:
                expected = torch.zeros(math.prod(SHAPES[name]))
                for h in range(2):
                    e = (host_avg[h] + residual[h][name]).view(-1)
                    idx = _top(e, k_of(name))
                    expected[idx] += e[idx]
                    left = e.clone()
                    left[idx] = 0
                    # The residual lives on the one rank of the host that owns the layer.
                    owners = [r for r in groups[h] if name in result[r][step][1]]
                    assert len(owners) == 1, (name, owners)
                    torch.testing.assert_close(result[owners[0]][step][1][name].view(-1), left,
                                               rtol=0, atol=1e-6)
                    residual[h][name] = left.view(SHAPES[name])
                expected = expected / 2
            for r in range(N):
                torch.testing.assert_close(result[r][step][0][name].view(-1),
                                           expected.view(-1), rtol=0, atol=1e-6)
    # The two weights are in different shards: each rank of a host compresses one, and the
    # same local index owns the same layer on both hosts.
    owned = [sorted(result[r][2][1]) for r in range(N)]
    assert owned[0] == owned[2] and owned[1] == owned[3] and owned[0] != owned[1]
    assert sorted(owned[0] + owned[1]) == sorted(COMPRESSED)
    # Every rank counts the host's values alike; bytes_sent is what it sent across hosts.
    assert len({result[r][0][2].values_sent for r in range(N)}) == 1
    assert all(result[r][0][2].bytes_sent > 0 for r in range(N))


def test_hierarchical_shards_balance_the_layers_of_a_host():
    from gravac.engine.exchanges import shard_layers
    from gravac.engine.layers import Layer
    layers = [Layer(i, f"l{i}", torch.zeros(1), n, True) for i, n in enumerate([10, 40, 30, 20])]
    assert shard_layers(layers, 2) == [0, 0, 1, 1]      # 40+10 | 30+20
    assert shard_layers(layers, 1) == [0, 0, 0, 0]
    assert shard_layers(layers, 5) == [3, 0, 1, 2]     # a shard may be empty


def test_hierarchical_with_one_rank_per_host_is_the_allgather_exchange():
    a = run("hierarchical", hosts=[0, 1, 2, 3])
    b = run("allgather")
    for r in range(N):
        for step in range(3):
            for name in SHAPES:
                assert torch.equal(a[r][step][0][name], b[r][step][0][name])


def test_hierarchical_refuses_hosts_with_different_numbers_of_ranks():
    with pytest.raises(AssertionError, match="same number of ranks on every host"):
        run("hierarchical", steps=1, hosts=[0, 0, 0, 1])
    assert host_groups(type("C", (), {"size": 4})(), [5, 5, 2, 2]) == [[0, 1], [2, 3]]


# -- allgather with coded indices --------------------------------------------------------------
@pytest.mark.parametrize("compressor, controller", [
    ("topk", Static(cf=10)), ("dgc", Static(cf=10)), ("randomk", Static(cf=10)),
    ("topk", GraVAC(theta_min=4, theta_max=64, epsilon=0.3, window=2))])
def test_allgather_coded_is_the_allgather_bit_for_bit_in_fewer_bytes(compressor, controller):
    """The same gradients, residuals and decisions on every rank (only the wire's index
    format differs); every step that sent sparse layers sent fewer bytes."""
    plain = run("allgather", steps=4, compressor=compressor, controller=controller)
    coded = run("allgather_coded", steps=4, compressor=compressor, controller=controller)
    fewer = 0
    for r in range(N):
        for (g0, m0, s0), (g1, m1, s1) in zip(plain[r], coded[r]):
            assert all(torch.equal(g0[n], g1[n]) for n in g0)
            assert all(torch.equal(m0[n], m1[n]) for n in m0) and m0.keys() == m1.keys()
            assert (s0.sent, s0.cf, s0.floats_sent) == (s1.sent, s1.cf, s1.floats_sent)
            if s0.sent != "dense":
                assert s1.bytes_sent < s0.bytes_sent
                fewer += 1
    assert fewer


# -- both -------------------------------------------------------------------------------------
@pytest.mark.parametrize("exchange, hosts", [("shared_index", None), ("hierarchical", [0, 0, 1, 1])])
def test_a_nan_on_one_rank_skips_the_step_everywhere_and_keeps_the_residuals(exchange, hosts):
    clean = run(exchange, steps=3, hosts=hosts)
    nan = run(exchange, steps=3, hosts=hosts, bad=(3, 1))
    for r in range(N):
        assert nan[r][1][2].skipped and nan[r][1][2].nonfinite_ranks == [3]
        # Step 1 skipped: the residuals after it are those after step 0.
        for name, res in nan[r][1][1].items():
            assert torch.equal(res, clean[r][0][1][name])
        assert not nan[r][2][2].skipped


@pytest.mark.parametrize("exchange", ["hierarchical", "shared_index"])
def test_exchanges_refuse_what_they_cannot_carry(exchange):
    from gravac.comm import LocalComm
    model = copy.deepcopy(BASE)
    with pytest.raises(ValueError, match="allreduce already"):
        wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                       LocalComm(), compressor="powersgd", exchange=exchange)
    with pytest.raises(ValueError, match="cannot be combined with overlap=true"):
        wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                       LocalComm(), exchange=exchange, overlap=True)
    with pytest.raises(ValueError, match="exchange='ring': must be one of allgather, allgather_coded"):
        wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                       LocalComm(), exchange="ring")
