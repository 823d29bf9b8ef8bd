"""The residual's lag against the final loss: what ``Auto(low_rank_lag=...)`` gates on.

Trains a workload's model on one process through gravac's own optimizer (local transport,
its config, data and optimizer) with one static method each: dense, PowerSGD at a rank,
Top-k at a CF. Every step the engine measures, in its gains' round, GraVAC's energy gain
‖C(g_ef)‖² / ‖g_ef‖² and the residual's lag Σ⟨r, g⟩ / Σ‖g‖² (r: the residual error
feedback adds to the step's raw gradient g; ``StepPlan.measure_lag``). Per method it
reports the final loss (mean of the last 10% of steps) against dense's, and the mean gain
and lag over the first steps (what a trial sees) and over the second half of the run
(what a run settles at), so one can read which measure separates the methods that end
near dense's loss from those that do not.

One process: a rank's residual and gradient, no exchange; Auto sums both terms over the
ranks. It answers what each measure says of a method's quality, not how fast it runs.

    .venv/bin/python benchmarks/residual_lag.py [--workloads lstm wide_cnn]
        [--methods dense powersgd:1 powersgd:4 sparse:10 sparse:40 sparse:100]
        [--steps N] [--lag 0.1] [--epsilon 0.7] [--result-set NAME]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
import result_set  # noqa: E402
from end_to_end import WORKLOADS  # noqa: E402
from layer_gains import endless_batches, one_process  # noqa: E402

from gravac.comm import LocalComm  # noqa: E402
from gravac.controllers import Auto, Method, Static  # noqa: E402
from gravac.engine import wrap_optimizer  # noqa: E402

#: Steps a trial measures at most in this table's "first steps" columns (Auto's default
#: trial: 1 settling step, 4 measured; the column takes steps 2-10 of a fresh run).
FIRST_STEPS = range(1, 10)


class _Measuring(Static):
    """A static method whose steps also agree their gains and the residual's lag (its
    decision stays Static's: send the method)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.lags: list[float] = []

    def plan(self, step: int):
        return dataclasses.replace(super().plan(step), needs_gains=True, measure_lag=True)

    def observe_lag(self, lag: float) -> None:
        self.lags.append(lag)


def train(workload: str, method: str, steps: int | None) -> list[dict]:
    """One run of ``method`` (``Method.parse``'s text) on ``workload``: per step its loss,
    energy gain and lag (None for dense)."""
    steps = WORKLOADS[workload][2] if steps is None else steps
    task, sgd = one_process(workload, steps)
    model = task.model
    m = Method.parse(method)
    if m.dense:
        opt = wrap_optimizer(sgd, model.named_parameters(), LocalComm(), compressor="none")
    elif m.kind == "powersgd":
        opt = wrap_optimizer(sgd, model.named_parameters(), LocalComm(), compressor="powersgd",
                             controller=_Measuring(rank=m.rank))
    else:
        opt = wrap_optimizer(sgd, model.named_parameters(), LocalComm(), compressor="topk",
                             controller=_Measuring(cf=m.level))
    rows, batches = [], endless_batches(task)
    while len(rows) < steps:
        batch = next(batches)
        opt.zero_grad()
        loss = task.loss(batch)
        loss.backward()
        opt.step()
        stats = opt.last_stats
        rows.append({"step": len(rows), "loss": float(loss.detach()),
                     "gain": stats.gain_min, "lag": stats.lag})
    return rows


def _mean(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.fmean(values) if values else None


def summarise(rows: list[dict]) -> dict:
    """Final loss (last 10% of steps) and mean gain and lag over the first steps and over
    the second half."""
    n = len(rows)
    first = [rows[i] for i in FIRST_STEPS if i < n]
    second = rows[n // 2:]
    return {"final_loss": _mean(rows[n - max(1, n // 10):], "loss"),
            "gain_first": _mean(first, "gain"), "lag_first": _mean(first, "lag"),
            "gain_second_half": _mean(second, "gain"), "lag_second_half": _mean(second, "lag")}


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "—" if value is None else format(value, spec)


def table(workload: str, summaries: dict[str, dict], lag: float, epsilon: float) -> list[str]:
    dense = summaries.get("dense", {}).get("final_loss")
    lines = [f"### {workload}", "",
             "| method | final loss | vs dense | gain, steps 2-10 | gain, 2nd half | "
             "lag, steps 2-10 | lag, 2nd half | gain >= ε (2nd half) | "
             "lag <= low_rank_lag (2nd half) |",
             "|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for method, s in summaries.items():
        vs = "—" if dense is None or method == "dense" else \
            f"{100 * (s['final_loss'] / dense - 1):+.1f}%"
        gain_ok = "" if s["gain_second_half"] is None else \
            ("yes" if s["gain_second_half"] >= epsilon else "no")
        lag_ok = "" if s["lag_second_half"] is None else \
            ("yes" if s["lag_second_half"] <= lag else "no")
        lines.append(f"| {method} | {s['final_loss']:.4f} | {vs} | {_fmt(s['gain_first'])} | "
                     f"{_fmt(s['gain_second_half'])} | {_fmt(s['lag_first'])} | "
                     f"{_fmt(s['lag_second_half'])} | {gain_ok} | {lag_ok} |")
    return lines + [""]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS),
                        default=["lstm", "wide_cnn"])
    parser.add_argument("--methods", nargs="+",
                        default=["dense", "powersgd:1", "powersgd:4", "sparse:10",
                                 "sparse:40", "sparse:100"])
    parser.add_argument("--steps", type=int, default=None,
                        help="steps per run (default: the workload's end-to-end steps)")
    parser.add_argument("--lag", type=float, default=0.1,
                        help="the low_rank_lag the last column compares with")
    parser.add_argument("--epsilon", type=float, default=0.7,
                        help="the ε the gain column compares with")
    result_set.add_argument(parser)
    args = parser.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        parser.error(f"argument --steps: must be >= 1, got {args.steps}")
    for text in args.methods:
        try:
            Method.parse(text)
        except ValueError as exc:
            parser.error(f"--methods {text}: {exc}")
    # The ranges controller: auto takes them in, checked by its own rules.
    for flag, option in (("--epsilon", {"epsilon": args.epsilon}),
                         ("--lag", {"low_rank_lag": args.lag})):
        try:
            Auto(**option)
        except ValueError as exc:
            parser.error(f"argument {flag}: {exc}")
    if args.result_set:
        result_set.check_name(args.result_set)
    torch.set_num_threads(1)
    steps_lines = []
    with result_set.recording_stdout() as printed:
        print(f"One process, local transport; torch {torch.__version__}; final loss: the "
              f"mean of the last 10% of steps; ε = {args.epsilon:g}, "
              f"low_rank_lag = {args.lag:g}", flush=True)
        print()
        for workload in args.workloads:
            summaries = {}
            for method in args.methods:
                rows = train(workload, method, args.steps)
                summaries[method] = summarise(rows)
                steps_lines += [json.dumps({"workload": workload, "method": method, **r})
                                for r in rows]
            print("\n".join(table(workload, summaries, args.lag, args.epsilon)), flush=True)
    result_set.keep(args.result_set, [], {"results.md": printed.getvalue(),
                                          "steps.jsonl": "\n".join(steps_lines) + "\n"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
