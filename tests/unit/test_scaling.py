"""The cost model, the package benchmarks/scaling/ (docs/SCALING.md): the α-β formulas on
small cases computed by hand, the byte counts against gravac's own codec for every exchange
(the model and the engine share gravac/util/sizes.py, which imports no torch), the fits,
the crossover rule θ > N, the properties the doc relies on (shared_index independent of N,
hierarchical with one rank per host = allgather), and every subcommand on tiny synthetic
inputs. Subprocess timeouts are hang guards, not speed limits."""
from __future__ import annotations

import ast
import dataclasses
import importlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from bench_module import load_benchmark

from gravac.util import sizes
from gravac.engine.options import EXCHANGE_KINDS

REPO = Path(__file__).resolve().parents[2]
S = load_benchmark("scaling")

PY = str(REPO / ".venv/bin/python") if (REPO / ".venv/bin/python").exists() else sys.executable
HANG_GUARD = 600

# Two compressed layers (2000 and 3000 elements) and a 10-element bias that goes dense.
TINY = S.ModelShapes.from_params([("w1", (40, 50)), ("w2", (30, 100)), ("b", (10,))],
                                 min_compress_numel=1024, name="tiny")
A, B = 1e-5, 1e-8
LINK = S.Link(A, B)


def approx(x):
    return pytest.approx(x, rel=1e-12, abs=1e-18)


def run_cli(*args, cwd=REPO):
    """``python benchmarks/scaling ARGS`` (the package's folder: runs from any directory)."""
    return subprocess.run([PY, str(REPO / "benchmarks/scaling"), *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=HANG_GUARD)


# -- formulas ---------------------------------------------------------------------------------
def test_collective_formulas_by_hand():
    # ring allreduce: 2(N-1)α + 2(N-1)/N·B·β = 6α + 1.5·1000·β
    assert S.ring_allreduce_time(1000, 4, LINK) == approx(6 * A + 1500 * B)
    # ring allgather, each rank B: (N-1)α + (N-1)·B·β
    assert S.ring_allgather_time(1000, 4, LINK) == approx(3 * A + 3000 * B)
    # binomial broadcast: ceil(log2 N)·(α + Bβ)
    assert S.broadcast_time(1000, 4, LINK) == approx(2 * (A + 1000 * B))
    assert S.broadcast_time(1000, 5, LINK) == approx(3 * (A + 1000 * B))
    for f in (S.ring_allreduce_time, S.ring_allgather_time, S.broadcast_time):
        assert f(1000, 1, LINK) == 0.0          # one rank sends nothing
        assert f(0, 8, LINK) == 0.0             # no bytes: no collective
    assert S.Link.from_gbit(1, 0).beta_s_per_byte == pytest.approx(8e-9)
    assert S.Link.from_gbit(10, 0).gbit_per_s == pytest.approx(10)


def test_byte_counts_match_gravacs_codec_and_num_kept():
    from gravac.compressors import num_kept
    from gravac.engine.codec import SparseCodec, SparseLayer

    for theta in (10, 7, 1000, 1.5):
        assert TINY.kept(theta) == [num_kept(n, theta) for n in (2000, 3000)]
    codec = SparseCodec([SparseLayer("w1", 2000, torch.float32),
                         SparseLayer("w2", 3000, torch.float32)])
    for theta in (10, 100, 3):
        sel = [(torch.zeros(num_kept(n, theta)), torch.arange(num_kept(n, theta)))
               for n in (2000, 3000)]
        buffer, _ = codec.pack(sel)
        assert TINY.chunk_bytes(theta) == buffer.numel()
    assert sizes.sparse_chunk_bytes([2000, 3000, 1024], [2, 2, 1]) == 8 * 7 + 24 + 24
    # shared_index's byte buffer: 2 int32 counts per layer + each level's field, sized as
    # the engine's codec sizes it
    from gravac.engine.index_codec import plan
    fields = {theta: sum(plan(n, num_kept(n, theta)).nbytes for n in TINY.comp)
              for theta in (10, 100)}
    assert S.index_buffer_bytes(TINY, 10, None) == 8 * 2 + fields[10]
    assert S.index_buffer_bytes(TINY, 10, 100) == 8 * 2 + fields[10] + fields[100]
    assert fields[10] < 4 * 500                  # fewer bytes than int32 indices


def test_powersgd_ranks_match_gravac():
    from gravac.compressors.powersgd import PowerSGD, matrix_shape, rank_for_cf

    ps = PowerSGD()
    for shape in [(100, 300), (40, 50), (64, 3, 3, 3), (1500, 6000)]:
        rows, cols = matrix_shape(shape)
        model = S.ModelShapes.from_params([("w", shape)], min_compress_numel=1)
        for cf in (1, 2, 10, 18.75, 18.76, 75, 1000):
            rank = rank_for_cf(rows, cols, cf)
            assert rank == ps.rank_of(shape, cf)
            lr = model.lowrank(("cf", cf), ("cf", cf))
            assert lr.p_floats == (rows * rank if ps.sends_low_rank(shape, rank) else 0)
    lr = TINY.lowrank(("rank", 1), ("rank", 1))
    assert (lr.p_floats, lr.q_floats, lr.lowrank_numel, lr.dense_numel) == (70, 150, 5000, 10)
    # rank 4 of 40x50 is CF 2000/360 > 1: still low-rank; a 1-D layer never is
    lr4 = TINY.lowrank(("rank", 4), ("rank", 1))       # candidate rank 1: Q has 1 column
    assert (lr4.p_floats, lr4.q_floats, lr4.rank_sum) == (4 * 70, 150, 8)


def test_allgather_step_by_hand():
    layout = S.Layout(1, 4)                      # one host: the "local" link
    net = S.Network(inter=None, local=LINK)
    case = S.StepCase("allgather", theta=10)
    chunk = 8 * (4 + 2) + 4 * 500 + 4 * 500      # K = 200 + 300, no padding needed
    rounds = S.step_rounds(case, TINY, layout)
    assert [[(c.kind, c.group, c.nbytes) for c in r] for r in rounds] == [
        [("allgather", "world", chunk), ("allreduce", "world", 40), ("allreduce", "world", 32)]]
    # the dense layers' and the NaN/Inf flags' allreduces start together: fused
    expect = 3 * A + 3 * chunk * B + 6 * A + 1.5 * (40 + 32) * B
    assert S.comm_time(case, TINY, layout, net) == approx(expect)
    assert S.recorded_bytes(case, TINY, layout) == chunk + 40
    # GraVAC: a gains round first (3 sums + 4 flags as float64), no separate flags
    gravac = S.StepCase("allgather", theta=10, gains=True)
    assert S.comm_time(gravac, TINY, layout, net) == approx(
        6 * A + 1.5 * 56 * B + 3 * A + 3 * chunk * B + 6 * A + 1.5 * 40 * B)


def test_dense_fp16_shared_index_powersgd_by_hand():
    layout = S.Layout(2, 1)                      # two hosts: the "inter" link
    net = S.Network(inter=LINK, local=None)
    n = TINY.n_total
    assert S.comm_time(S.StepCase("dense"), TINY, layout, net) == approx(2 * A + 4 * n * B)
    assert S.comm_time(S.StepCase("fp16"), TINY, layout, net) == approx(2 * A + 2 * n * B)
    si = S.StepCase("shared_index", theta=10)
    index = S.index_buffer_bytes(TINY, 10, None)
    # round 1: indices (allreduce as broadcast); round 2: values + dense + flags, fused
    assert S.comm_time(si, TINY, layout, net) == approx(
        2 * A + index * B + 2 * A + (4 * 500 + 40 + 16) * B)
    assert S.recorded_bytes(si, TINY, layout) == 40 + 4 * 500 + index
    ps = S.StepCase("powersgd", rank=1)
    # flags (own round), P (4·70 bytes), Q (4·150) + dense (40) fused
    assert S.comm_time(ps, TINY, layout, net) == approx(
        2 * A + 16 * B + 2 * A + 280 * B + 2 * A + 640 * B)
    assert S.recorded_bytes(ps, TINY, layout) == 280 + 600 + 40


def test_allgather_coded_by_hand():
    """allgather_coded: the allgather's rounds, its chunk with each layer's indices in the
    coded field ``sizes.index_field_bytes`` gives (here L = 8: a block count per 256
    entries, a byte per index)."""
    layout = S.Layout(1, 4)
    net = S.Network(inter=None, local=LINK)
    case = S.StepCase("allgather_coded", theta=10)
    fields = (16 + 200) + (24 + 304)               # w1: 8 blocks, 200 lows; w2: 12, 300
    assert [sizes.index_field_bytes(n, k) for n, k in zip(TINY.comp, TINY.kept(10))] == \
        [16 + 200, 24 + 304]
    chunk = 8 * (4 + 2) + 4 * 500 + fields
    assert TINY.chunk_bytes(10, coded=True) == chunk < TINY.chunk_bytes(10)
    rounds = S.step_rounds(case, TINY, layout)
    assert [[(c.kind, c.group, c.nbytes) for c in r] for r in rounds] == [
        [("allgather", "world", chunk), ("allreduce", "world", 40), ("allreduce", "world", 32)]]
    assert S.comm_time(case, TINY, layout, net) == approx(
        3 * A + 3 * chunk * B + 6 * A + 1.5 * (40 + 32) * B)
    assert S.recorded_bytes(case, TINY, layout) == chunk + 40
    # a GraVAC step sent dense: the allgather's dense step, nothing coded
    dense = S.StepCase("allgather_coded", theta=1.0, theta_min=10, sent="dense", gains=True)
    plain = dataclasses.replace(dense, exchange="allgather")
    assert S.comm_time(dense, TINY, layout, net) == S.comm_time(plain, TINY, layout, net)
    assert S.recorded_bytes(dense, TINY, layout) == S.recorded_bytes(plain, TINY, layout)
    # its local work: the coded pipeline's fit where measured, else the allgather's
    costs = S.CompressionCosts(pipeline=(1.0, 2.0, 3.0, 4.0, 5.0), select=(6.0, 7.0, 8.0),
                               check=(16.0, 17.0))
    coded_costs = dataclasses.replace(costs, pipeline_coded=(1.5, 2.5, 3.5, 4.5, 5.5))
    ag = S.StepCase("allgather", theta=10)
    assert S.local_time(case, TINY, layout, costs) == S.local_time(ag, TINY, layout, costs)
    assert S.local_time(case, TINY, layout, coded_costs) == \
        S.local_time(ag, TINY, layout, dataclasses.replace(costs, pipeline=(1.5, 2.5, 3.5,
                                                                            4.5, 5.5)))
    assert coded_costs.scaled(2.0).pipeline_coded == (3.0, 5.0, 7.0, 9.0, 11.0)


def _topk_selection(numel: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(numel, generator=g)
    idx = torch.topk(x.abs(), k).indices
    return x[idx], idx


@pytest.mark.parametrize("theta", [1.5, 3, 10, 100, 1000])
def test_engine_bytes_equal_the_models_for_every_exchange(theta):
    """What the engine packs (SparseCodec, plain and with index_coding; shared_index's
    index fields by index_codec.plan) is, byte for byte, what the model prices for every
    exchange kind of the engine's list."""
    from gravac.compressors import num_kept
    from gravac.engine.codec import SparseCodec, SparseLayer
    from gravac.engine.index_codec import plan

    shapes = [("emb", (300, 500)), ("w", (70, 1000)), ("v", (3, 1030)), ("b", (100,))]
    model = S.ModelShapes.from_params(shapes, name="mixed")
    layers = [SparseLayer(n, math.prod(s), torch.float32) for n, s in shapes
              if math.prod(s) >= 1024]
    selection = [_topk_selection(l.numel, num_kept(l.numel, theta), i)
                 for i, l in enumerate(layers)]
    layout = S.Layout(2, 2)
    packed = {coded: SparseCodec(layers, index_coding=coded).pack(selection)[0].numel()
              for coded in (False, True)}
    assert packed[True] < packed[False] or theta < 3     # coded indices: fewer bytes
    for kind in EXCHANGE_KINDS:
        case = S.StepCase(kind, theta=theta)
        recorded = S.recorded_bytes(case, model, layout)
        if kind in ("allgather", "allgather_coded", "hierarchical"):
            chunk = packed[kind == "allgather_coded"]
            assert model.chunk_bytes(theta, coded=kind == "allgather_coded") == chunk
            sparse = [c for r in S.step_rounds(case, model, layout) for c in r
                      if c.what == "sparse"]
            assert [c.nbytes for c in sparse] == [chunk]
            assert recorded == chunk + 4 * model.n_dense
        else:
            index = 8 * len(layers) + sum(plan(l.numel, int(i.numel())).nbytes
                                          for l, (_, i) in zip(layers, selection))
            assert S.index_buffer_bytes(model, theta, None) == index
            assert recorded == index + 4 * sum(int(i.numel()) for _, i in selection) \
                + 4 * model.n_dense
    assert set(EXCHANGE_KINDS) <= set(S.EXCHANGES)


def test_hierarchical_by_hand():
    layout = S.Layout(2, 2)
    local, inter = S.Link(1e-6, 1e-10), LINK
    net = S.Network(inter=inter, local=local)
    case = S.StepCase("hierarchical", theta=10)
    n, chunk = TINY.n_total, 8 * 6 + 4000
    expect = (local.alpha_s * 2 + 4 * n * local.beta_s_per_byte         # host average, S=2
              + inter.alpha_s + chunk * B                               # leaders' allgather
              + 2 * A + 40 * B                                          # leaders' dense
              + 6 * A + 1.5 * 32 * B                                    # flags, all 4 ranks
              + local.alpha_s + 4 * n / 2 * local.beta_s_per_byte)      # host share
    assert S.comm_time(case, TINY, layout, net) == approx(expect)


@pytest.mark.parametrize("gains", [False, True])
@pytest.mark.parametrize("theta", [3, 10, 100])
def test_hierarchical_with_one_rank_per_host_is_allgather(gains, theta):
    net = S.Network(inter=S.Link(2e-5, 8e-10), local=S.Link(1e-6, 4e-11))
    costs = S.CompressionCosts(pipeline=(1e-5, 1e-9, 2e-8, 3e-9, 1e-6), select=(1e-6, 1e-9, 1e-8),
                               norm=1e-10, copy=2e-10, check=(1e-6, 1e-10))
    for n in (2, 4, 32, 1024):
        layout = S.Layout(n, 1)
        ag = S.StepCase("allgather", theta=theta, gains=gains)
        hi = S.StepCase("hierarchical", theta=theta, gains=gains)
        assert S.comm_time(hi, TINY, layout, net) == approx(S.comm_time(ag, TINY, layout, net))
        assert S.local_time(hi, TINY, layout, costs) == approx(
            S.local_time(ag, TINY, layout, costs))


def test_local_time_by_hand():
    costs = S.CompressionCosts(pipeline=(1.0, 2.0, 3.0, 4.0, 5.0), select=(6.0, 7.0, 8.0),
                               norm=9.0, copy=10.0, cast=11.0, powersgd=(12.0, 13.0, 14.0, 15.0),
                               check=(16.0, 17.0))
    layout = S.Layout(1, 4)
    n, check = TINY.n_total, 16 * 3 + 17 * TINY.n_total
    assert S.local_time(S.StepCase("dense"), TINY, layout, costs) == 0.0
    assert S.local_time(S.StepCase("fp16"), TINY, layout, costs) == 11.0 * n
    # allgather, θmin 10 with a candidate at 100 sent, GraVAC's norms, 4 chunks to unpack
    case = S.StepCase("allgather", theta=100, theta_min=10, theta_c=100, gains=True)
    expect = (check + 1 * 2 + 2 * 5000 + 3 * 500 + 6 * 2 + 7 * 500 + 8 * 50 + 9 * 5000
              + 4 * 4 * 50 + 5 * 4)
    assert S.local_time(case, TINY, layout, costs) == expect
    # shared_index: the step waits for the leader of the largest share of the selection,
    # here the rank that leads w2 (3000 of 5000 entries), not for all of it
    shared = S.StepCase("shared_index", theta=10)
    select = 6 * 2 + 7 * 5000 + 8 * 500
    assert S.local_time(shared, TINY, layout, costs) == approx(
        check + 2 + 2 * 5000 + 3 * 500 + 4 * 500 + 5 - (1 - 0.6) * select)
    ps = S.StepCase("powersgd", rank=4)
    assert S.local_time(ps, TINY, layout, costs) == \
        check + 12 * 2 + 13 * 8 + 14 * 5000 + 15 * 4 * 5000
    scaled = costs.scaled(2.0)
    assert S.local_time(case, TINY, layout, scaled) == 2 * expect
    # shared_index's leaders select both levels while the others wait: the largest share
    # (0.6) of that (the select fit over 5000 at 500, then over 500 at 50) at the solo
    # costs, here 3x
    leader = 6 * 2 + 7 * 5000 + 8 * 500 + 6 * 2 + 7 * 500 + 8 * 50
    two_level = S.StepCase("shared_index", theta=100, theta_min=10, theta_c=100, gains=True)
    plain = S.local_time(two_level, TINY, layout, costs)
    assert S.local_time(two_level, TINY, layout, costs, solo=costs.scaled(3.0)) == \
        approx(plain + 0.6 * 2 * leader)
    assert S.local_time(two_level, TINY, S.Layout(1, 1), costs, solo=costs.scaled(3.0)) == \
        approx(S.local_time(two_level, TINY, S.Layout(1, 1), costs) + 2 * leader)
    # Random-k with a shared seed has no leader: every rank draws the indices itself
    seeded = dataclasses.replace(two_level, shared_selection=True)
    assert S.local_time(seeded, TINY, layout, costs, solo=costs.scaled(3.0)) == \
        S.local_time(seeded, TINY, layout, costs)


def test_doctests():
    import doctest

    for name in S.MODULES:
        module = importlib.import_module(f"benchmarks.scaling.{name}")
        assert doctest.testmod(module).failed == 0, name
    assert doctest.testmod(sizes).failed == 0


def test_contention():
    assert S.contention(2, 2) == 1.0
    assert S.contention(4, 2) == 2.0
    assert S.contention(1, 2) == 1.0


# -- fits -------------------------------------------------------------------------------------
def _synthetic_points(link, kinds=("allreduce", "allgather", "broadcast"), ns=(2, 4, 8),
                      noise=0.0):
    pts = []
    for i, (kind, n, b) in enumerate((k, n, b) for k in kinds for n in ns
                                     for b in (8, 512, 32768, 1 << 21, 1 << 25)):
        wobble = 1.0 + noise * (1 if i % 2 else -1)
        pts.append((kind, n, b, link.time(S.collective_terms(kind, b, n)) * wobble))
    return pts


def test_fit_recovers_alpha_beta():
    truth = S.Link(37e-6, 1 / 117e6)
    link, quality = S.fit_link(_synthetic_points(truth))
    assert link.alpha_s == pytest.approx(truth.alpha_s, rel=1e-6)
    assert link.beta_s_per_byte == pytest.approx(truth.beta_s_per_byte, rel=1e-6)
    assert quality["max_rel_err"] < 1e-6
    # one group size only (N fixed): α and β still separate (latency vs bytes)
    link, _ = S.fit_link(_synthetic_points(truth, kinds=("allreduce",), ns=(4,)))
    assert link.alpha_s == pytest.approx(truth.alpha_s, rel=1e-6)
    # ±3% measurement noise moves them little
    link, quality = S.fit_link(_synthetic_points(truth, noise=0.03))
    assert link.alpha_s == pytest.approx(truth.alpha_s, rel=0.1)
    assert link.beta_s_per_byte == pytest.approx(truth.beta_s_per_byte, rel=0.1)
    assert quality["max_rel_err"] < 0.07


def test_least_squares_keeps_coefficients_nonnegative():
    # y = 2x exactly with a spurious negative intercept pull: the intercept is fixed at 0
    coef = S.least_squares([[1, 1], [1, 2], [1, 3]], [1.9, 4.0, 6.1])
    assert coef[0] >= 0 and coef[1] == pytest.approx(2, rel=0.1)


def _collectives_doc(hosts, slots, inter, local):
    """What collectives.py writes, from known links."""
    groups = {}
    layout = S.Layout(hosts, slots)
    for label in ("world", "host", "leaders"):
        if label != "world" and (hosts < 2 or slots < 2):
            continue
        _, ranks, scope = layout.group(label)
        link = inter if scope == "inter" else local
        ops = {}
        for op, kind in S.OP_KIND.items():
            rows = []
            for b in (8, 4096, 1 << 20, 1 << 24):
                each = max(1, b // ranks) if op == "allgather" else b
                t = link.time(S.collective_terms(kind, each, ranks))
                rows.append({"bytes": each, "median_s": t, "samples_s": [t]})
            ops[op] = rows
        groups[label] = {"ranks": ranks, "scope": scope,
                         "instances": hosts if label == "host" else 1, "ops": ops}
    return {"kind": "gravac.scaling.collectives", "backend": "horovod", "n": hosts * slots,
            "hosts": hosts, "slots": slots, "link": "1gbit", "groups": groups}


def test_calibrate_separates_the_links():
    inter, local = S.Link(50e-6, 8e-9), S.Link(5e-6, 4e-10)
    cal = S.calibrate([_collectives_doc(2, 2, inter, local)])
    for kind in S.COLLECTIVES:
        assert cal["links"]["inter"][kind]["alpha_s"] == pytest.approx(inter.alpha_s, rel=1e-6)
        assert cal["links"]["local"][kind]["beta_s_per_byte"] == pytest.approx(
            local.beta_s_per_byte, rel=1e-6)
    net = S.Network.from_calibration(cal)
    assert net.link("inter", "allgather").alpha_s == pytest.approx(inter.alpha_s, rel=1e-6)
    # a fit per group size too: world (4 ranks) and leaders (2) on the inter link
    assert set(cal["by_ranks"]["inter"]["allreduce"]) == {"2", "4"}
    assert net.link("inter", "allreduce", 4).beta_s_per_byte == pytest.approx(
        inter.beta_s_per_byte, rel=1e-6)


def test_calibration_prefers_the_fit_of_the_group_size():
    # Horovod-like: a constant 5 ms per collective, whatever N; per-size fits keep it
    doc = _collectives_doc(2, 2, S.Link(0, 8e-9), S.Link(0, 4e-10))
    for group in doc["groups"].values():
        for rows in group["ops"].values():
            for row in rows:
                row["median_s"] += 5e-3
    net = S.Network.from_calibration(S.calibrate([doc]))
    for n in (2, 4):
        t = net.time("allreduce", 8, n, "inter")
        assert t == pytest.approx(5e-3, rel=0.01)


def _lockstep_doc(step_factor, own_factor, sync):
    """collectives.py's merged lockstep rows for known factors."""
    return {kind: {"unit_s": [1e-3], "rows": [
        {"work_s": w, "step_s": sync + step_factor[kind] * w, "own_s": own_factor[kind] * w}
        for w in (0.0, 0.05, 0.1, 0.2)]} for kind in ("gemm", "stream")}


def test_calibrate_fits_the_lockstep_steps():
    doc = _collectives_doc(2, 2, S.Link(50e-6, 8e-9), S.Link(5e-6, 4e-10))
    doc["lockstep"] = _lockstep_doc({"gemm": 2.5, "stream": 3.25}, {"gemm": 1.75, "stream": 2.0},
                                    0.004)
    cal = S.calibrate([doc])
    assert cal["lockstep"]["gemm"]["step_factor"] == pytest.approx(2.5, rel=1e-9)
    assert cal["lockstep"]["gemm"]["sync_s"] == pytest.approx(0.004, rel=1e-9)
    assert cal["lockstep"]["stream"]["own_factor"] == pytest.approx(2.0, rel=1e-9)
    sharing = S.CpuSharing.from_calibration(cal)
    assert sharing.step == pytest.approx({"gemm": 2.5, "stream": 3.25})
    # compute recorded 0.35 s in this layout = 0.2 s alone
    assert sharing.compute_alone(0.35) == pytest.approx(0.2)
    # the lockstep in a file of its own (collectives.py --groups with no group) joins the
    # links' measurement
    links_only = _collectives_doc(2, 2, S.Link(50e-6, 8e-9), S.Link(5e-6, 4e-10))
    lockstep_only = {**links_only, "groups": {}, "lockstep": doc["lockstep"]}
    both = S.calibrate([links_only, lockstep_only])
    assert both["lockstep"] == cal["lockstep"] and both["links"] == cal["links"]
    # several lockstep runs are pooled: each kind's rows fitted together
    again = S.calibrate([doc, lockstep_only])
    assert again["lockstep"]["gemm"]["points"] == 8 and again["lockstep"]["gemm"]["runs"] == 2
    assert again["lockstep"]["gemm"]["step_factor"] == pytest.approx(2.5, rel=1e-9)
    other = {**lockstep_only, "lockstep": _lockstep_doc(
        {"gemm": 1.5, "stream": 3.25}, {"gemm": 1.75, "stream": 2.0}, 0.004)}
    mixed = S.calibrate([doc, other])["lockstep"]["gemm"]
    # the same W in both runs: least squares puts the slope through the runs' means
    assert mixed["step_factor"] == pytest.approx(2.0, rel=1e-9)
    assert mixed["sync_s"] == pytest.approx(0.004, rel=1e-9)
    # a calibration without lockstep rows (older measurements): contention is assumed
    assert S.CpuSharing.from_calibration(S.calibrate([_collectives_doc(
        2, 2, S.Link(50e-6, 8e-9), S.Link(5e-6, 4e-10))])) is None


def test_validate_stretches_cpu_work_by_the_lockstep_factors(tmp_path):
    from gravac.train.config import load_config

    (tmp_path / "c.yaml").write_text(CONFIG)
    model = S.shapes_from_config(load_config([tmp_path / "c.yaml"]))
    cal = {"kind": "gravac.scaling.calibration", "hosts": 1, "slots": 2, "n": 2,
           "links": {"local": {"allreduce": {"alpha_s": 1e-4, "beta_s_per_byte": 1e-9},
                               "allgather": {"alpha_s": 2e-4, "beta_s_per_byte": 1e-9}}},
           "lockstep": {"gemm": {"step_factor": 3.0, "own_factor": 2.0, "sync_s": 0.0},
                        "stream": {"step_factor": 4.0, "own_factor": 2.0, "sync_s": 0.0}}}
    net = S.Network.from_calibration(cal)
    costs = S.CompressionCosts(pipeline=(1e-6, 1e-9, 1e-8, 1e-8, 1e-6), check=(1e-7, 1e-10))
    case = S.StepCase("allgather", theta=10)
    # the run records compute 0.011 s (2x alone); its step's CPU phase is 3x compute alone
    # and 4x the local work alone
    expect = S.step_time(case, model, S.Layout(1, 2), net, costs.scaled(4.0), 0.0165).total
    run = _write_run(tmp_path / "run", expect)
    sharing = S.CpuSharing.from_calibration(cal)
    check = S.check_run(run, net, costs, S.Layout(1, 2), None, 2, 2, sharing)
    assert check.error == pytest.approx(0.0, abs=1e-12)
    assert check.parts.compute == pytest.approx(0.0165)
    # a reference measured with other ranks needs its own layout's factors
    with pytest.raises(S.CliError, match="--compute-calibration"):
        S.check_run(run, net, costs, S.Layout(1, 2), (0.011, 4), 2, 2, sharing)
    ref = S.CpuSharing({"gemm": 1.0, "stream": 1.0}, {"gemm": 1.1, "stream": 1.0})
    check = S.check_run(run, net, costs, S.Layout(1, 2), (0.011, 4), 2, 2, sharing, ref)
    assert check.parts.compute == pytest.approx(3.0 * 0.011 / 1.1)
    # a calibration with the solo rows prices shared_index's leader selection by them
    solo_cal = {**cal, "lockstep": {**cal["lockstep"], "stream_solo": {
        "step_factor": 1.5, "own_factor": 1.0, "sync_s": 0.0}}}
    solo_sharing = S.CpuSharing.from_calibration(solo_cal)
    assert solo_sharing.solo == 1.5 and sharing.solo is None
    from benchmarks.scaling.validation import _shared_cpu
    _, local, solo = _shared_cpu(run, 0.011, None, 2, costs, solo_sharing, None)
    assert local == costs.scaled(4.0) and solo == costs.scaled(1.5)
    # costs measured by several processes at once already hold contention: refused
    with pytest.raises(S.CliError, match="without --procs"):
        S.check_run(run, net, dataclasses.replace(costs, ranks=4), S.Layout(1, 2), None, 2, 2,
                    sharing)


# -- crossovers and the properties docs/SCALING.md relies on --------------------------------------
ONE_BIG = S.ModelShapes.from_params([("w", (1000, 1000))], name="one")


@pytest.mark.parametrize("theta", [10, 100])
def test_allgather_stops_beating_dense_at_n_equal_theta(theta):
    # Bandwidth only (α = 0): 8 bytes per kept pair against 4 per dense float. The header
    # and the flags' bytes are tiny: the crossover is N = θ exactly (N = θ − 1 still wins).
    net = S.Network(inter=S.Link(0.0, 8e-10), local=None)
    assert S.crossover_n(S.StepCase("allgather", theta=theta), ONE_BIG, 1, net) == theta
    assert S.allgather_crossover_exact(theta, 1e6, S.Link(0.0, 8e-10)) == pytest.approx(theta)
    # the closed form with the header: just under θ
    h = sizes.chunk_header_bytes(1)          # a chunk with no entries: its header
    assert theta - 1 < S.allgather_crossover_exact(theta, 1e6, S.Link(0.0, 8e-10), h) < theta


@pytest.mark.parametrize("theta", [10, 100, 1000])
def test_crossover_scans_match_the_closed_forms(theta):
    # gravac's static step: the allgather with the NaN/Inf flags' allreduce beside it
    link = S.Link(25e-6, 8e-10)
    net = S.Network(inter=link, local=None)
    big = S.ModelShapes.from_params([("w", (5000, 5000))])
    exact = S.allgather_crossover_exact(theta, big.n_comp, link, sizes.chunk_header_bytes(1), 1)
    assert S.crossover_n(S.StepCase("allgather", theta=theta), big, 1, net) == math.ceil(exact)
    for gains in (False, True):
        approx_n = S.shared_index_crossover_approx(theta, big.n_comp, link, gains)
        scanned = S.crossover_n(S.StepCase("shared_index", theta=theta, gains=gains), big, 1,
                                net, max_n=4096)
        assert scanned == pytest.approx(approx_n, rel=0.01)


def test_hierarchical_moves_the_crossover_to_s_times_theta():
    # a free local link: only the leaders' allgather among H = N/S hosts is left, so the
    # rule θ > N becomes θ > H (one host more: dense's ring also has (N-1)/N < 1)
    net = S.Network(inter=S.Link(0.0, 8e-10), local=S.Link(0.0, 0.0))
    for slots, theta in [(4, 10), (8, 10), (2, 50)]:
        n_star = S.crossover_n(S.StepCase("hierarchical", theta=theta), ONE_BIG, slots, net)
        assert slots * theta <= n_star <= slots * (theta + 1)
    # a local link as slow as the inter link: the dense host average and broadcast cost
    # more than dense itself saves, already on 2 hosts
    slow = S.Network(inter=S.Link(0.0, 8e-10), local=S.Link(0.0, 8e-10))
    assert S.crossover_n(S.StepCase("hierarchical", theta=1000), ONE_BIG, 8, slow) == 0
    # never losing up to max_n: None
    assert S.crossover_n(S.StepCase("shared_index", theta=100), ONE_BIG, 1,
                         S.Network(inter=S.Link(0.0, 8e-10), local=None), max_n=64) is None


def test_allgather_crossover_with_latency_is_near_theta_for_large_layers():
    big = S.ModelShapes.from_params([("w", (10000, 10000))])      # 1e8 floats
    net = S.Network(inter=S.Link(25e-6, 8e-10), local=None)
    n_star = S.crossover_n(S.StepCase("allgather", theta=100), big, 1, net)
    assert 95 <= n_star <= 105


def test_shared_index_cost_is_independent_of_n_for_large_n():
    beta = 8e-10
    net = S.Network(inter=S.Link(0.0, beta), local=None)
    model = S.ModelShapes.from_params([("w", (1000, 1000)), ("v", (500, 2000))])
    case = S.StepCase("shared_index", theta=100)
    t = {n: S.comm_time(case, model, S.Layout(n, 1), net) for n in (256, 512, 1024)}
    # The only bytes that grow with N are the NaN/Inf flags, one float64 per rank, fused
    # with the values; without them the traffic is 2(N-1)/N·(indices + values): constant.
    flags = {n: 2 * (n - 1) / n * 8 * n * beta for n in t}
    payload = {n: t[n] - flags[n] for n in t}
    assert payload[1024] / payload[512] == pytest.approx(1.0, abs=2e-3)
    assert payload[512] / payload[256] == pytest.approx(1.0, abs=4e-3)
    k = model.kept_total(100)
    index = S.index_buffer_bytes(model, 100, None)
    assert payload[1024] == pytest.approx(2 * 1023 / 1024 * (index + 4 * k) * beta)
    # ≈ 2·(values + indices)·β = 2·(4 + b)·n/θ·β, b ≈ 1.8 bytes an index here: a (4 + b)/4θ
    # share of the dense ring's 8n·β
    b = (index - 16) / k
    assert 1.7 < b < 1.9
    dense = S.comm_time(S.StepCase("dense"), model, S.Layout(1024, 1), net)
    assert payload[1024] / dense == pytest.approx((4 + b) / 400, rel=0.01)
    # the allgather's grows linearly with N
    ag = [S.comm_time(S.StepCase("allgather", theta=100), model, S.Layout(n, 1), net)
          for n in (256, 512)]
    assert ag[1] / ag[0] == pytest.approx(511 / 255, rel=2e-3)


def test_case_of_step_records():
    from gravac.train.config import load_config

    cfg = load_config([REPO / "configs/demo.yaml"])     # GraVAC, Top-k, allgather
    rec = {"sent": "candidate", "cf": 20.0, "theta_min": 10.0, "theta_c": 20.0}
    case = S.case_of(rec, cfg, S.exchange_of(cfg))
    assert (case.exchange, case.theta, case.theta_min, case.theta_c, case.gains, case.sent) == \
        ("allgather", 20.0, 10.0, 20.0, True, "sparse")
    dense = S.case_of({"sent": "dense", "cf": 1.0, "theta_min": 10.0, "theta_c": 20.0}, cfg,
                      "allgather")
    assert dense.sent == "dense" and dense.selects      # selected, then sent dense
    planned = S.case_of({"sent": "dense", "cf": 1.0, "theta_min": 1.0, "theta_c": None}, cfg,
                        "allgather")                   # E2/E3: planned dense, no gains
    assert not planned.selects and not planned.gains


# -- the command line -------------------------------------------------------------------------
def test_cli_calibrate(tmp_path):
    inter, local = S.Link(30e-6, 8e-9), S.Link(3e-6, 5e-10)
    src = tmp_path / "m.json"
    src.write_text(json.dumps(_collectives_doc(2, 2, inter, local)))
    out = tmp_path / "cal.json"
    proc = run_cli("calibrate", src, "--out", out)
    assert proc.returncode == 0, proc.stderr
    cal = json.loads(out.read_text())
    assert (cal["hosts"], cal["slots"]) == (2, 2)
    assert cal["links"]["inter"]["allreduce"]["alpha_s"] == pytest.approx(30e-6, rel=1e-6)
    assert "inter" in proc.stderr and "Gbit/s" in proc.stderr


def test_cli_project(tmp_path):
    shapes = tmp_path / "tiny.json"
    shapes.write_text(json.dumps(TINY.to_json()))
    out, js = tmp_path / "p.md", tmp_path / "p.json"
    proc = run_cli("project", "--models", "--shapes", shapes, "--compute-ms", "tiny=10",
                   "--n", 8, 16, 32, "--slots", 8, "--links", "1gbit", "10", "--max-n", 256,
                   "--out", out, "--json", js, "--plot-dir", tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert "### tiny" in text and "Crossover N" in text and "allgather 10x" in text
    # every exchange the engine offers is projected by default, the coded allgather too
    assert all(f"| {kind} 10x |" in text for kind in EXCHANGE_KINDS)
    assert (tmp_path / "scaling_tiny.png").stat().st_size > 0
    data = json.loads(js.read_text())["models"][0]
    assert data["compute_s"] == pytest.approx(0.01)
    assert {t["n"] for t in data["times"]} == {8, 16, 32}


def test_cli_measure_compression(tmp_path):
    out = tmp_path / "c.json"
    proc = run_cli("measure-compression", "--sizes", 1024, 4096, "--cfs", 10, 100, "--chunks",
                   1, 3, "--repeats", 1, "--lowrank-shapes", "16x32", "32x32",
                   "--lowrank-ranks", 1, 2, "--out", out)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    costs = S.CompressionCosts.from_json(doc)
    assert len(costs.pipeline) == 5 and len(costs.powersgd) == 4
    assert all(c >= 0 for c in costs.pipeline)
    assert len(doc["samples"]["pipeline"]) == 2 * 2 * 2
    # allgather_coded's pipeline (its indices coded and decoded) is measured beside it
    assert len(costs.pipeline_coded) == 5 and all(c >= 0 for c in costs.pipeline_coded)
    assert len(doc["samples"]["pipeline_coded"]) == 2 * 2 * 2


def test_cli_measure_compression_concurrent(tmp_path):
    """--procs 2: two processes time every sample together; the document keeps, sample by
    sample, the slower process's time and says it was measured at 2 ranks."""
    out = tmp_path / "c2.json"
    proc = run_cli("measure-compression", "--procs", 2, "--sizes", 1024, 4096, "--cfs", 10,
                   "--chunks", 1, 2, "--repeats", 1, "--lowrank-shapes", "16x32",
                   "--lowrank-ranks", 1, "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert "2 processes at once" in proc.stderr
    doc = json.loads(out.read_text())
    assert doc["ranks"] == 2 and len(doc["per_process_fits"]) == 2
    assert S.CompressionCosts.from_json(doc).ranks == 2
    assert [row[:-1] for row in doc["samples"]["pipeline"]] == \
        [[1024, 103, 1], [1024, 103, 2], [4096, 410, 1], [4096, 410, 2]]
    assert all(row[-1] > 0 for rows in doc["samples"].values() for row in rows)


def test_concurrent_measurement_keeps_the_slowest():
    docs = [{"samples": {"norm": [[10, 1.0], [20, 4.0]], "select": [[10, 1, 0.5]]}},
            {"samples": {"norm": [[10, 3.0], [20, 2.0]], "select": [[10, 1, 0.25]]}}]
    assert S.slowest_samples(docs) == {"norm": [[10, 3.0], [20, 4.0]],
                                       "select": [[10, 1, 0.5]]}


CONFIG = ("run: {name: x, output_dir: /tmp, steps: 20}\nmodel: {name: small_cnn}\n"
          "data: {name: digits}\ncompression: {controller: static, compressor: topk, cf: 10}\n")


def _write_run(run_dir: Path, t_iter: float, steps: int = 15, world: int = 2,
               config: str = CONFIG, backend: str | None = None) -> Path:
    """A run directory as train.py writes it (config.yaml, metrics.jsonl): static Top-k
    at CF 10 (or ``config``), every step taking ``t_iter``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(config)
    lines = [{"kind": "run_start", "world_size": world, "backend": backend}]
    for step in range(1, steps + 1):
        lines.append({"kind": "step", "step": step, "world_size": world, "sent": "min",
                      "cf": 10.0, "theta_min": 10.0, "theta_c": None, "t_compute": 0.01,
                      "t_update": 0.001, "t_compress": 0.002, "t_comm": 0.003,
                      "t_iter": t_iter})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return run_dir


def test_cli_validate(tmp_path, capsys):
    from gravac.train.config import load_config

    cal = {"kind": "gravac.scaling.calibration", "hosts": 1, "slots": 2, "n": 2,
           "links": {"local": {"allreduce": {"alpha_s": 1e-4, "beta_s_per_byte": 1e-9},
                               "allgather": {"alpha_s": 2e-4, "beta_s_per_byte": 1e-9}}}}
    cal_path = tmp_path / "cal.json"
    cal_path.write_text(json.dumps(cal))
    (tmp_path / "c.yaml").write_text(CONFIG)
    model = S.shapes_from_config(load_config([tmp_path / "c.yaml"]))
    # what the model predicts for this run: the run's own compute (t_compute + t_update)
    expect = S.step_time(S.StepCase("allgather", theta=10), model, S.Layout(1, 2),
                         S.Network.from_calibration(cal), S.NO_LOCAL, 0.011).total
    good = _write_run(tmp_path / "good", expect)
    bad = _write_run(tmp_path / "bad", 2 * expect)
    proc = run_cli("validate", good, bad, "--calibration", cal_path, "--warmup", 2)
    assert proc.returncode == 1
    rows = [line for line in proc.stdout.splitlines() if line.startswith(f"| {tmp_path}")]
    assert "| +0.0% |" in rows[0] and "| -50.0% **over** |" in rows[1], proc.stdout
    assert "exceeds --tolerance" in proc.stderr
    # the same in this process (no second start-up): the good run alone passes
    assert S.main(["validate", str(good), "--calibration", str(cal_path), "--warmup", "2"]) == 0
    # a compute reference measured with 1 rank, scaled to 2 ranks on 1 core: twice as long
    assert S.main(["validate", str(good), "--calibration", str(cal_path), "--compute", "0.011",
                   "--compute-ranks", "1", "--cores", "1", "--warmup", "2"]) == 1
    assert "11.0 / 22.0" in capsys.readouterr().out


def test_plain_horovod_runs_are_priced_by_the_plain_calibration(tmp_path, capsys):
    from gravac.train.config import load_config

    def cal(alpha, beta, slots=2):
        return {"kind": "gravac.scaling.calibration", "hosts": 1, "slots": slots, "n": slots,
                "links": {"local": {"allreduce": {"alpha_s": alpha, "beta_s_per_byte": beta},
                                    "allgather": {"alpha_s": 2e-4, "beta_s_per_byte": 1e-9}}}}

    gravacs, plain = cal(1e-4, 1e-9), cal(3e-4, 2e-9)
    dense_cfg = CONFIG.replace("controller: static", "controller: dense")
    (tmp_path / "c.yaml").write_text(dense_cfg)
    model = S.shapes_from_config(load_config([tmp_path / "c.yaml"]))
    comm = {name: S.comm_time(S.StepCase("dense"), model, S.Layout(1, 2),
                              S.Network.from_calibration(c)) for name, c in
            (("gravac", gravacs), ("plain", plain))}
    assert comm["plain"] > comm["gravac"]
    plain_net = S.Network.from_calibration(plain)
    for backend, expect in (("horovod", "plain"), ("torch", "gravac")):
        # Horovod's DistributedOptimizer waits in Horovod's loop; DDP's Gloo waits do not
        run = _write_run(tmp_path / backend, 0.1, config=dense_cfg, backend=backend)
        check = S.check_run(run, S.Network.from_calibration(gravacs), S.NO_LOCAL,
                            S.Layout(1, 2), (0.011, 2), 2, 2, plain_net=plain_net)
        assert check.parts.comm == pytest.approx(comm[expect])
    # a gravac run keeps the calibration of gravac's own waits
    run = _write_run(tmp_path / "static", 0.1, backend="horovod")
    check = S.check_run(run, S.Network.from_calibration(gravacs), S.NO_LOCAL, S.Layout(1, 2),
                        (0.011, 2), 2, 2, plain_net=plain_net)
    assert check.parts.comm == pytest.approx(S.comm_time(
        S.StepCase("allgather", theta=10), model, S.Layout(1, 2),
        S.Network.from_calibration(gravacs)))
    # the plain calibration must be of the same layout: one line
    paths = []
    for name, c in (("g.json", gravacs), ("p.json", cal(3e-4, 2e-9, slots=4))):
        paths.append(tmp_path / name)
        paths[-1].write_text(json.dumps(c))
    assert S.main(["validate", str(tmp_path / "horovod"), "--calibration", str(paths[0]),
                   "--plain-calibration", str(paths[1]), "--compute", "0.011"]) == 2
    assert "--plain-calibration" in capsys.readouterr().err
    # of the same layout: used, and the report's header names it
    same = tmp_path / "same.json"
    same.write_text(json.dumps(plain))
    out = tmp_path / "v.md"
    S.main(["validate", str(tmp_path / "horovod"), "--calibration", str(paths[0]),
            "--plain-calibration", str(same), "--compute", "0.011", "--out", str(out)])
    assert f"plain Horovod runs' links {same}, " in out.read_text().splitlines()[0]


BAD_INPUT = [
    (["project", "--models", "--n", 12, "--slots", 8, "--compute-ms", "x=1"], "--n"),
    (["project", "--links", "fast"], "--links"),
    (["validate", "nowhere", "--calibration", "missing.json"], "--calibration"),
    (["calibrate", "missing.json"], "missing.json"),
    (["measure-compression", "--sizes", 0], "--sizes"),
    (["project", "--n", "abc"], "argument --n: 'abc' is not a whole number"),
    (["measure-collectives", "--out", "x.json", "--factor", 1],
     "benchmarks/scaling measure-collectives: error: argument --factor: must be >= 2"),
]


@pytest.fixture(scope="module")
def bad_input_runs(tmp_path_factory):
    """``python benchmarks/scaling ARGS`` of every case of BAD_INPUT from an empty folder,
    all in one python process (tests/script_batch.py), each as a process of its own."""
    from script_batch import run_scripts

    cwd = tmp_path_factory.mktemp("bad_input")
    runs = run_scripts([(cwd, [str(REPO / "benchmarks/scaling"), *map(str, args)])
                        for args, _ in BAD_INPUT], python=PY, timeout=HANG_GUARD)
    return {tuple(map(str, args)): proc for (args, _), proc in zip(BAD_INPUT, runs)}


@pytest.mark.parametrize("args, where", BAD_INPUT)
def test_cli_bad_input_is_one_line(args, where, bad_input_runs):
    proc = bad_input_runs[tuple(map(str, args))]
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and where in lines[0], proc.stderr


def test_scaling_doc_commands_exist():
    doc = (REPO / "docs/SCALING.md").read_text()
    subcommands = {"measure-compression", "measure-collectives", "calibrate", "validate",
                   "project"}
    used = set()
    for line in doc.splitlines():
        if "benchmarks/scaling " in line:
            word = line.split("benchmarks/scaling ", 1)[1].split()[0]
            used.add(word.strip("`'\",.;:()"))
    assert used and used <= subcommands, used - subcommands
    assert subcommands - {"measure-collectives"} <= used


# -- exchanges in run configs -----------------------------------------------------------------
CAL = {"kind": "gravac.scaling.calibration", "hosts": 1, "slots": 2, "n": 2,
       "links": {"local": {"allreduce": {"alpha_s": 1e-4, "beta_s_per_byte": 1e-9},
                           "allgather": {"alpha_s": 2e-4, "beta_s_per_byte": 1e-9}}}}


def test_every_exchange_of_a_config_is_priced(tmp_path):
    from gravac.train.config import load_config

    for kind in EXCHANGE_KINDS:
        path = tmp_path / f"{kind}.yaml"
        path.write_text(CONFIG.replace("cf: 10}", f"cf: 10, exchange: {kind}}}"))
        cfg = load_config([path])
        assert S.exchange_of(cfg) == kind
        case = S.case_of({"sent": "min", "cf": 10.0, "theta_min": 10.0}, cfg, kind)
        assert case.exchange == kind and case.theta == 10.0
        assert S.comm_time(case, TINY, S.Layout(2, 2), S.Network(LINK, LINK)) > 0


def test_an_allgather_coded_run_is_validated(tmp_path, capsys):
    from gravac.train.config import load_config

    config = CONFIG.replace("cf: 10}", "cf: 10, exchange: allgather_coded}")
    (tmp_path / "c.yaml").write_text(config)
    model = S.shapes_from_config(load_config([tmp_path / "c.yaml"]))
    case = S.StepCase("allgather_coded", theta=10)
    net = S.Network.from_calibration(CAL)
    expect = S.step_time(case, model, S.Layout(1, 2), net, S.NO_LOCAL, 0.011).total
    run = _write_run(tmp_path / "coded", expect, config=config)
    check = S.check_run(run, net, S.NO_LOCAL, S.Layout(1, 2), None, 2, 2)
    assert check.exchange == "allgather_coded" and check.error == pytest.approx(0.0, abs=1e-12)
    # its chunk is smaller than the plain allgather's: so is the predicted communication
    plain = S.comm_time(S.StepCase("allgather", theta=10), model, S.Layout(1, 2), net)
    assert check.parts.comm < plain
    cal_path = tmp_path / "cal.json"
    cal_path.write_text(json.dumps(CAL))
    assert S.main(["validate", str(run), "--calibration", str(cal_path), "--warmup", "2"]) == 0
    assert "| allgather_coded |" in capsys.readouterr().out


def test_an_exchange_the_model_does_not_know_is_one_line(tmp_path, capsys):
    from types import SimpleNamespace

    cfg = SimpleNamespace(compression=SimpleNamespace(
        controller="static", compressor="topk", dense_wire="native", overlap=False,
        ddp_powersgd_rank=None, exchange="ring"))
    with pytest.raises(S.CliError, match="compression.exchange='ring'"):
        S.exchange_of(cfg)
    # a run directory whose config names it: the config's own error, as one line
    run = _write_run(tmp_path / "ring", 0.1,
                     config=CONFIG.replace("cf: 10}", "cf: 10, exchange: ring}"))
    cal_path = tmp_path / "cal.json"
    cal_path.write_text(json.dumps(CAL))
    assert S.main(["validate", str(run), "--calibration", str(cal_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exchange" in err[0] and "ring" in err[0], err
    # a layout the calibration has no link for (2 hosts, a 1-host calibration): one line
    good = _write_run(tmp_path / "good", 0.1, world=4)
    assert S.main(["validate", str(good), "--calibration", str(cal_path), "--hosts", "2",
                   "--slots", "2", "--warmup", "2", "--compute", "0.01"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no inter link" in err[0], err


def test_both_ways_of_running_the_package():
    """``python -m benchmarks.scaling`` from the repository root, and the folder from
    anywhere (run_cli above)."""
    proc = subprocess.run([PY, "-m", "benchmarks.scaling", "calibrate", "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=HANG_GUARD)
    assert proc.returncode == 0 and "benchmarks/scaling calibrate" in proc.stdout, proc.stderr


# -- the shared size arithmetic ----------------------------------------------------------------
def test_sizes_imports_no_torch():
    """gravac/util/sizes.py loads and computes with torch and NumPy unimportable, and
    imports nothing but the standard library's math and typing."""
    path = REPO / "gravac/util/sizes.py"
    imported = {a.name for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.Import) for a in node.names}
    imported |= {node.module for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.ImportFrom)}
    assert imported <= {"__future__", "math", "typing"}, imported
    code = (
        "import importlib.util, sys\n"
        "sys.modules['torch'] = sys.modules['numpy'] = None     # any import of them fails\n"
        f"spec = importlib.util.spec_from_file_location('sizes', {str(path)!r})\n"
        "sizes = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(sizes)\n"
        "print(sizes.sparse_chunk_bytes([2000, 3000], [200, 300], coded=True),\n"
        "      sizes.rank_for_cf(100, 300, 18.75), sizes.num_kept(1000, 10))\n")
    proc = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=HANG_GUARD)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2592", "4", "100"]


def test_the_engine_and_compressors_use_sizes():
    """One definition: the names other code imports from the compressors and the codecs
    are sizes.py's own functions, and the codecs' dtypes are of sizes.py's byte sizes."""
    import gravac.compressors as compressors
    from gravac.compressors import powersgd
    from gravac.engine import codec, index_codec

    assert compressors.num_kept is sizes.num_kept
    for name in ("matrix_shape", "compression_factor", "rank_for_cf"):
        assert getattr(powersgd, name) is getattr(sizes, name)
    assert codec._HEADER_FIELDS == sizes.CHUNK_HEADER_FIELDS
    assert index_codec._pad8 is sizes.pad8
    assert {bits: (c.itemsize, low.itemsize) for bits, (c, low) in index_codec._PARTS.items()} \
        == sizes.INDEX_FIELD_PARTS
    for numel, capacity in [(10, 0), (10, 3), (2000, 200), (3000, 300), (70_000, 7_000),
                            (2_560_000, 2_560), (2_560_000, 256_000)]:
        field = index_codec.plan(numel, capacity)
        assert (field.low_bits, field.nbytes) == sizes.index_field_layout(numel, capacity)
    # the plain chunk's index dtype: int64 from a layer of 2**31 entries on
    layers = [codec.SparseLayer("a", 2**31 - 1, torch.float32)]
    assert codec.SparseCodec(layers).index_dtype == torch.int32
    layers.append(codec.SparseLayer("b", 2**31, torch.float32))
    assert codec.SparseCodec(layers).index_dtype == torch.int64
