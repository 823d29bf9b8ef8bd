"""``project``: step times of the paper's models (or any shapes) from 8 to 1,024 workers on
assumed links, the crossovers, and their Markdown and JSON (docs/SCALING.md §5, §6).

Example::

    local = Link.from_gbit(200, 5e-6)
    p = project(model, 0.05, "given", [1, 10], [8, 64, 512], 8,
                projection_cases([10, 100], [1, 4], ["allgather", "shared_index"]),
                25e-6, local, NO_LOCAL, 8192)
    print(projection_markdown(p, 8192))
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .crossovers import crossover_n
from .local import NO_LOCAL, CompressionCosts
from .network import Layout, Link, Network
from .rounds import Collective, StepCase, round_time
from .shapes import ModelShapes
from .step import step_time

DEFAULT_ALPHA_US = 25.0        # an assumption for a datacenter TCP link (docs/SCALING.md §2)
DEFAULT_LOCAL_GBIT = 200.0     # an assumption for inside a host (PCIe/shared memory class)
DEFAULT_LOCAL_ALPHA_US = 5.0
DEFAULT_DEVICE_TFLOPS = 10.0   # an assumption: sustained fp32 of a V100-class GPU


def projection_cases(cfs: Sequence[float], ranks: Sequence[int],
                     exchanges: Sequence[str]) -> list[StepCase]:
    cases = []
    for ex in exchanges:
        if ex in ("dense", "fp16"):
            cases.append(StepCase(ex))
        elif ex == "powersgd":
            cases += [StepCase("powersgd", rank=r) for r in ranks]
        else:
            cases += [StepCase(ex, theta=float(cf)) for cf in cfs]
    return cases


@dataclass
class Projection:
    model: ModelShapes
    compute_s: float
    compute_source: str
    links: list[float]
    ns: list[int]
    slots: int
    cases: list[StepCase]
    times: dict          # (link, n, label) -> StepTime
    crossovers: dict     # (link, label) -> (step crossover, comm-only crossover)
    gains: dict          # (link, n) -> seconds of GraVAC's gains allreduce


def project(model: ModelShapes, compute_s: float, compute_source: str, links: Sequence[float],
            ns: Sequence[int], slots: int, cases: Sequence[StepCase], alpha_s: float,
            local: Link, costs: CompressionCosts, max_n: int) -> Projection:
    times, crossovers, gains = {}, {}, {}
    dense = StepCase("dense")
    for gbit in links:
        net = Network(Link.from_gbit(gbit, alpha_s), local)
        for n in ns:
            layout = Layout(n // slots, slots)
            for case in [dense, *cases]:
                times[(gbit, n, case.label())] = step_time(case, model, layout, net, costs,
                                                           compute_s)
            gains[(gbit, n)] = round_time(
                [Collective("allreduce", "world", 8 * (3 + n))], layout, net)
        for case in cases:
            if case.exchange == "dense":
                continue
            crossovers[(gbit, case.label())] = (
                crossover_n(case, model, slots, net, costs, max_n),
                crossover_n(case, model, slots, net, NO_LOCAL, max_n))
    return Projection(model, compute_s, compute_source, list(links), list(ns), slots,
                      list(cases), times, crossovers, gains)


def _crossover_text(value: int | None, slots: int, max_n: int) -> str:
    if value is None:
        return f"> {max_n}"
    if value == 0:
        return "never"
    return str(value)


def projection_markdown(p: Projection, max_n: int) -> str:
    m = p.model
    out = [f"### {m.name}", "",
           f"{m.n_total:,} parameters in {len(m.params)} tensors; {m.n_comp:,} in "
           f"{m.layers_comp} compressed layers (≥ {m.min_compress_numel} elements), "
           f"{m.n_dense:,} always dense. Compute per step: {p.compute_s * 1e3:.1f} ms "
           f"({p.compute_source}). {p.slots} ranks per host.", ""]
    labels = [c.label() for c in p.cases if c.exchange != "dense"]
    for gbit in p.links:
        out += [f"#### {gbit:g} Gbit/s: step time in ms (speed-up over dense fp32)", "",
                "| N | dense | " + " | ".join(labels) + " |",
                "|---:|---:|" + "---:|" * len(labels)]
        for n in p.ns:
            d = p.times[(gbit, n, "dense")].total
            cells = [f"{p.times[(gbit, n, lab)].total * 1e3:.1f} "
                     f"({d / p.times[(gbit, n, lab)].total:.2f}x)" for lab in labels]
            out.append(f"| {n} | {d * 1e3:.1f} | " + " | ".join(cells) + " |")
        out.append("")
        out += [f"Communication only at {gbit:g} Gbit/s, ms per step:", "",
                "| N | dense | " + " | ".join(labels) + " | GraVAC gains round |",
                "|---:|---:|" + "---:|" * (len(labels) + 1)]
        for n in p.ns:
            cells = [f"{p.times[(gbit, n, lab)].comm * 1e3:.2f}" for lab in ["dense", *labels]]
            out.append(f"| {n} | " + " | ".join(cells) +
                       f" | {p.gains[(gbit, n)] * 1e3:.2f} |")
        out.append("")
    out += ["#### Crossover N: the first N at which the exchange no longer beats dense fp32",
            "", "Scanned from 2 hosts up. Step = local compression + communication "
            "(compute cancels); comm = communication only. `never`: behind dense already "
            f"on 2 hosts; `> {max_n}`: still ahead at {max_n}.", "",
            "| exchange | " + " | ".join(f"{g:g} Gbit/s step | {g:g} Gbit/s comm"
                                        for g in p.links) + " |",
            "|---|" + "---:|---:|" * len(p.links)]
    for lab in labels:
        cells = []
        for gbit in p.links:
            step, comm = p.crossovers[(gbit, lab)]
            cells += [_crossover_text(step, p.slots, max_n), _crossover_text(comm, p.slots, max_n)]
        out.append(f"| {lab} | " + " | ".join(cells) + " |")
    out.append("")
    return "\n".join(out)


def projection_json(p: Projection) -> dict:
    return {"model": p.model.name, "n_total": p.model.n_total, "n_comp": p.model.n_comp,
            "compute_s": p.compute_s, "compute_source": p.compute_source, "slots": p.slots,
            "times": [{"gbit": g, "n": n, "case": lab, "compute": t.compute, "local": t.local,
                       "comm": t.comm, "total": t.total}
                      for (g, n, lab), t in p.times.items()],
            "crossovers": [{"gbit": g, "case": lab, "step": s, "comm": c}
                           for (g, lab), (s, c) in p.crossovers.items()],
            "gains_round": [{"gbit": g, "n": n, "seconds": s} for (g, n), s in p.gains.items()]}
