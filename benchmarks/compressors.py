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
"""
from __future__ import annotations

import argparse

import torch

from gravac import compressors
from gravac.compressors import SelectContext, num_kept
from timing import median_time

TARGETS = {"randomk": 0.5, "dgc": 2.5, "redsync": 5.0, "topk": 4.0}


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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--cfs", type=float, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--compressors", nargs="+", default=["topk", "dgc", "redsync", "randomk"])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = run(args.sizes, args.cfs, args.compressors, args.repeats)
    print(f"torch {torch.__version__}, {args.threads} thread(s), median of {args.repeats}")
    print("| compressor | n | CF | select / x.abs() | select / abs into buffer | select (ms) "
          "| x.abs() (ms) | abs into buffer (ms) | target (vs x.abs()) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for name, n, cf, ratio, ratio_pure, t_ms, base_ms, pure_ms in rows:
        target = ""
        if n == 10_000_000 and cf == 100 and name in TARGETS:   # where the targets are set
            target = f"<= {TARGETS[name]}x " + ("met" if ratio <= TARGETS[name] else "MISSED")
        print(f"| {name} | {n:,} | {cf:g} | {ratio:.2f}x | {ratio_pure:.2f}x | {t_ms:.1f} | "
              f"{base_ms:.1f} | {pure_ms:.1f} | {target} |")


if __name__ == "__main__":
    main()
