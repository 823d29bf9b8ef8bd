"""Calibration: the links' α and β, and the lockstep's CPU-sharing factors, fitted from
``benchmarks/collectives.py``'s measurements of one layout (docs/SCALING.md §1.5, §3).

Example::

    docs = [json.load(open(p)) for p in ("collectives_2x2.json",)]
    cal = calibrate(docs)                         # what ``calibrate --out`` writes
    Network.from_calibration(cal), CpuSharing.from_calibration(cal)
"""
from __future__ import annotations

from typing import Sequence

from .fitting import fit_link, least_squares


#: gravac's collectives -> the model's: both allreduce forms are "allreduce".
OP_KIND = {"allreduce": "allreduce", "grouped_allreduce": "allreduce",
           "allgather": "allgather", "broadcast": "broadcast",
           "allreduce_fp16": "allreduce_fp16"}


def calibrate(measurements: Sequence[dict]) -> dict:
    """Fit α, β per (link scope, collective) from ``collectives.py`` JSON documents of
    one layout; groups of one scope with different ranks (world and leaders) are fitted
    together, which separates α from β."""
    first = measurements[0]
    points: dict[tuple[str, str], list] = {}
    for m in measurements:
        for group in m["groups"].values():
            for op, rows in group["ops"].items():
                for row in rows:
                    key = (group["scope"], OP_KIND[op])
                    points.setdefault(key, []).append(
                        (OP_KIND[op], group["ranks"], row["bytes"], row["median_s"]))
    def entry(pts):
        link, quality = fit_link(pts)
        return {"alpha_s": link.alpha_s, "beta_s_per_byte": link.beta_s_per_byte,
                "gbit_per_s": link.gbit_per_s, **quality}

    links: dict[str, dict] = {}
    by_ranks: dict[str, dict] = {}
    for (scope, kind), pts in sorted(points.items()):
        links.setdefault(scope, {})[kind] = entry(pts)
        for n in sorted({p[1] for p in pts}):
            by_ranks.setdefault(scope, {}).setdefault(kind, {})[str(n)] = \
                entry([p for p in pts if p[1] == n])
    lockstep = pool_lockstep([m["lockstep"] for m in measurements if m.get("lockstep")])
    return {"kind": "gravac.scaling.calibration", "hosts": first["hosts"],
            "slots": first["slots"], "n": first["n"], "link": first.get("link"),
            "backend": first.get("backend"), "horovod_cycle_time_ms":
                first.get("horovod_cycle_time_ms"), "links": links, "by_ranks": by_ranks,
            **({"lockstep": fit_lockstep(lockstep)} if lockstep else {})}


def pool_lockstep(runs: Sequence[dict]) -> dict | None:
    """Several lockstep measurements of one layout as one (each kind's rows together, fitted
    as one): on a shared virtual machine one measurement's factors drift by ±20% within an
    hour (docs/SCALING.md §3), so several runs give a steadier fit. None for none."""
    if not runs:
        return None
    pooled: dict = {}
    for run in runs:
        for kind, data in run.items():
            pooled.setdefault(kind, {"rows": [], "runs": 0})
            pooled[kind]["rows"].extend(data["rows"])
            pooled[kind]["runs"] += 1
    return pooled


def fit_lockstep(lockstep: dict) -> dict:
    """``calibrate``'s fit of collectives.py's lockstep rows, per kind of work:
    step = sync_s + step_factor · work alone; own = own_factor · work alone."""
    out = {}
    for kind, data in lockstep.items():
        rows = data["rows"]
        step = least_squares([[1.0, r["work_s"]] for r in rows], [r["step_s"] for r in rows])
        busy = [r for r in rows if r["work_s"] > 0]
        own = least_squares([[r["work_s"]] for r in busy], [r["own_s"] for r in busy]) \
            if busy else [1.0]
        out[kind] = {"sync_s": step[0], "step_factor": step[1], "own_factor": own[0],
                     "points": len(rows), "runs": data.get("runs", 1)}
    return out
