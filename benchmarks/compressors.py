"""Time per compressor `select`, as a ratio to one elementwise pass (`x.abs()`).

`x.abs()` allocates its result: at 10M floats (40 MB, above glibc's mmap threshold) that
allocation's page faults cost more than the arithmetic, and at 1M it depends on the
allocator's state. So the table also gives the ratio to `abs` into a preallocated buffer,
the pure cost of one pass.

For each compressor and CF 10/100/1000 on 1M- and 10M-element float32 tensors, on one CPU
thread, prints the median time of `select(x, k)` divided by the median time of `x.abs()`
measured in the same run (ratios, not seconds: machines are shared and noisy).

    .venv/bin/python benchmarks/compressors.py [--sizes 1000000 10000000] [--repeats 7]

Targets at 10M elements, CF 100: randomk <= 0.5x, dgc <= 2.5x, redsync <= 5x, topk <= 4x.

On a GPU (`--device cuda`; sizes 10M, 30M and 100M by default) the calls are timed with
CUDA events, rotating through three random input tensors of each size (never the same
tensor twice in a row: 100M floats are 400 MB, but 10M are 40 MB, under the L2 cache),
after a warm-up. "One pass" is the faster of `x.abs()` and `x.clone()` (both read and
write every entry once), measured in the same run on the same inputs. A first table per
size gives those, `torch.topk` of |x| (the plain exact reference) and the Top-k phases at
CF 100 (sample threshold, candidates, top-k among them); the second every compressor;
the device and the target verdict come last (under 50 lines in all, for a log's tail):

    python benchmarks/compressors.py --device cuda [--json compressors_cuda.json]

Target on an H200: topk at 100M elements, CF 100, <= 2.5x one pass (CUDA_TARGETS).

Where Triton is importable, `topk[triton]` is Top-k with `device_candidates="triton"`
(gravac/compressors/triton_candidates.py) on its sampled path at every size (its
`device_direct_below` lowered to 65,536, so that 10M compares with `torch.topk` too), and
the phases table gains its candidate kernels and the top-k among their magnitudes.
`topk` is the default (`device_candidates="auto"`: Triton's kernels above 16M entries on
a CUDA GPU), `topk[torch pass]` the same with torch's candidate pass.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from gravac import compressors
from gravac.compressors import SelectContext, num_kept, triton_candidates
import result_set
from timing import cuda_times, median_time

TARGETS = {"randomk": 0.5, "dgc": 2.5, "redsync": 5.0, "topk": 4.0}
#: What --compressors may name on any device: the registry's sparsifiers (select(x, k));
#: PowerSGD is low rank, it selects nothing.
SPARSIFIERS = tuple(name for name, cls in compressors.REGISTRY.items() if not cls.is_lowrank)
#: Pseudo-compressor: torch.topk over |x| (the exact reference), for comparison.
TORCH_TOPK = "torch.topk"
#: Pseudo-compressor: Top-k whose candidates come from the Triton kernels, sampled path
#: at every size.
TRITON_TOPK = "topk[triton]"
#: Pseudo-compressor: Top-k with torch's candidate pass (``device_candidates="torch"``),
#: what "topk" (its default "auto": Triton's kernels on a CUDA GPU) is measured against.
TORCH_PASS_TOPK = "topk[torch pass]"
#: The pseudo-compressors, measured on the GPU only.
CUDA_ONLY = (TORCH_TOPK, TRITON_TOPK, TORCH_PASS_TOPK)
#: (compressor, n, CF) -> most multiples of one pass allowed on the GPU.
CUDA_TOPK_TARGET = 2.5
CUDA_TARGETS = {(name, 100_000_000, 100): CUDA_TOPK_TARGET
                for name in ("topk", TRITON_TOPK, TORCH_PASS_TOPK)}
#: The Top-k phases, in the table's order (the Triton ones only where it is importable).
PHASES = ["sample -> threshold", "candidates: trunc(x / t) as 2 bytes, nonzero",
          "(the same, threshold a 0-d device tensor)", "(plain scan: abs(x) >= t, nonzero)",
          "top-k among the candidates", "candidates: Triton count + write",
          "top-k among the Triton candidates"]


def run(sizes, cfs, names, repeats, seed=0):
    rows = []
    for n in sizes:
        x = torch.randn(n, generator=torch.Generator().manual_seed(seed))
        base = median_time(lambda: x.abs(), repeats)
        out = torch.empty_like(x)
        pure = median_time(lambda: torch.abs(x, out=out), repeats)   # no allocation
        for name in names:
            comp = compressors.get(name)
            for cf in cfs:
                k = num_kept(n, cf)
                step = iter(range(10**9))
                t = median_time(lambda: comp.select(x, k, SelectContext(step=next(step))), repeats)
                rows.append((name, n, cf, t / base, t / pure, t * 1e3, base * 1e3, pure * 1e3))
    return rows


def _selector(name, k):
    if name == TORCH_TOPK:
        return lambda x, i: torch.topk(x.abs(), k, sorted=False).indices
    comp = (compressors.get("topk", device_candidates="triton", device_direct_below=65_536)
            if name == TRITON_TOPK else compressors.get("topk", device_candidates="torch")
            if name == TORCH_PASS_TOPK else compressors.get(name))
    return lambda x, i: comp.select(x, k, SelectContext(step=i))


def _summary(samples):
    ms = sorted(s * 1e3 for s in samples)
    return {"median_ms": statistics.median(ms), "min_ms": ms[0], "max_ms": ms[-1],
            "samples_ms": [round(v, 5) for v in ms]}


def _topk_phases(n, xs, repeats, timer=cuda_times):
    """The Top-k accelerator path at CF 100 split into its phases, each timed alone on
    inputs prepared by the phase before it; and, for comparison, the same candidate pass
    with the threshold as a 0-d device tensor (no host sync for it, but torch's strided
    broadcast kernel) and the plain candidate scan (|x| >= t, then nonzero) that the
    2-byte quotient pass replaces; where Triton is importable, its candidate kernels
    (with the threshold on the device) and the top-k among the magnitudes they return."""
    comp = compressors.get("topk")
    k = num_kept(n, 100)
    on_device = [comp._device_threshold(x, k, SelectContext(step=j)) for j, x in enumerate(xs)]
    thresholds = [t.item() for t in on_device]          # the torch path's host scalars
    as_x = [t.to(x.dtype) for x, t in zip(xs, on_device)]
    candidates = [comp._device_candidates(x, t) for x, t in zip(xs, thresholds)]
    by_x = {id(x): j for j, x in enumerate(xs)}
    phases = {
        "sample -> threshold": lambda x, i: comp._device_threshold(x, k, SelectContext(step=i)),
        "candidates: trunc(x / t) as 2 bytes, nonzero":
            lambda x, i: comp._device_candidates(x, thresholds[by_x[id(x)]]),
        "(the same, threshold a 0-d device tensor)":
            lambda x, i: comp._device_candidates(x, as_x[by_x[id(x)]]),
        "(plain scan: abs(x) >= t, nonzero)":
            lambda x, i: (x.abs() >= thresholds[by_x[id(x)]]).nonzero(),
        "top-k among the candidates":
            lambda x, i: comp._top_of_candidates(x, candidates[by_x[id(x)]], k),
    }
    if triton_candidates.runs_on(xs[0].device):
        fused = [triton_candidates.candidates_at_or_above(x, t) for x, t in zip(xs, on_device)]
        phases["candidates: Triton count + write"] = \
            lambda x, i: triton_candidates.candidates_at_or_above(x, on_device[by_x[id(x)]])
        phases["top-k among the Triton candidates"] = \
            lambda x, i: comp._top_of_candidates(x, fused[by_x[id(x)]][0], k,
                                                 fused[by_x[id(x)]][1])
    rows = []
    for phase, fn in phases.items():
        rows.append({"phase": phase, "n": n, "cf": 100,
                     "candidates_per_k": sum(c.numel() for c in candidates) / (len(xs) * k),
                     **_summary(timer(fn, xs, repeats))})
    return rows


def run_cuda(sizes, cfs, names, repeats, seed=0, inputs=3, device=None, timer=cuda_times):
    """Rows (dicts) for every (compressor, n, CF), the one-pass baselines, and the Top-k
    phases. A row whose call raised carries the error instead of times. ``device`` and
    ``timer`` are the current CUDA device and ``cuda_times`` except in the CPU dry run
    of the tests."""
    dev = device or torch.device("cuda", torch.cuda.current_device())
    rows, phases = [], []
    for n in sizes:
        g = torch.Generator(device=dev).manual_seed(seed + n)
        xs = [torch.randn(n, device=dev, generator=g) for _ in range(inputs)]
        base = {"x.abs()": _summary(timer(lambda x, i: x.abs(), xs, repeats)),
                "x.clone()": _summary(timer(lambda x, i: x.clone(), xs, repeats))}
        one_pass = min(b["median_ms"] for b in base.values())
        for name in names:
            for cf in cfs:
                k = num_kept(n, cf)
                row = {"compressor": name, "n": n, "cf": cf, "k": k,
                       "abs_ms": base["x.abs()"]["median_ms"],
                       "clone_ms": base["x.clone()"]["median_ms"], "one_pass_ms": one_pass}
                try:
                    row.update(_summary(timer(_selector(name, k), xs, repeats)))
                    row["per_pass"] = row["median_ms"] / one_pass
                    bound = CUDA_TARGETS.get((name, n, cf))
                    if bound is not None:
                        row["target"] = bound
                        row["met"] = row["per_pass"] <= bound
                except Exception as err:                     # report it, keep measuring
                    row["error"] = f"{type(err).__name__}: {err}"
                rows.append(row)
        try:
            phases += _topk_phases(n, xs, repeats, timer)
        except Exception as err:
            phases.append({"phase": "error", "n": n, "error": f"{type(err).__name__}: {err}"})
        del xs
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return rows, phases


def _cuda_header(repeats):
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    l2 = getattr(props, "L2_cache_size", 0)
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "multiprocessors": props.multi_processor_count,
            "l2_mb": round(l2 / 2**20, 1) if l2 else None, "repeats": repeats}


def _ms(row):
    return "ERROR" if row is None or "error" in row else f"{row['median_ms']:.3f}"


def print_cuda(header, rows, phases):
    """Per size: the one-pass baselines, torch.topk and the Top-k phases; then every
    compressor's time and ratio; the device and the target verdict last (a log's tail
    keeps them)."""
    names = [p for p in PHASES if any(q["phase"] == p for q in phases)]
    triton = len(names) > 5
    cfs = sorted({r["cf"] for r in rows})
    sizes = sorted({r["n"] for r in rows})
    print(f"Per size (ms): one pass, {TORCH_TOPK}(abs(x)) at each CF, and the Top-k phases at "
          "CF 100 each timed alone (sample and threshold, candidates, the same with a 0-d "
          "device threshold, the plain scan they replace, top-k among them"
          + ("; Triton's candidate kernels, top-k among their magnitudes)" if triton else ")"))
    print("| n | x.abs() | x.clone() | " + " | ".join(f"{TORCH_TOPK} CF {cf:g}" for cf in cfs)
          + " | sample | candidates | (0-d t) | (plain scan) | top-k of candidates "
          + ("| Triton candidates | top-k of them " if triton else "") + "| candidates / k |")
    print("|---:" * (3 + len(cfs) + len(names) + 1) + "|")
    for n in sizes:
        first = next(r for r in rows if r["n"] == n)
        ref = {r["cf"]: r for r in rows if r["n"] == n and r["compressor"] == TORCH_TOPK}
        ph = {p["phase"]: p for p in phases if p["n"] == n}
        ratio = next((p["candidates_per_k"] for p in ph.values() if "candidates_per_k" in p), None)
        print(f"| {n:,} | {first['abs_ms']:.3f} | {first['clone_ms']:.3f} | "
              + " | ".join(_ms(ref.get(cf)) if cf in ref else "" for cf in cfs) + " | "
              + " | ".join(_ms(ph.get(name)) for name in names)
              + f" | {'' if ratio is None else f'{ratio:.3f}'} |")
        if "error" in ph:
            print(f"|  phases ERROR: {ph['error']['error']} |")
    print()
    print("| compressor | n | CF | select (ms) | select / one pass | target |")
    print("|---|---:|---:|---:|---:|---|")
    for r in rows:
        if r["compressor"] == TORCH_TOPK:
            continue
        if "error" in r:
            print(f"| {r['compressor']} | {r['n']:,} | {r['cf']:g} | ERROR: {r['error']} | | |")
            continue
        target = ""
        if "target" in r:
            target = f"<= {r['target']:g}x " + ("met" if r["met"] else "MISSED")
        print(f"| {r['compressor']} | {r['n']:,} | {r['cf']:g} | {r['median_ms']:.3f} "
              f"| {r['per_pass']:.2f}x | {target} |")
    print()
    print(f"{header['device']} ({header['multiprocessors']} SMs, L2 {header['l2_mb']} MB), "
          f"torch {header['torch']}, CUDA {header['cuda']}; CUDA-event times, median of "
          f"{header['repeats']} calls rotating over 3 random inputs; one pass = the faster "
          "of x.abs() and x.clone()")
    for r in rows:
        if "target" in r:
            print(f"TARGET {r['compressor']} n={r['n']:,} CF {r['cf']:g}: "
                  f"{r['median_ms']:.3f} ms = {r['per_pass']:.2f}x one pass "
                  f"({r['one_pass_ms']:.3f} ms), target <= {r['target']:g}x: "
                  + ("met" if r["met"] else "MISSED"))


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--sizes", type=int, nargs="+", default=None,
                        help="default: 1M 10M on cpu, 10M 30M 100M on cuda")
    parser.add_argument("--cfs", type=float, nargs="+", default=[10, 100, 1000],
                        help="compression factors, each >= 1 (default: 10 100 1000)")
    parser.add_argument("--compressors", nargs="+", default=None, metavar="NAME",
                        help=f"sparsifiers: {', '.join(SPARSIFIERS)}; cuda also "
                             f"{', '.join(CUDA_ONLY)} (default: topk dgc redsync randomk; "
                             f"cuda: also {TORCH_TOPK}, {TORCH_PASS_TOPK}, and {TRITON_TOPK} "
                             "where Triton is installed)")
    parser.add_argument("--repeats", type=int, default=None, help="default: 7 cpu, 25 cuda")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", metavar="PATH", help="also write every row to PATH")
    result_set.add_argument(parser)
    args = parser.parse_args(argv)
    valid = SPARSIFIERS + (CUDA_ONLY if args.device == "cuda" else ())
    for name in args.compressors or []:
        if name not in valid:
            why = (" here: it is measured with --device cuda only" if name in CUDA_ONLY else
                   " (low rank: it selects no entries; benchmarks/scaling measures it)"
                   if name in compressors.REGISTRY else "")
            parser.error(f"argument --compressors: {name!r} is not a sparsifier{why}; "
                         f"choose from {', '.join(valid)}")
    if any(not cf >= 1 for cf in args.cfs):
        parser.error(f"argument --cfs: each must be >= 1 (1 = dense), got "
                     f"{' '.join(f'{cf:g}' for cf in args.cfs)}")
    if args.json and not Path(args.json).resolve().parent.is_dir():
        parser.error(f"argument --json: no folder {Path(args.json).parent} to write "
                     f"{Path(args.json).name} in")
    if args.json and Path(args.json).is_dir():
        parser.error(f"argument --json: {args.json} is a directory; give a file's path")
    if args.result_set:
        result_set.check_name(args.result_set)
    with result_set.recording_stdout() as printed:
        data = measure(args)
    texts = {"results.md": printed.getvalue(), "compressors.json": json.dumps(data, indent=1)}
    if args.json:
        Path(args.json).write_text(texts["compressors.json"])
    result_set.keep(args.result_set, [], texts)
    failed = [r for r in data["rows"] + data.get("topk_phases", []) if "error" in r]
    if failed:
        sys.exit(f"{len(failed)} row(s) raised an error (see the table)")


def measure(args) -> dict:
    """Print the table for ``args`` and return every row (with the set-up) as data."""
    names = args.compressors or ["topk", "dgc", "redsync", "randomk"]
    cfs = [int(cf) if float(cf).is_integer() else cf for cf in args.cfs]
    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("--device cuda: torch.cuda.is_available() is False (a CPU build of "
                     "torch, or no GPU visible)")
        if args.compressors is None:
            names = names + [TORCH_TOPK, TORCH_PASS_TOPK] + (
                [TRITON_TOPK] if triton_candidates.runs_on(torch.device("cuda")) else [])
        repeats = args.repeats or 25
        header = _cuda_header(repeats)
        rows, phases = run_cuda(args.sizes or [10_000_000, 30_000_000, 100_000_000],
                                cfs, names, repeats)
        print_cuda(header, rows, phases)
        return {**header, "rows": rows, "topk_phases": phases}
    torch.set_num_threads(args.threads)
    repeats = args.repeats or 7
    rows = run(args.sizes or [1_000_000, 10_000_000], args.cfs, names, repeats)
    print(f"torch {torch.__version__}, {args.threads} thread(s), median of {repeats}")
    print("| compressor | n | CF | select / x.abs() | select / abs into buffer | select (ms) "
          "| x.abs() (ms) | abs into buffer (ms) | target (vs x.abs()) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for name, n, cf, ratio, ratio_pure, t_ms, base_ms, pure_ms in rows:
        target = ""
        if n == 10_000_000 and cf == 100 and name in TARGETS:   # where the targets are set
            target = f"<= {TARGETS[name]}x " + ("met" if ratio <= TARGETS[name] else "MISSED")
        print(f"| {name} | {n:,} | {cf:g} | {ratio:.2f}x | {ratio_pure:.2f}x | {t_ms:.1f} | "
              f"{base_ms:.1f} | {pure_ms:.1f} | {target} |")
    keys = ("compressor", "n", "cf", "per_abs", "per_abs_into_buffer", "median_ms",
            "abs_ms", "abs_into_buffer_ms")
    return {"device": "cpu", "torch": torch.__version__, "threads": args.threads,
            "repeats": repeats, "rows": [dict(zip(keys, r)) for r in rows]}


if __name__ == "__main__":
    main()
