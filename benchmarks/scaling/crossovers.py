"""Crossovers: the N at which an exchange stops beating dense fp32 (docs/SCALING.md §6), by
scanning the model, and the closed forms those scans reproduce.

Example::

    net = Network(inter=Link(25e-6, 8e-10), local=None)
    crossover_n(StepCase("allgather", theta=100), model, 1, net)        # about 100
    allgather_crossover_exact(100, model.n_comp, net.inter)            # the closed form
"""
from __future__ import annotations

import math

from gravac.util.sizes import index_field_bytes, num_kept

from .local import NO_LOCAL, CompressionCosts, local_time
from .network import Layout, Link, Network
from .rounds import StepCase, comm_time
from .shapes import ModelShapes


def crossover_n(case: StepCase, model: ModelShapes, slots: int, net: Network,
                costs: CompressionCosts = NO_LOCAL, max_n: int = 8192,
                baseline: StepCase = StepCase("dense")) -> int | None:
    """The smallest N (2, 3, ... hosts of ``slots`` ranks) at which ``case`` no longer
    beats ``baseline`` in local + communication time (compute is the same on both sides
    and cancels). None when it still beats it at ``max_n``; 0 when it does not beat it
    even on 2 hosts. The scan starts at 2 hosts: on one host every rank shares the fast
    local link, a regime of its own.

    Example::

        crossover_n(StepCase("allgather", theta=100), model, 1, net)   # about 100
    """
    for hosts in range(2, max_n // slots + 1):
        layout = Layout(hosts, slots)
        ours = local_time(case, model, layout, costs) + comm_time(case, model, layout, net)
        theirs = local_time(baseline, model, layout, costs) + \
            comm_time(baseline, model, layout, net)
        if ours >= theirs:
            return 0 if hosts == 2 else layout.n
    return None


def allgather_crossover_exact(theta: float, n_floats: float, link: Link,
                              header_bytes: float = 0.0, allreduce_rounds: int = 0) -> float:
    """Where a sparse allgather of n/θ (value, index) pairs of 4 + 4 bytes plus a header h
    stops beating a ring allreduce of n fp32, one rank per host, with ``allreduce_rounds``
    small allreduces in the step besides (gravac's static step: 1, the NaN/Inf flags;
    GraVAC: 2, the gains round too; their bytes neglected):

        (N−1)[(1 + 2r)α + (8n/θ + h)β] = 2(N−1)α + 2(N−1)/N·4n·β
        ⇔  1/N* = 1/θ + ((2r − 1)α + hβ) / (8nβ)

    so N* = θ exactly when α = h = 0 (the rule "θ > N"). A bare allgather (r = 0) has
    N−1 latency steps against the ring allreduce's 2(N−1): latency favours it; gravac's
    step (r >= 1) pays more latency than dense, which lowers N* below θ, the more so
    the smaller the model. Returns inf when the allgather always wins.

    >>> allgather_crossover_exact(100, 1e6, Link(0.0, 1e-9))
    100.0
    >>> round(allgather_crossover_exact(100, 1e6, Link(8e-6, 1e-9), allreduce_rounds=1), 1)
    90.9
    """
    inv = 1.0 / theta + ((2 * allreduce_rounds - 1) * link.alpha_s
                         + header_bytes * link.beta_s_per_byte) / \
        (8.0 * n_floats * link.beta_s_per_byte)
    return math.inf if inv <= 0 else 1.0 / inv


def shared_index_crossover_approx(theta: float, n_comp: float, link: Link,
                                  gains: bool = False, index_bytes: float | None = None) -> float:
    """Where shared_index stops beating a dense ring allreduce, one rank per host: its
    bytes are a fixed share of dense's (values 4n/θ and indices b·n/θ against 4n, whatever
    N), but it has one more allreduce round (the indices; two with GraVAC's gains), whose
    2(N−1)α grows with N. Neglecting the small layers, the layer counts and the flags:

        2(N−1)α·(1 + gains) = 2(N−1)/N·β·n(4 − (4 + b)/θ)
        ⇔  N* = nβ(4 − (4 + b)/θ) / (α(1 + gains))

    b, the bytes of an index: ``index_bytes``, else what the engine's codec spends on one
    layer of n_comp entries (``index_bytes_per_entry``; 1.78 at n = 1e6, θ = 100).

    >>> round(shared_index_crossover_approx(100, 1e6, Link(1e-5, 1e-9), index_bytes=4), 6)
    392.0
    >>> round(shared_index_crossover_approx(100, 1e6, Link(1e-5, 1e-9)), 4)
    394.2184
    """
    if link.alpha_s <= 0:
        return math.inf
    b = index_bytes_per_entry(int(n_comp), theta) if index_bytes is None else index_bytes
    return n_comp * link.beta_s_per_byte * (4.0 - (4.0 + b) / theta) / \
        (link.alpha_s * (2 if gains else 1))


def index_bytes_per_entry(numel: int, theta: float) -> float:
    """Bytes shared_index's buffer spends per index of one layer of ``numel`` at CF θ
    (``sizes.index_field_bytes`` of Top-k's k, padding included)."""
    k = num_kept(numel, theta)
    return index_field_bytes(numel, k) / k
