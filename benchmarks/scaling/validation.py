"""``validate``: a recorded run's median step time against the model's prediction, and
the model's bytes against the records' ``bytes_sent`` (docs/SCALING.md §4).

Example::

    net = Network.from_calibration(calibration)
    check = check_run(Path("runs/x"), net, costs, Layout(1, 2), None, cores=2, warmup=10)
    print(format_checks([check], tolerance=0.25))
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from .errors import CliError
from .local import CompressionCosts, CpuSharing, contention
from .models import shapes_from_config
from .network import Layout, Network
from .rounds import recorded_bytes
from .runs import case_of, exchange_of, load_run_config, median_compute, read_steps, run_backend
from .step import StepTime, step_time


@dataclass
class RunCheck:
    run: str
    exchange: str
    n: int
    steps: int
    measured: float          # median t_iter
    predicted: float         # median predicted t_step
    parts: StepTime          # medians of the predicted parts
    measured_parts: dict = field(default_factory=dict)
    bytes_err: float | None = None

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1.0


def check_run(run_dir: Path, net: Network, costs: CompressionCosts, layout: Layout | None,
              compute: tuple[float, int] | None, cores: int, warmup: int,
              sharing: CpuSharing | None = None,
              compute_sharing: CpuSharing | None = None,
              plain_net: Network | None = None) -> RunCheck:
    """Predict a run's median step time and compare it with the measured one.

    ``plain_net``: links measured with Horovod's own (spinning) wait, for plain Horovod
    runs (dense, fp16), whose waits are Horovod's and not gravac's.

    With ``sharing`` (the layout's calibration has lockstep fits) the compute and local
    work, as measured alone, are stretched by the measured factors; ``compute_sharing`` is
    the reference run's layout's (default: ``sharing`` when it has as many ranks).
    Without, by ``contention``'s ranks/cores."""
    cfg = load_run_config(run_dir)
    exchange = exchange_of(cfg)
    if plain_net is not None and exchange in ("dense", "fp16") and \
            run_backend(run_dir, cfg) == "horovod":
        net = plain_net
    steps = read_steps(run_dir, warmup)
    n = int(steps[0].get("world_size") or 0)
    if layout is None:
        raise CliError("give --hosts and --slots, or a --calibration that has them")
    if n != layout.n:
        raise CliError(f"run directory {run_dir}: {n} ranks, but the layout {layout} has "
                       f"{layout.n} (--hosts/--slots or the --calibration's layout)")
    model = shapes_from_config(cfg)
    own = median_compute(steps)
    solo_costs = None
    if sharing is not None:
        t_compute, local_costs, solo_costs = _shared_cpu(run_dir, own, compute, n, costs,
                                                         sharing, compute_sharing)
    elif compute is None:
        if own is None:
            raise CliError(f"run directory {run_dir}: its records have no t_compute (a plain "
                           f"Horovod/DDP run); give --compute SECONDS or a reference run")
        t_compute = own
    else:
        t_ref, ranks_ref = compute
        t_compute = t_ref * contention(n, cores) / contention(ranks_ref, cores)
    if sharing is None:
        local_costs = costs.scaled(contention(n, cores) / contention(costs.ranks, cores))
    predicted, bytes_errs = [], []
    try:
        for rec in steps:
            case = case_of(rec, cfg, exchange)
            predicted.append(step_time(case, model, layout, net, local_costs, t_compute,
                                       solo_costs))
            expect = recorded_bytes(case, model, layout)
            if expect and rec.get("bytes_sent"):
                bytes_errs.append(abs(expect / rec["bytes_sent"] - 1.0))
    except ValueError as exc:
        # What the records ask of the model and the inputs cannot give (a link the
        # calibration has no fit for, a CF below 1): one line, not a traceback.
        raise CliError(f"run directory {run_dir}: {exc}") from None
    med = lambda xs: statistics.median(xs) if xs else None   # noqa: E731
    parts = {"compute": own, "local": med([s["t_compress"] for s in steps
                                          if s.get("t_compress") is not None]),
             "comm": med([s["t_comm"] for s in steps if s.get("t_comm") is not None])}
    medians = StepTime(t_compute, statistics.median(p.local for p in predicted),
                       statistics.median(p.comm for p in predicted))
    return RunCheck(str(run_dir), exchange, n, len(steps),
                    statistics.median(s["t_iter"] for s in steps),
                    statistics.median(p.total for p in predicted), medians, parts,
                    max(bytes_errs) if bytes_errs else None)


def _shared_cpu(run_dir: Path, own: float | None, compute: tuple[float, int] | None, n: int,
                costs: CompressionCosts, sharing: CpuSharing,
                compute_sharing: CpuSharing | None
                ) -> tuple[float, CompressionCosts, CompressionCosts | None]:
    """(predicted compute of a step's CPU phase, local costs, costs of work one rank does
    while the others wait) from the lockstep fits."""
    if costs.ranks != 1:
        raise CliError(f"--compression: its costs were measured by {costs.ranks} processes at "
                       "once; the calibration's lockstep factors apply to costs measured "
                       "alone (measure-compression without --procs)")
    if compute is None:
        if own is None:
            raise CliError(f"run directory {run_dir}: its records have no t_compute (a plain "
                           f"Horovod/DDP run); give --compute SECONDS or a reference run")
        alone = sharing.compute_alone(own)
    else:
        t_ref, ranks_ref = compute
        ref = compute_sharing or (sharing if ranks_ref == n else None)
        if ref is None:
            raise CliError(f"--compute: the reference ran with {ranks_ref} ranks, this layout "
                           f"has {n}; give --compute-calibration (the calibration of the "
                           "reference's layout)")
        alone = ref.compute_alone(t_ref)
    return (sharing.step["gemm"] * alone, costs.scaled(sharing.step["stream"]),
            costs.scaled(sharing.solo) if sharing.solo is not None else None)


def format_checks(checks: list[RunCheck], tolerance: float) -> str:
    ms = lambda x: "—" if x is None else f"{x * 1e3:.1f}"    # noqa: E731
    lines = ["| run | exchange | N | steps | measured t_step (ms) | predicted (ms) | error "
             "| compute meas./pred. (ms) | local meas./pred. (ms) | comm meas./pred. (ms) "
             "| bytes_sent model error |",
             "|---|---|---:|---:|---:|---:|---:|---|---|---|---:|"]
    for c in checks:
        flag = "" if abs(c.error) <= tolerance else " **over**"
        b = "—" if c.bytes_err is None else f"{c.bytes_err * 100:.2f}%"
        p = c.parts
        lines.append(
            f"| {c.run} | {c.exchange} | {c.n} | {c.steps} | {ms(c.measured)} | {ms(c.predicted)} "
            f"| {c.error * 100:+.1f}%{flag} | {ms(c.measured_parts.get('compute'))} / "
            f"{ms(p.compute)} | {ms(c.measured_parts.get('local'))} / {ms(p.local)} "
            f"| {ms(c.measured_parts.get('comm'))} / {ms(p.comm)} | {b} |")
    return "\n".join(lines)
