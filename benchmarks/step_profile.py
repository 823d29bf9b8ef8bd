"""Where a compressed step's time goes: the engine's phases for a workload and a method.

Trains the workload of benchmarks/end_to_end.py (same configs, seed and data) with each
method for --steps steps on 2 ranks inside hvd_scripts/bandwidth_sandbox.sh (or on the
host's loopback with --rate none), then prints, per method, the median over the steps
after --warmup of every phase the step record holds (gravac/engine/phases.py):

    compute | local work: control, NaN check, error feedback, selection, norms, residual,
    pack, unpack | waits: NaN flag, gains, exchange | update | step (t_iter)

and the step's floor: t_compute + (bytes this rank sent) / link rate, with the ratio of
the step to it (the target: <= 1.5 at a static 40x on the LSTM at 1 Gbit/s).

    sudo .venv/bin/python benchmarks/step_profile.py [--workload lstm]
        [--methods static_topk_40x gravac_recommended] [--rate 1gbit] [--steps 100]
        [--backend horovod] [--out runs/benchmarks/step_profile]

Methods are end_to_end.py's (its METHODS table). The timings are rank 0's (both ranks
run the same phases); ``--all-ranks`` has every rank write its own (``run.rank_phases``)
and adds a table per rank and the skew: per step, how much longer the busiest rank
computed, compressed and updated than the least busy one. A collective ends when its
last rank arrives, so that difference reappears as the other rank's waits. ``--rounds R`` runs the method list R times, interleaved (A B A B ...),
pools the steps of all rounds and shows each round's median step: this machine's speed
drifts by ~10-25% within minutes, so one run per method cannot tell a 5% change apart. Run it on a quiet machine: on 2 cores a second job slows every
memory-bound phase. Writes profile.md and profile.json under --out.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from end_to_end import (BACKENDS, METHODS, REPO, WORKLOADS, RunFailed,  # noqa: E402
                        bits_per_second, run_one)
import result_set  # noqa: E402

sys.path.insert(0, str(REPO))
from gravac.engine.phases import WAIT_PHASES  # noqa: E402
from gravac.engine.run_record import SENT_SKIPPED, STEP_TIME_FIELDS  # noqa: E402
from gravac.report import load_rank_steps, load_run  # noqa: E402
from gravac.report.stats import TIME_COLUMNS  # noqa: E402
from gravac.util.overrides import add_set_option  # noqa: E402

def profile(steps: list[dict], warmup: int, rate_bps: float | None, np_: int = 2) -> dict:
    """Median milliseconds of each phase over the steps after ``warmup``; the floor
    (compute + link time) for 2 ranks on a rate-limited link."""
    rows = [s for s in steps if s["step"] >= warmup and s.get("t_iter") is not None
            and s.get("sent") != SENT_SKIPPED]
    if not rows:
        raise SystemExit(f"step_profile.py: no timed steps after step {warmup}; raise --steps")

    def median_ms(name):
        values = [r[name] for r in rows if r.get(name) is not None]
        return 1000 * statistics.median(values) if values else None

    out = {name: median_ms(name) for name in STEP_TIME_FIELDS}
    out["bytes_sent"] = statistics.median(r.get("bytes_sent") or 0 for r in rows)
    out["steps"] = len(rows)
    out["cf"] = statistics.median(r["cf"] for r in rows)
    if rate_bps and out["t_compute"] is not None and np_ == 2:
        # The link is shared by both directions (bandwidth_sandbox.sh): with 2 ranks each
        # sends its bytes once, so the wire carries 2x a rank's bytes.
        link_ms = 1000 * 8 * 2 * out["bytes_sent"] / rate_bps
        out["link_ms"] = link_ms
        out["floor_ms"] = out["t_compute"] + link_ms
        out["step_over_floor"] = out["t_iter"] / out["floor_ms"]
    return out


def table(results: dict[str, dict], title: str) -> str:
    columns = TIME_COLUMNS
    lines = [f"### {title} (ms, medians)", "",
             "| method | CF | " + " | ".join(c for c, _ in columns) +
             " | MB sent | floor | step / floor | rounds |",
             "|---|---:|" + "---:|" * (len(columns) + 3) + "---|"]
    for name, r in results.items():
        cells = ["—" if r.get(key) is None else f"{r[key]:.1f}" for _, key in columns]
        floor = f"{r['floor_ms']:.1f}" if r.get("floor_ms") else "—"
        ratio = f"{r['step_over_floor']:.2f}" if r.get("step_over_floor") else "—"
        rounds = r.get("t_iter_rounds") or []
        spread = " / ".join(f"{t:.1f}" for t in rounds) if len(rounds) > 1 else "—"
        lines.append(f"| {name} | {r['cf']:g} | " + " | ".join(cells) +
                     f" | {r['bytes_sent'] / 1e6:.2f} | {floor} | {ratio} | {spread} |")
    lines += ["", "floor = compute + 2 x (bytes a rank sent) / link rate (both ranks' "
              "traffic shares the sandbox's one link); rounds: each round's median step."]
    return "\n".join(lines)


def busy_ms(record: dict) -> float:
    """A rank's own work in a step (compute, local compression work, update), in ms: the
    step minus what it spent waiting for the others."""
    return 1000 * sum(record.get(k) or 0.0 for k in ("t_compute", "t_compress", "t_update"))


def skew(by_rank: dict[int, list[dict]], warmup: int) -> dict:
    """Per step, the busiest rank's work minus the least busy rank's (ms): its median and
    90th percentile, and which rank was the busiest how often."""
    steps: dict[tuple[int, int], dict[int, float]] = {}
    for rank, records in by_rank.items():
        for r in records:
            if r["step"] >= warmup and r.get("sent") != SENT_SKIPPED and r.get("t_iter"):
                steps.setdefault((r.get("round", 0), r["step"]), {})[rank] = busy_ms(r)
    gaps, busiest = [], {}
    for per_rank in steps.values():
        if len(per_rank) == len(by_rank) > 1:
            gaps.append(max(per_rank.values()) - min(per_rank.values()))
            top = max(per_rank, key=per_rank.get)
            busiest[top] = busiest.get(top, 0) + 1
    if not gaps:
        return {}
    gaps.sort()
    return {"median_ms": statistics.median(gaps), "p90_ms": gaps[int(0.9 * (len(gaps) - 1))],
            "steps": len(gaps), "busiest": dict(sorted(busiest.items()))}


def rank_table(results: dict[str, dict], title: str) -> str:
    lines = [f"### {title}: every rank (ms, medians)", "",
             "| method | rank | compute | select | = local | " +
             " | ".join(p[2:] for p in WAIT_PHASES) + " | = waits | update | busy | step |",
             "|---|---:|" + "---:|" * (len(WAIT_PHASES) + 7)]
    notes = []
    for name, r in results.items():
        for rank, p in sorted(r.get("ranks", {}).items()):
            cells = ["—" if p.get(k) is None else f"{p[k]:.1f}" for k in
                     ("t_compute", "t_select", "t_compress", *WAIT_PHASES, "t_comm", "t_update")]
            busy = sum(p.get(k) or 0.0 for k in ("t_compute", "t_compress", "t_update"))
            lines.append(f"| {name} | {rank} | " + " | ".join(cells) +
                         f" | {busy:.1f} | {p['t_iter']:.1f} |")
        sk = r.get("skew")
        if sk:
            notes.append(f"{name}: the busiest rank's work exceeds the least busy one's by "
                         f"{sk['median_ms']:.1f} ms per step (median; 90th percentile "
                         f"{sk['p90_ms']:.1f} ms; {sk['steps']} steps; busiest: " +
                         ", ".join(f"rank {k} {v}x" for k, v in sk["busiest"].items()) + ")")
    lines += ["", "busy = compute + local work + update: the step without the waits."]
    return "\n".join(lines + [""] + notes)


def main() -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--workload", choices=list(WORKLOADS), default="lstm")
    parser.add_argument("--methods", nargs="+", default=["static_topk_40x", "gravac_recommended"],
                        choices=list(METHODS), metavar="METHOD",
                        help="what to profile (default: static_topk_40x gravac_recommended), "
                             "end_to_end.py's names: " + ", ".join(METHODS))
    parser.add_argument("--rate", default="1gbit",
                        help="sandbox link rate (100mbit, 1gbit, 10gbit), or none for the "
                             "host's loopback (no root needed)")
    parser.add_argument("--steps", type=int, default=100, help="steps per run (default: 100)")
    parser.add_argument("--warmup", type=int, default=20, help="steps left out of the medians")
    parser.add_argument("--np", type=int, default=2, help="ranks per run (default: 2)")
    parser.add_argument("--backend", default="horovod", choices=BACKENDS)
    parser.add_argument("--out", type=Path, default=REPO / "runs/benchmarks/step_profile")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the methods this many times, interleaved, and pool the steps")
    add_set_option(parser, dest="extra", help="extra config overrides for every run")
    parser.add_argument("--all-ranks", action="store_true",
                        help="every rank records its phases (run.rank_phases): a table per "
                             "rank and the skew between them")
    result_set.add_argument(parser)
    args = parser.parse_args()
    if args.result_set:
        result_set.check_name(args.result_set)
    if args.steps <= args.warmup:
        parser.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    if args.np < 1:
        parser.error(f"argument --np: must be >= 1, got {args.np}")
    try:
        rate_bps = bits_per_second(args.rate)
    except ValueError as exc:
        parser.error(f"argument --rate: {exc}")
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.all_ranks:
        args.extra = [*args.extra, "run.rank_phases=true"]
    pooled: dict[str, list] = {m: [] for m in args.methods}
    per_round: dict[str, list] = {m: [] for m in args.methods}
    ranks: dict[str, dict[int, list]] = {m: {} for m in args.methods}
    for round_ in range(args.rounds):
        out = args.out if args.rounds == 1 else args.out / f"round{round_ + 1}"
        for method in args.methods:
            try:
                run_dir = run_one(method, args.rate, args.steps, out, args.np, args.extra,
                                  args.workload, args.backend, sandbox=rate_bps is not None)
            except RunFailed as exc:      # every table compares the methods: stop here
                raise SystemExit(f"step_profile.py: {exc}") from None
            steps = load_run(run_dir).steps
            pooled[method] += steps
            for rank, records in load_rank_steps(run_dir).items():
                ranks[method].setdefault(rank, []).extend(
                    {**r, "round": round_} for r in records)
            per_round[method].append(profile(steps, args.warmup, rate_bps, args.np)["t_iter"])
    results = {}
    for method in args.methods:
        results[method] = profile(pooled[method], args.warmup, rate_bps, args.np)
        results[method]["t_iter_rounds"] = per_round[method]
        if ranks[method]:
            results[method]["ranks"] = {rank: profile(records, args.warmup, rate_bps, args.np)
                                        for rank, records in ranks[method].items()}
            results[method]["skew"] = skew(ranks[method], args.warmup)
    title = (f"{args.workload}, {args.np} ranks, {args.backend}, link {args.rate}, "
             f"steps {args.warmup}-{args.steps}")
    text = table(results, title)
    if args.all_ranks:
        text += "\n\n" + rank_table(results, title)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "profile.md").write_text(text + "\n")
    (args.out / "profile.json").write_text(json.dumps(results, indent=1))
    result_set.keep(args.result_set, [args.out / "profile.json", args.out / "profile.md"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
