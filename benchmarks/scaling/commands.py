"""What each subcommand of the command line does (``cli.py`` parses the arguments): read
the inputs, run the model, write the results. Bad input raises ``CliError``.

Example::

    args = build_parser().parse_args(["calibrate", "M.json", "--out", "L.json"])
    cmd_calibrate(args)                              # 0; L.json written
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from .calibration import calibrate
from .errors import CliError
from .local import NO_LOCAL, CompressionCosts, CpuSharing, contention
from .measure import measure_compression_concurrent
from .models import PAPER_MODELS, build_config_model, shapes_from_config, training_flops
from .network import Layout, Link, Network
from .plot import plot_projection
from .projection import project, projection_cases, projection_json, projection_markdown
from .runs import median_compute, read_steps
from .shapes import ModelShapes
from .validation import check_run, format_checks

REPO = Path(__file__).resolve().parents[2]
#: The command's name in what it prints.
PROG = "benchmarks/scaling"


def _read_json(path: Path, what: str, kind: str) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise CliError(f"{what} {path}: no such file") from None
    except json.JSONDecodeError as exc:
        raise CliError(f"{what} {path}: not JSON ({exc})") from None
    if data.get("kind") != kind:
        raise CliError(f"{what} {path}: not a {kind} file (kind {data.get('kind')!r})")
    return data


def _shown(path: Path) -> Path:
    """``path`` as a page names it: from the repository's root when inside it (a page
    must not carry the machine's own directories)."""
    try:
        return path.resolve().relative_to(REPO)
    except ValueError:
        return path


def _write(path: Path | None, text: str) -> None:
    if path is None:
        print(text)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    print(f"{PROG}: wrote {path}", file=sys.stderr)


def _duration(seconds: float) -> str:
    """A duration with a readable unit.

    >>> _duration(2.5e-9), _duration(3e-5)
    ('2.5 ns', '30 µs')
    """
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e9:.3g} ns"


def cmd_measure_compression(args) -> int:
    import torch

    torch.set_num_threads(args.threads)
    t0 = time.time()
    doc = measure_compression_concurrent(
        args.procs, args.threads, sizes=args.sizes, cfs=args.cfs, chunks=args.chunks,
        repeats=args.repeats, compressor=args.compressor, lowrank_shapes=args.lowrank_shapes,
        ranks=args.lowrank_ranks, seed=args.seed)
    doc["seconds"] = time.time() - t0
    f = doc["fits"]
    together = f", {args.procs} processes at once (the slowest each)" if args.procs > 1 else ""
    lines = [f"local costs ({args.compressor}, {args.threads} thread(s){together}, median of "
             f"{args.repeats}, {doc['seconds']:.0f}s):"]
    for name, fit in f.items():
        terms = ", ".join(f"{t} {_duration(c)}" for t, c in zip(fit["terms"], fit["coef"]))
        lines.append(f"  {name}: {terms} (max fit error {fit['max_rel_err'] * 100:.0f}%)")
    print("\n".join(lines), file=sys.stderr)
    _write(args.out, json.dumps(doc, indent=1) + "\n")
    return 0


def cmd_calibrate(args) -> int:
    docs = [_read_json(p, "measurement", "gravac.scaling.collectives") for p in args.inputs]
    keys = {(d["hosts"], d["slots"], d.get("link")) for d in docs}
    if len(keys) > 1:
        raise CliError(f"inputs: the files are of different layouts {sorted(keys, key=str)}; "
                       "calibrate one layout at a time")
    cal = calibrate(docs)
    cal["inputs"] = [str(p) for p in args.inputs]
    rows = [f"calibration of {cal['hosts']}x{cal['slots']} ({cal['n']} ranks, link "
            f"{cal['link']}, {cal['backend']}); α per ring step, β as Gbit/s:"]
    for scope, kinds in cal["by_ranks"].items():
        for kind, by_n in kinds.items():
            pooled = [("all", cal["links"][scope][kind])] if len(by_n) > 1 else []
            for n, fit in [*pooled, *by_n.items()]:
                rows.append(f"  {scope:5} {kind:9} ranks {n:>3}: "
                            f"α {fit['alpha_s'] * 1e6:9.1f} µs "
                            f" {fit['gbit_per_s']:8.3g} Gbit/s  fit error max "
                            f"{fit['max_rel_err'] * 100:.0f}% rms {fit['rms_rel_err'] * 100:.0f}% "
                            f"({fit['points']} points)")
    for kind, fit in cal.get("lockstep", {}).items():
        rows.append(f"  lockstep {kind:6}: a step's CPU phase x{fit['step_factor']:.2f} the work "
                    f"alone (a rank's own work x{fit['own_factor']:.2f}), sync "
                    f"{fit['sync_s'] * 1e3:.1f} ms ({fit['points']} points"
                    + (f" of {fit['runs']} runs" if fit.get("runs", 1) > 1 else "") + ")")
    print("\n".join(rows), file=sys.stderr)
    _write(args.out, json.dumps(cal, indent=1) + "\n")
    return 0


def _compute_spec(text: str | None, ranks: int | None, warmup: int):
    """--compute: seconds (at --compute-ranks ranks) or a reference run directory."""
    if text is None:
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = None
    if seconds is not None:
        if not seconds > 0:
            raise CliError(f"--compute: must be > 0 seconds or a run directory, got {text}")
        return seconds, ranks or 2
    run = Path(text)
    if not run.is_dir():
        raise CliError(f"--compute: {text} is neither seconds nor a run directory")
    steps = read_steps(run, warmup)
    own = median_compute(steps)
    if own is None:
        raise CliError(f"--compute: run {text} has no t_compute records (use a gravac run)")
    return own, ranks or int(steps[0].get("world_size") or 2)


def _compute_text(compute: tuple[float, int]) -> str:
    return f"{compute[0] * 1e3:.1f} ms at {compute[1]} ranks"


def cmd_validate(args) -> int:
    cal = _read_json(args.calibration, "--calibration", "gravac.scaling.calibration")
    net = Network.from_calibration(cal)
    costs = CompressionCosts.from_json(
        _read_json(args.compression, "--compression", "gravac.scaling.compression")) \
        if args.compression else NO_LOCAL
    hosts = args.hosts or cal.get("hosts")
    slots = args.slots or cal.get("slots")
    layout = Layout(int(hosts), int(slots)) if hosts and slots else None
    compute = _compute_spec(args.compute, args.compute_ranks, args.warmup)
    sharing = None if args.assume_contention else CpuSharing.from_calibration(cal)
    compute_sharing = None
    if args.compute_calibration is not None and sharing is not None:
        ref_cal = _read_json(args.compute_calibration, "--compute-calibration",
                             "gravac.scaling.calibration")
        compute_sharing = CpuSharing.from_calibration(ref_cal)
        if compute_sharing is None:
            raise CliError(f"--compute-calibration {args.compute_calibration}: no lockstep "
                           "fits (measure the collectives again with --lockstep-ms)")
    plain_net = None
    if args.plain_calibration is not None:
        plain = _read_json(args.plain_calibration, "--plain-calibration",
                           "gravac.scaling.calibration")
        if (plain.get("hosts"), plain.get("slots")) != (cal.get("hosts"), cal.get("slots")):
            raise CliError(f"--plain-calibration {args.plain_calibration}: layout "
                           f"{plain.get('hosts')}x{plain.get('slots')}, but --calibration is "
                           f"{cal.get('hosts')}x{cal.get('slots')}; give one of the same layout")
        plain_net = Network.from_calibration(plain)
    checks = [check_run(Path(r), net, costs, layout, compute, args.cores, args.warmup,
                        sharing, compute_sharing, plain_net)
              for r in args.runs]
    if sharing is None:
        cpu = f"contention x{contention(layout.n, args.cores):g} assumed"
    else:
        cpu = ("CPU phase measured (lockstep): compute x" + f"{sharing.step['gemm']:.2f}, "
               f"local work x{sharing.step['stream']:.2f}"
               + (f", shared_index's leader selecting x{sharing.solo:.2f}"
                  if sharing.solo is not None else "") + " their time alone")
    text = (f"Layout {layout} ({layout.n} ranks on {args.cores} cores: {cpu}), "
            f"calibration {args.calibration}, "
            + (f"plain Horovod runs' links {args.plain_calibration}, "
               if args.plain_calibration else "") +
            f"compression costs {args.compression or 'none'}, compute "
            f"{'each run its own' if compute is None else _compute_text(compute)}"
            f"; medians of the steps after {args.warmup}.\n\n"
            + format_checks(checks, args.tolerance))
    _write(args.out, text + "\n")
    worst = max(abs(c.error) for c in checks)
    if worst > args.tolerance:
        print(f"{PROG}: largest error {worst * 100:.1f}% exceeds --tolerance "
              f"{args.tolerance * 100:.0f}%", file=sys.stderr)
        return 1
    return 0


def _projection_models(args) -> list[tuple[ModelShapes, float, str]]:
    """(shapes, compute seconds, where the compute time comes from) per model asked."""
    given = {}
    for item in args.compute_ms or []:
        name, _, value = item.partition("=")
        try:
            given[name] = float(value) / 1e3
        except ValueError:
            raise CliError(f"--compute-ms: expected MODEL=MS, got {item!r}") from None
    out = []
    for path in args.shapes or []:
        try:
            data = json.loads(Path(path).read_text())
            m = ModelShapes.from_json(data)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CliError(f"--shapes {path}: not a shapes file (JSON with name, "
                           f"min_compress_numel, params: [[name, shape], ...]): {exc}") from None
        t = given.get(m.name, data.get("compute_s"))
        if t is None:
            raise CliError(f"--shapes {path}: give its compute time with --compute-ms {m.name}=MS")
        out.append((m, t, "given" if m.name in given else "from the shapes file"))
    for key in args.models:
        path = REPO / PAPER_MODELS[key] if key in PAPER_MODELS else Path(key)
        if not path.is_file():
            raise CliError(f"--models: {key} is neither {', '.join(PAPER_MODELS)} "
                           "nor a config file")
        from gravac.train.config import ConfigError, load_config   # only for real models

        try:
            cfg = load_config([path])
        except ConfigError as exc:
            raise CliError(f"--models {key}: {exc}") from None
        built = build_config_model(cfg)
        m = shapes_from_config(cfg, name=key if key in PAPER_MODELS else cfg.model.name,
                               built=built)
        if m.name in given:
            out.append((m, given[m.name], "given with --compute-ms"))
        else:
            flops = training_flops(cfg, built)
            out.append((m, flops / (args.device_tflops * 1e12),
                        f"{flops / 1e9:.0f} GFLOP forward+backward at batch "
                        f"{cfg.data.batch_size} / {args.device_tflops:g} TFLOP/s assumed"))
    return out


def cmd_project(args) -> int:
    ns = args.n or [2 ** i for i in range(3, 11)]
    bad = [n for n in ns if n % args.slots]
    if bad:
        raise CliError(f"--n: {bad} not multiples of --slots {args.slots}")
    costs = NO_LOCAL
    local_note = "local compression not modelled (no --compression)"
    if args.compression:
        costs = CompressionCosts.from_json(
            _read_json(args.compression, "--compression", "gravac.scaling.compression"))
        costs = costs.scaled(1.0 / args.compression_speedup)
        local_note = (f"local compression costs from {args.compression}"
                      + (f" / {args.compression_speedup:g}"
                         if args.compression_speedup != 1 else ""))
    alpha = args.alpha_us * 1e-6
    alpha_note = f"α {args.alpha_us:g} µs (assumed)"
    if args.calibration:
        cal = _read_json(args.calibration, "--calibration", "gravac.scaling.calibration")
        fit = cal["links"].get("inter", {}).get("allreduce")
        if fit is None:
            raise CliError(f"--calibration {args.calibration}: no inter-host allreduce fit "
                           "(calibrate a layout with 2+ hosts)")
        alpha = fit["alpha_s"]
        alpha_note = f"α {alpha * 1e6:.1f} µs from {args.calibration}"
    local = Link.from_gbit(args.local_gbit, args.local_alpha_us * 1e-6)
    cases = projection_cases(args.cfs, args.ranks, args.exchanges)
    parts = [f"Projection: links {', '.join(f'{g:g}' for g in args.links)} Gbit/s, {alpha_note}; "
             f"inside a host {local.describe()} (assumed); {local_note}; "
             f"t_step = t_compute + t_local + t_comm.", ""]
    results = []
    for model, compute_s, source in _projection_models(args):
        p = project(model, compute_s, source, args.links, ns, args.slots, cases, alpha, local,
                    costs, args.max_n)
        parts.append(projection_markdown(p, args.max_n))
        results.append(projection_json(p))
        if args.plot_dir:
            path = Path(args.plot_dir) / f"scaling_{model.name}.png"
            plot_projection(p, path)
            parts.append(f"Plot: `{_shown(path)}`\n")
    _write(args.out, "\n".join(parts))
    if args.json:
        _write(args.json, json.dumps({"kind": "gravac.scaling.projection",
                                      "alpha_s": alpha, "local": [local.alpha_s,
                                                                  local.beta_s_per_byte],
                                      "models": results}, indent=1) + "\n")
    return 0


def cmd_measure_collectives(args, rest) -> int:
    from benchmarks.collectives import main as collectives_main

    return collectives_main(rest, prog=f"{PROG} measure-collectives")
