"""``measure-compression``: time gravac's own local code on this machine and fit the
per-element costs of ``CompressionCosts`` (docs/SCALING.md §1.4).

Example::

    doc = measure_compression(sizes=[2**16, 2**20], cfs=[10, 100], chunks=[1, 8], repeats=5)
    CompressionCosts.from_json(doc).pipeline         # (c0, a, b, u, v), seconds
"""
from __future__ import annotations

import os
from typing import Sequence

from gravac.util.sizes import num_kept

from .errors import CliError
from .fitting import least_squares


def _timed(fn, repeats: int) -> float:
    from benchmarks.timing import median_time
    return median_time(fn, repeats)


def measure_compression(sizes: Sequence[int], cfs: Sequence[float], chunks: Sequence[int],
                        repeats: int, compressor: str = "topk",
                        lowrank_shapes: Sequence[tuple[int, int]] = ((64, 64), (256, 256),
                                                                     (512, 1024), (1024, 2048)),
                        ranks: Sequence[int] = (1, 2, 4), seed: int = 0,
                        sync=None) -> dict:
    """Time gravac's own local code on flat tensors and fit the per-element costs of
    ``CompressionCosts``. Returns the JSON document (samples and fits).

    ``sync()``, when given, is called before every timed sample: the processes of
    ``measure_compression_concurrent`` wait for each other there, so that they time the
    same work at the same moment, as the ranks of a step do."""
    import torch

    from gravac import compressors
    from gravac.compressors import SelectContext
    from gravac.compressors.powersgd import orthogonalize_
    from gravac.engine.codec import SparseCodec, SparseLayer
    from gravac.memory import ResidualMemory, SparseSent
    from gravac.engine.selection import has_nonfinite

    def timed(fn, repeats):
        if sync is not None:
            sync()
        return _timed(fn, repeats)

    g = torch.Generator().manual_seed(seed)
    comp = compressors.get(compressor)
    samples: dict[str, list] = {"pipeline": [], "pipeline_coded": [], "select": [], "norm": [],
                                "copy": [], "cast": [], "powersgd": [], "check": []}
    step = iter(range(10 ** 9))
    for n in sizes:
        grad = torch.randn(n, generator=g)
        out = torch.empty(n)
        samples["norm"].append((n, timed(lambda: torch.dot(grad, grad), repeats)))
        samples["copy"].append((n, timed(lambda: out.copy_(grad), repeats)))
        samples["cast"].append((n, timed(lambda: out.copy_(grad.to(torch.float16)),
                                         repeats)))
        samples["check"].append((n, timed(lambda: has_nonfinite([grad]), repeats)))
        for cf in cfs:
            k = num_kept(n, cf)
            samples["select"].append((n, k, timed(
                lambda: grad.index_select(
                    0, comp.select(grad, k, SelectContext(step=next(step)))), repeats)))
            # The allgather's chunks, and allgather_coded's (indices in coded fields).
            for name, coded in (("pipeline", False), ("pipeline_coded", True)):
                codec = SparseCodec([SparseLayer("x", n, torch.float32)], index_coding=coded)
                for c in chunks:
                    # C chunks of other ranks' selections (random indices each).
                    parts = []
                    for _ in range(c):
                        # Ranks' picks overlap as they do in training (index_add sums them).
                        idx = torch.randint(0, n, (k,), generator=g)
                        parts.append(codec.pack([(torch.randn(k, generator=g), idx)])[0])
                    gathered = torch.cat(parts)
                    memory = ResidualMemory()

                    def pipeline():
                        g_ef = memory.compensate("x", grad)
                        idx = comp.select(g_ef, k, SelectContext(step=next(step)))
                        vals = g_ef.index_select(0, idx)      # the engine's gather
                        memory.update("x", g_ef, SparseSent(idx, vals))
                        _, ctx = codec.pack([(vals, idx)])
                        codec.aggregate_into(gathered, ctx, c, [out])

                    samples[name].append((n, k, c, timed(pipeline, repeats)))
    for rows, cols in lowrank_shapes:
        grad = torch.randn(rows * cols, generator=g)
        target = torch.empty(rows, cols)
        for r in ranks:
            q = torch.randn(cols, r, generator=g)
            memory = ResidualMemory()

            def lowrank():
                g_ef = memory.compensate("m", grad)
                m = g_ef.view(rows, cols)
                p = orthogonalize_(m @ q)
                q_new = m.t() @ p
                m_hat = p @ q_new.t()
                target.copy_(m_hat)
                memory.update("m", g_ef, m_hat)

            samples["powersgd"].append((rows * cols, r, timed(lowrank, repeats)))
    return {"kind": "gravac.scaling.compression", "compressor": compressor,
            "threads": torch.get_num_threads(), "ranks": 1, "cores": os.cpu_count(),
            "torch": torch.__version__, "repeats": repeats, "samples": samples,
            "fits": fit_compression(samples)}


def _compression_worker(kwargs: dict, threads: int, barrier, results) -> None:
    """One process of ``measure_compression_concurrent`` (module level: spawn pickles it)."""
    import torch

    torch.set_num_threads(threads)
    try:
        results.put(("ok", measure_compression(**kwargs, sync=barrier.wait)))
    except BaseException as exc:                # the parent reports it and stops the others
        barrier.abort()
        results.put(("error", f"{type(exc).__name__}: {exc}"))


def slowest_samples(docs: Sequence[dict]) -> dict:
    """Samples of several processes' ``measure_compression`` documents (the same sizes in
    the same order), each with the largest time of any process."""
    return {name: [[*rows[0][:-1], max(r[-1] for r in rows)]
                   for rows in zip(*(d["samples"][name] for d in docs))]
            for name in docs[0]["samples"]}


def measure_compression_concurrent(procs: int, threads: int = 1, **kwargs) -> dict:
    """``measure_compression`` in ``procs`` processes at once on this machine, every sample
    started together: the local costs of a step with ``procs`` ranks sharing the cores
    (memory bandwidth and caches included, which ``contention()``'s ranks/cores leaves out).
    Each sample keeps the slowest process's time, since a collective after the local work
    waits for the last rank. The document has ``ranks: procs``, so ``validate`` applies no
    contention factor to it at that many ranks.

    Example::

        doc = measure_compression_concurrent(4, sizes=[2**16, 2**20], cfs=[10, 100],
                                             chunks=[1, 4], repeats=5)
        CompressionCosts.from_json(doc).ranks      # 4
    """
    import multiprocessing as mp
    import queue

    if procs == 1:
        import torch
        torch.set_num_threads(threads)
        return measure_compression(**kwargs)
    ctx = mp.get_context("spawn")        # a fork would share torch's thread pools
    barrier, results = ctx.Barrier(procs), ctx.Queue()
    workers = [ctx.Process(target=_compression_worker, args=(kwargs, threads, barrier, results),
                           daemon=True) for _ in range(procs)]
    for w in workers:
        w.start()
    docs, errors = [], []
    try:
        while len(docs) + len(errors) < procs:
            try:
                status, value = results.get(timeout=5)
            except queue.Empty:
                if not any(w.is_alive() for w in workers):
                    errors.append("a measuring process died without a result")
                    break
                continue
            (docs if status == "ok" else errors).append(value)
    finally:
        for w in workers:
            w.join(timeout=10)
            if w.is_alive():
                w.terminate()
    if errors:
        raise CliError(f"measure-compression --procs {procs}: {errors[0]}")
    samples = slowest_samples(docs)
    return {**docs[0], "ranks": procs, "samples": samples, "fits": fit_compression(samples),
            "per_process_fits": [d["fits"] for d in docs]}


def fit_compression(samples: dict) -> dict:
    """Least-squares fits (relative errors) of the measured samples; each fit's
    ``coef`` in the order of its ``terms``."""
    def fit(rows, y, terms):
        coef = least_squares(rows, y, [1.0 / t ** 2 for t in y])
        pred = [sum(c * x for c, x in zip(coef, r)) for r in rows]
        errs = [p / t - 1.0 for p, t in zip(pred, y)]
        return {"terms": terms, "coef": coef,
                "max_rel_err": max(abs(e) for e in errs) if errs else None}

    out = {}
    for name in ("pipeline", "pipeline_coded"):
        p = samples.get(name)
        if not p:               # (pipeline_coded: not in files measured before it)
            continue
        out[name] = fit([[1, n, k, c * k, c] for n, k, c, _ in p], [t for *_, t in p],
                        ["per layer", "per element", "per kept", "per chunk x kept",
                         "per chunk"])
    s = samples["select"]
    out["select"] = fit([[1, n, k] for n, k, _ in s], [t for *_, t in s],
                        ["per call", "per element", "per kept"])
    for name in ("norm", "copy", "cast", "check"):
        s = samples.get(name)
        if not s:
            continue
        out[name] = fit([[1, n] for n, _ in s], [t for _, t in s], ["per call", "per element"])
    s = samples["powersgd"]
    out["powersgd"] = fit([[1, r, n, n * r] for n, r, _ in s], [t for *_, t in s],
                          ["per layer", "per layer x rank", "per element", "per element x rank"])
    return out
