"""End-to-end comparison on a rate-limited link: what a user runs without gravac (DDP, its
fp16 and PowerSGD hooks, Horovod dense and fp16) against gravac's methods (static
compressors, Accordion, GraVAC, controller: auto), ranks in bandwidth-limited network
namespaces, on Horovod (horovodrun) and/or torch.distributed (torchrun).

For each rate (default 1gbit and 100mbit) it trains the same workload, with the same seed,
data and step count, once per method, inside hvd_scripts/bandwidth_sandbox.sh (rate
``none``: on the host's plain loopback, no sandbox). Workloads (--workload): ``lstm``
(configs/benchmarks/e2e_lstm_zipf.yaml: a 2-layer LSTM with a 20,000-word vocabulary on
generated text with Zipf word frequencies, 5.4M parameters; the default), ``wide_cnn`` (configs/benchmarks/e2e_wide_cnn.yaml: a communication-bound CNN
on generated images with 40% label noise) and ``resnet18`` (configs/benchmarks/
e2e_resnet18.yaml: CIFAR-style ResNet-18, 11.2M parameters, on generated images). It
prints per method, as ratios to the dense run of the same invocation and rate:

  samples/s (steady state: steps after the first 10), time to a target training loss (the
  dense run's smoothed loss at 80% of its steps), final loss (mean of the last 10% of
  steps), floats sent relative to dense, and GraVAC's CF history.

    .venv/bin/python benchmarks/end_to_end.py [--workload lstm|wide_cnn|resnet18]
        [--rates 1gbit 100mbit 10gbit] [--steps N] [--methods dense horovod_fp16 gravac_auto ...]
        [--backend horovod torch] [--np 2] [--hosts 1] [--rounds 2] [--out runs/benchmarks/e2e]

--rounds N runs the whole set N times (round r under --out/round<r>/; even rounds in the
reverse order, so a machine that drifts during the invocation favours no method) and ends
with a table of each method's ratios to its own round's dense run: every round's, their
median and range. On a shared machine one round's ratio can move by 10-20%; the spread
says whether a target is met or only touched.

--backend picks the transports (default horovod). Under torch, "dense" is PyTorch DDP and
"horovod_fp16" is DDP with its fp16 compression hook: what a torchrun user runs without
gravac. Each backend's ratios are to its own dense run; with both backends a last table
compares each method's samples/s across them (torch / horovod), in the same invocation.

A rate other than none needs the rights to create network namespaces (root). Each run's
directory, a results.md and results.json, and a gravac.report per rate (dense as baseline)
go under --out. A run that fails does not stop the others: the failures are listed at the
end (and in results.md), the exit status is 1 and no result set is kept; where dense
fails, the rest of its rate and backend is not run (nothing to compare with).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
import result_set  # noqa: E402
from gravac.util.overrides import add_set_option  # noqa: E402
# name -> (config file, Accordion's compression file (the paper's per model kind), steps)
WORKLOADS = {
    "lstm": ("configs/benchmarks/e2e_lstm_zipf.yaml", "accordion_lstm.yaml", 300),
    "wide_cnn": ("configs/benchmarks/e2e_wide_cnn.yaml", "accordion_cnn.yaml", 150),
    "resnet18": ("configs/benchmarks/e2e_resnet18.yaml", "accordion_cnn.yaml", 100),
}

# name -> (compression file, extra --set overrides); "{accordion}" is the workload's file.
METHODS: dict[str, tuple[str, list[str]]] = {
    "dense": ("dense.yaml", []),
    "horovod_fp16": ("horovod_fp16.yaml", []),
    # What a plain Horovod user runs: Horovod's own 1 ms background cycle (gravac's trainer
    # picks 5 ms where ranks crowd the cores: run.horovod_cycle_time_ms, docs/notes/2026-11-benchmarks.md §4).
    "dense_cycle_1ms": ("dense.yaml", ["run.horovod_cycle_time_ms=horovod"]),
    "horovod_fp16_cycle_1ms": ("horovod_fp16.yaml", ["run.horovod_cycle_time_ms=horovod"]),
    # PyTorch DDP's PowerSGD hook (--backend torch only), 10% of the run's steps plain first
    # (30 of 300; PyTorch's default of 1000 would never start here).
    "ddp_powersgd_rank1": ("ddp_powersgd_rank1.yaml",
                           ["compression.ddp_start_powersgd_iter={powersgd_start}"]),
    "ddp_powersgd_rank4": ("ddp_powersgd_rank4.yaml",
                           ["compression.ddp_start_powersgd_iter={powersgd_start}"]),
    # gravac's PowerSGD (either transport) and Accordion on it (rank 4 <-> 1, the paper's
    # Table 4), intervals shortened like Accordion's above.
    "gravac_powersgd_rank4": ("static_powersgd_rank4.yaml", []),
    "accordion_powersgd": ("accordion_powersgd.yaml", ["compression.accordion.interval_steps=25",
                                                       "compression.accordion.switch_freq=2"]),
    "static_topk_10x": ("static_topk_10x.yaml", []),
    "static_topk_40x": ("static_topk_10x.yaml", ["compression.cf=40"]),
    "static_topk_1000x": ("static_topk_1000x.yaml", []),
    # Overlap with backward (docs/ALGORITHM.md §12): buckets of 1 MiB (the LSTM's
    # 21.6 MB would be two buckets at the default 25: the output layer, then the rest); "gravac_dense" is gravac's own dense path (CF 1), what GraVAC runs once
    # settled on dense, against Horovod's and DDP's, which overlap already.
    "static_topk_40x_overlap": ("static_topk_10x.yaml", ["compression.cf=40",
                                                        "compression.overlap=true",
                                                        "compression.bucket_cap_mb=1"]),
    "gravac_dense": ("static_topk_10x.yaml", ["compression.cf=1"]),
    "gravac_dense_overlap": ("static_topk_10x.yaml", ["compression.cf=1",
                                                     "compression.overlap=true",
                                                     "compression.bucket_cap_mb=1"]),
    # Accordion's intervals are epochs in the paper; here runs are a few hundred steps.
    "accordion": ("{accordion}", ["compression.accordion.interval_steps=25",
                                  "compression.accordion.switch_freq=2"]),
    # GraVAC as the paper specifies it (exponential Top-k, window 25 to fit a short run), then
    # each extension of docs/ALGORITHM.md §8 alone, then E1-E3 together.
    "gravac_paper": ("gravac_exp_topk.yaml", ["compression.gravac.window=25"]),
    "gravac_e1_scale_eps": ("gravac_exp_topk.yaml", ["compression.gravac.window=25",
                                                     "compression.gravac.scale_up=epsilon"]),
    "gravac_e2_dense_probe": ("gravac_exp_topk.yaml", ["compression.gravac.window=25",
                                                       "compression.gravac.dense_probe_steps=5"]),
    "gravac_e3_settle_dense": ("gravac_exp_topk.yaml", ["compression.gravac.window=25",
                                                        "compression.gravac.settle_dense=true"]),
    "gravac_norm_gain": ("gravac_exp_topk.yaml", ["compression.gravac.window=25",
                                                  "compression.gravac.gain_measure=norm"]),
    "gravac_e1_e2_e3": ("gravac_exp_topk.yaml", ["compression.gravac.window=25",
                                                 "compression.gravac.scale_up=epsilon",
                                                 "compression.gravac.dense_probe_steps=5",
                                                 "compression.gravac.settle_dense=true"]),
    # configs/compression/gravac_recommended.yaml (E1-E3 on the paper's set-up), window 25.
    "gravac_recommended": ("gravac_recommended.yaml", ["compression.gravac.window=25"]),
    # The recommended set-up deciding on the previous step's gains (E7), without and with
    # overlap: the first isolates the lag's effect on loss, the second adds the overlap.
    "gravac_previous": ("gravac_recommended.yaml", ["compression.gravac.window=25",
                                                    "compression.gravac.decide=previous"]),
    "gravac_previous_overlap": ("gravac_recommended.yaml", ["compression.gravac.window=25",
                                                            "compression.gravac.decide=previous",
                                                            "compression.overlap=true",
                                                            "compression.bucket_cap_mb=1"]),
    # Exchanges for many workers (docs/ALGORITHM.md §13), against "static_topk_10x"
    # and "gravac_recommended", which use the paper's allgather.
    "static_topk_10x_shared_index": ("static_topk_10x.yaml", ["compression.exchange=shared_index"]),
    "static_topk_10x_hierarchical": ("static_topk_10x.yaml", ["compression.exchange=hierarchical"]),
    # The paper's allgather with each layer's indices in coded fields (docs/ALGORITHM.md §14)
    "static_topk_10x_coded": ("static_topk_10x.yaml", ["compression.exchange=allgather_coded"]),
    "gravac_recommended_coded": ("gravac_recommended.yaml",
                                 ["compression.gravac.window=25",
                                  "compression.exchange=allgather_coded"]),
    "gravac_recommended_shared_index": ("gravac_recommended.yaml",
                                        ["compression.gravac.window=25",
                                         "compression.exchange=shared_index"]),
    "gravac_recommended_hierarchical": ("gravac_recommended.yaml",
                                        ["compression.gravac.window=25",
                                         "compression.exchange=hierarchical"]),
    # controller: auto (docs/ALGORITHM.md §15): the measured choice over dense, fp16,
    # PowerSGD ranks and Top-k CFs, re-checked every 100 steps.
    "gravac_auto": ("auto.yaml", ["compression.auto.recheck_every=100"]),
    # The same at a gain threshold named: 0.7 (Auto's default, GraVAC recommended's) and
    # 0.5 (Auto's default in the result sets before cpu_auto_*_epsilon_2026-11-27).
    "gravac_auto_eps0.7": ("auto.yaml", ["compression.auto.recheck_every=100",
                                         "compression.auto.epsilon=0.7"]),
    "gravac_auto_eps0.5": ("auto.yaml", ["compression.auto.recheck_every=100",
                                         "compression.auto.epsilon=0.5"]),
    # The same with the layers under 16,384 elements sent dense (min_compress_numel): on
    # the wide CNN conv2 (4,608) and fc3 (10,240) hold half of g_ef's energy at low
    # Top-k gains in 0.4% of the bytes (docs/results/cpu_layer_gains_2026-11-28): what a
    # choice per layer group would send dense there.
    "gravac_auto_small_layers_dense": ("auto.yaml", ["compression.auto.recheck_every=100",
                                                     "compression.min_compress_numel=16384"]),
    # The same with split methods (compression.auto.split_layers): a Top-k CF below ε may
    # run with its low-gain layers dense where the others' gain clears ε.
    "gravac_auto_split": ("auto.yaml", ["compression.auto.recheck_every=100",
                                        "compression.auto.split_layers=true"]),
    # The same with PowerSGD's own gain threshold (compression.auto.epsilon_low_rank, E13):
    # with error feedback a rank-r approximation's gain falls to 0.1-0.2 on the wide CNN
    # while it trains to dense's loss, where Top-k at 0.5-0.6 does not.
    "gravac_auto_low_rank": ("auto.yaml", ["compression.auto.recheck_every=100",
                                           "compression.auto.epsilon_low_rank=0.1"]),
    # The same with PowerSGD judged by its residual's lag instead of its gain
    # (compression.auto.low_rank_lag, docs/ALGORITHM.md E14): eligible while error
    # feedback holds back at most 0.1 of a step's gradient along the next one.
    "gravac_auto_lag": ("auto.yaml", ["compression.auto.recheck_every=100",
                                      "compression.auto.low_rank_lag=0.1"]),
    # The same where a re-check always switches to the best score (switch_margin 0: the
    # rule before Auto kept a running method within 5% of the best), and both opt-ins with
    # the default margin.
    "gravac_auto_no_switch_margin": ("auto.yaml", ["compression.auto.recheck_every=100",
                                                   "compression.auto.switch_margin=0"]),
    "gravac_auto_low_rank_no_switch_margin": ("auto.yaml", [
        "compression.auto.recheck_every=100", "compression.auto.epsilon_low_rank=0.1",
        "compression.auto.switch_margin=0"]),
    "gravac_auto_split_no_switch_margin": ("auto.yaml", [
        "compression.auto.recheck_every=100", "compression.auto.split_layers=true",
        "compression.auto.switch_margin=0"]),
    # The same deciding a run's fallback to dense on the smoothed gain up to the previous
    # step (compression.auto.decide=previous, GraVAC's E7): its exchange does not wait for
    # the gains' allreduce.
    "gravac_auto_decide_previous": ("auto.yaml", ["compression.auto.recheck_every=100",
                                                  "compression.auto.decide=previous"]),
    # The same without overlap (auto.yaml overlaps the steps of dense, fp16 and sparse).
    "gravac_auto_no_overlap": ("auto.yaml", ["compression.auto.recheck_every=100",
                                             "compression.overlap=false"]),
    # gravac as PyTorch DDP's communication hook (gravac/torch/hooks.py; --backend torch
    # only), against the optimizer with the same buckets ("static_topk_40x_overlap",
    # "gravac_auto") and DDP's own hooks.
    "static_topk_40x_ddp_hook": ("static_topk_10x.yaml", ["compression.cf=40",
                                                         "compression.front_end=ddp_hook",
                                                         "compression.overlap=true",
                                                         "compression.bucket_cap_mb=1"]),
    "gravac_auto_ddp_hook": ("auto.yaml", ["compression.auto.recheck_every=100",
                                           "compression.front_end=ddp_hook"]),
    # The paper's rule with a lower gain threshold and a faster EWMA: what the LSTM
    # workload, whose gains fall quickly with the CF (~0.6 at 10x), needs to climb.
    "gravac_eps0.3": ("gravac_exp_topk.yaml", ["compression.gravac.window=25",
                                               "compression.gravac.epsilon=0.3",
                                               "compression.gravac.alpha=0.2"]),
}


BACKENDS = ("horovod", "torch")
#: The first steps summarize() leaves out of samples/s (start-up: the first collectives
#: connect, caches warm); a run needs more steps than this.
WARMUP_STEPS = 10


def bits_per_second(rate: str) -> float | None:
    """``1gbit`` -> 1e9 (``gravac.sweep.link``'s reading of tc's spellings, which
    hvd_scripts/bandwidth_sandbox.sh takes); ``none`` -> None (no link limit: the host's
    plain loopback, no sandbox). Anything else (or a rate of 0) raises ValueError, for the
    caller to name its option.

    >>> bits_per_second("100mbit"), bits_per_second("none")
    (100000000.0, None)
    """
    from gravac.sweep.link import bits_per_second as tc_rate

    return None if rate == "none" else tc_rate(rate)


def launcher(backend: str, np_: int, hosts: int = 1) -> list[str]:
    """The command that starts ``np_`` ranks of train.py on ``backend``; with ``hosts`` > 1
    it runs inside hvd_scripts/cluster_sandbox.sh (which provides the environment it
    reads): train.py's arguments follow it."""
    if hosts > 1 and backend == "horovod":
        return ["bash", "-c", 'exec bash hvd_scripts/run_multi_node.sh "$GRAVAC_HOSTFILE" '
                f'{np_} "$@"', "run_multi_node"]
    if hosts > 1:
        return ["bash", "-c", f'GRAVAC_NNODES={hosts} GRAVAC_RDZV_ENDPOINT=$GRAVAC_HOST0_ADDR:29400 '
                f'exec bash hvd_scripts/run_torchrun.sh {np_ // hosts} "$@"', "run_torchrun"]
    if backend == "horovod":
        return [str(REPO / ".venv/bin/horovodrun"), "-np", str(np_), "-H", f"localhost:{np_}",
                "--gloo", str(REPO / ".venv/bin/python"), str(REPO / "train.py")]
    return [str(REPO / ".venv/bin/torchrun"), "--standalone", "--nproc-per-node", str(np_),
            str(REPO / "train.py")]


def powersgd_start(steps: int) -> int:
    """DDP's PowerSGD hook runs plain allreduces for its first 10% of steps."""
    return max(2, steps // 10)     # the hook's own minimum is 2


def run_dir_of(out: Path, rate: str, backend: str, method: str) -> Path:
    return out / rate / backend / method


def sandbox_command(rate: str, hosts: int, slots: int, backend: str) -> list[str]:
    """One host: the rate-limited loopback of bandwidth_sandbox.sh. Several: that many
    network namespaces joined at ``rate`` (cluster_sandbox.sh); torchrun starts once per
    host (``--each``), horovodrun once on host 0 (it reaches the others by ssh)."""
    if hosts == 1:
        return ["bash", str(REPO / "hvd_scripts/bandwidth_sandbox.sh"), rate, "--"]
    return ["bash", str(REPO / "hvd_scripts/cluster_sandbox.sh"), "--hosts", str(hosts),
            "--slots", str(slots), "--link", rate, *(["--each"] if backend == "torch" else []),
            "--"]


def torch_only(method: str) -> bool:
    """A method that runs on torch.distributed only: PyTorch DDP's hooks, or gravac's."""
    return method.startswith("ddp_") or method.endswith("_ddp_hook")


def run_one(method: str, rate: str, steps: int, out: Path, np_: int, extra: list[str],
            workload: str, backend: str, sandbox: bool = True, hosts: int = 1) -> Path:
    """Train ``workload`` with ``method`` (inside the bandwidth sandbox at ``rate`` unless
    ``sandbox`` is false; across ``hosts`` sandbox hosts of np_/hosts ranks when > 1);
    returns the run directory."""
    config, accordion, _ = WORKLOADS[workload]
    compression, sets = METHODS[method]
    compression = compression.format(accordion=accordion)
    sets = [text.format(powersgd_start=powersgd_start(steps)) for text in sets]
    run_dir = run_dir_of(out, rate, backend, method)
    overrides = [f"run.output_dir={run_dir.parent}", f"run.name={method}", f"run.steps={steps}",
                 "run.overwrite=true", "run.progress=never", f"run.backend={backend}",
                 *sets, *extra]
    command = sandbox_command(rate, hosts, np_ // hosts, backend) if sandbox else []
    command += launcher(backend, np_, hosts)
    configs = [str(REPO / config), str(REPO / "configs/compression" / compression)]
    if hosts > 1:        # the launch scripts: CONFIG... -- TRAIN_ARGS
        command += [*configs, "--"]
    else:
        command += ["--config", *configs]
    for text in overrides:
        command += ["--set", text]
    log = run_dir.parent / f"{method}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with open(log, "w") as f:
        code = subprocess.call(command, cwd=REPO, stdout=f, stderr=subprocess.STDOUT)
    print(f"  {rate:>8} {backend:<8} {method:<18} {'ok' if code == 0 else f'FAILED ({code})'} "
          f"in {time.time() - t0:.0f}s (log: {log})", flush=True)
    if code != 0:
        raise RunFailed(f"{method} at {rate} on {backend} failed (exit status {code}); "
                        f"see {log}")
    return run_dir


class RunFailed(Exception):
    """A run that did not train, or whose directory cannot be summarized; the message is
    one line naming the method and its log or directory."""


def load(run_dir: Path) -> dict:
    """A run's step and window records and its last evaluation, read and checked by
    gravac's one reader of run directories (``gravac.report.load_run``); RunFailed, naming
    the directory, where it cannot be read or is too short to summarize."""
    # Imported here: the tables and --help need neither torch nor matplotlib.
    from gravac.report import load_run
    from gravac.report.stats import exploration

    from gravac.report.load import RunLoadError

    try:
        run = load_run(run_dir)
    except RunLoadError as exc:
        raise RunFailed(str(exc)) from None
    if len(run.steps) <= WARMUP_STEPS:
        raise RunFailed(f"{run_dir}: {len(run.steps)} step records; a summary needs more than "
                        f"the {WARMUP_STEPS} warm-up steps it leaves out")
    cost = exploration(run)
    return {"steps": run.steps, "windows": run.windows,
            "eval": run.evals[-1] if run.evals else {},
            "chosen": [(e["step"], e["method"]) for e in run.method_events
                       if e.get("event") == "chosen"],
            "exploration": None if cost is None else dataclasses.asdict(cost)}


def smoothed(steps: list[dict], width: int = 10) -> list[float]:
    """Trailing mean of the training loss (per-batch loss is noisy)."""
    losses = [s["loss"] for s in steps]
    return [sum(losses[max(0, i - width + 1):i + 1]) / len(losses[max(0, i - width + 1):i + 1])
            for i in range(len(losses))]


def summarize(run: dict, target: float, warmup: int = WARMUP_STEPS) -> dict:
    steps = run["steps"]
    s0, s1 = steps[warmup], steps[-1]
    samples_per_step = s1["samples_per_sec"] * s1["t_iter"] if s1.get("samples_per_sec") else None
    throughput = samples_per_step * (s1["step"] - s0["step"]) / (s1["time"] - s0["time"])
    smooth = smoothed(steps)
    reached = next((s["time"] for s, l in zip(steps, smooth) if l <= target), None)
    tail = steps[-max(1, len(steps) // 10):]
    sent_counts: dict[str, int] = {}
    method_counts: dict[str, int] = {}
    for s in steps:
        key = f"{s['sent']}@{s['cf']:g}"
        sent_counts[key] = sent_counts.get(key, 0) + 1
        if s.get("method"):
            method_counts[s["method"]] = method_counts.get(s["method"], 0) + 1
    return {
        "samples_per_sec": throughput,
        "time": s1["time"],
        "time_to_target": reached,
        "final_loss": sum(s["loss"] for s in tail) / len(tail),
        "eval_loss": run["eval"].get("loss"),
        "eval": ({"top-1": run["eval"]["top1"]} if run["eval"].get("top1") is not None else
                 {"perplexity": run["eval"].get("perplexity")}),
        "floats_ratio": s1["cum_floats_sent"] / s1["cum_dense_floats"],
        "sent": sent_counts,
        # controller: auto: steps per method, and (step, method) of each choice.
        "methods": method_counts,
        "chosen": run.get("chosen", []),
        "exploration": run.get("exploration"),
        "windows": [(w["step"], w["theta_min"], w["theta_c"],
                     "dense" if w.get("on_dense") else ("yes" if w["settled"] else "no"))
                    for w in run["windows"]],
    }


def table(rate: str, results: dict[str, dict], target: float, backend: str) -> str:
    dense = results["dense"]
    baseline = "Horovod dense" if backend == "horovod" else "PyTorch DDP"
    lines = [f"### {rate}, {backend}: target training loss {target:.4f} ({baseline}, smoothed, "
             "at 80% of its steps)",
             "",
             "| method | samples/s | vs dense | vs fp16 | time to target (s) | vs dense "
             f"| final loss | vs dense | eval {next(iter(dense['eval']))} | floats sent / dense |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    fp16 = results.get("horovod_fp16")
    for name, r in results.items():
        ttt = r["time_to_target"]
        vs_fp16 = f"{r['samples_per_sec'] / fp16['samples_per_sec']:.2f}x" if fp16 else "—"
        ttt_ratio = (ttt / dense["time_to_target"]) if ttt and dense["time_to_target"] else None
        lines.append(
            f"| {name} | {r['samples_per_sec']:.0f} "
            f"| {r['samples_per_sec'] / dense['samples_per_sec']:.2f}x "
            f"| {vs_fp16} "
            f"| {'never' if ttt is None else f'{ttt:.1f}'} "
            f"| {'—' if ttt_ratio is None else f'{ttt_ratio:.2f}x'} "
            f"| {r['final_loss']:.4f} | {(r['final_loss'] / dense['final_loss'] - 1) * 100:+.1f}% "
            f"| {next(iter(r['eval'].values())):.4g} | {r['floats_ratio']:.4f} |")
    for name in (n for n in results if n.startswith("gravac")):
        g = results[name]
        if g.get("methods"):
            # controller: auto (its step records name the method they ran): what it ran,
            # and which method it chose at which step (none in a run shorter than its trials).
            lines += ["", f"{name}: steps per method: {g['methods']}; chosen (step: method): "
                      + (", ".join(f"{step}: {method}" for step, method in g["chosen"])
                         or "none yet")]
            if g.get("exploration"):
                from gravac.report.stats import Exploration
                from gravac.report.summary import exploration_line
                lines += ["", f"{name}: " + exploration_line(Exploration(**g["exploration"]))]
            continue
        lines += ["", f"{name}: steps per sent@CF: {g['sent']}; windows (step, θmin, θc, "
                  "saturated, or dense under settle_dense): " +
                  ", ".join(f"({s}, {a:g}, {b:g}, {c})" for s, a, b, c in g["windows"])]
    return "\n".join(lines)


def backend_table(rate: str, by_backend: dict[str, dict[str, dict]]) -> str:
    """Each method's samples/s on torch.distributed relative to Horovod (same invocation)."""
    hvd_runs, torch_runs = by_backend["horovod"], by_backend["torch"]
    lines = [f"### {rate}: torch.distributed vs Horovod (samples/s; dense is Horovod's "
             "allreduce vs PyTorch DDP, fp16 is Compression.fp16 vs DDP's fp16 hook)", "",
             "| method | horovod samples/s | torch samples/s | torch / horovod |",
             "|---|---:|---:|---:|"]
    for name in hvd_runs:
        if name in torch_runs:
            a, b = hvd_runs[name]["samples_per_sec"], torch_runs[name]["samples_per_sec"]
            lines.append(f"| {name} | {a:.0f} | {b:.0f} | {b / a:.2f}x |")
    return "\n".join(lines)


#: What a user would run instead of gravac, by backend: the launcher's own dense path
#: (Horovod's optimizer, PyTorch DDP) and its compression; under torch, "horovod_fp16" is
#: DDP's fp16 hook. On a fast link the plain dense path can be the fastest of them.
PEERS = {"horovod": ("dense", "horovod_fp16"),
         "torch": ("dense", "horovod_fp16", "ddp_powersgd_rank1", "ddp_powersgd_rank4")}
PEER_NAMES = {("horovod", "dense"): "Horovod", ("torch", "dense"): "PyTorch DDP",
              ("horovod", "horovod_fp16"): "Horovod fp16", ("torch", "horovod_fp16"): "DDP fp16 hook",
              ("torch", "ddp_powersgd_rank1"): "DDP PowerSGD rank 1",
              ("torch", "ddp_powersgd_rank4"): "DDP PowerSGD rank 4"}


def peer_table(rate: str, by_backend: dict[str, dict[str, dict]]) -> str | None:
    """Each gravac method's time to the dense target against the fastest peer's (of every
    backend in this invocation), and its final loss against dense's: the target
    is <= 0.8x the best peer's time with a final loss within 2% of dense."""
    peers = [(PEER_NAMES[(b, m)], runs[m]) for b, runs in by_backend.items()
             for m in PEERS[b] if m in runs and runs[m]["time_to_target"] is not None]
    if not peers:
        return None
    best_name, best = min(peers, key=lambda p: p[1]["time_to_target"])
    lines = [f"### {rate}: gravac against the fastest peer to the dense target "
             f"({best_name}, {best['time_to_target']:.1f} s)", "",
             "| backend | method | time to target (s) | vs best peer | final loss vs dense |",
             "|---|---|---:|---:|---:|"]
    for backend, runs in by_backend.items():
        dense = runs["dense"]
        for name, r in runs.items():
            if name == "dense" or name in PEERS[backend]:
                continue
            ttt, best_ttt = r["time_to_target"], best["time_to_target"]
            lines.append(f"| {backend} | {name} | {'never' if ttt is None else f'{ttt:.1f}'} | "
                         f"{'—' if ttt is None else f'{ttt / best_ttt:.2f}x'} | "
                         f"{(r['final_loss'] / dense['final_loss'] - 1) * 100:+.1f}% |")
    return "\n".join(lines)


def rounds_table(rate: str, backend: str, per_round: list[dict[str, dict]]) -> str:
    """Each method's samples/s and time to target as ratios to the dense run of the same
    round (``per_round``: one summary per round, method -> summarize()), with the median
    and range over rounds."""
    def cell(values: list) -> str:
        got = [v for v in values if v is not None]
        if not got:
            return "never"
        med = statistics.median(got)
        spread = f" ({min(got):.2f}-{max(got):.2f})" if len(got) > 1 else ""
        missed = f", never in {len(values) - len(got)}" if len(got) < len(values) else ""
        return f"{med:.2f}x{spread}{missed}"

    n = len(per_round)
    lines = [f"### {rate}, {backend}: {n} rounds, each ratio to its own round's dense run "
             "(median (min-max))", "",
             "| method | samples/s vs dense | " + " | ".join(f"round {r + 1}" for r in range(n))
             + " | time to target vs dense |",
             "|---|---:|" + "---:|" * n + "---:|"]
    for name in per_round[0]:
        if name == "dense" or any(name not in runs for runs in per_round):
            continue
        speed = [runs[name]["samples_per_sec"] / runs["dense"]["samples_per_sec"]
                 for runs in per_round]
        ttt = [runs[name]["time_to_target"] / runs["dense"]["time_to_target"]
               if runs[name]["time_to_target"] and runs["dense"]["time_to_target"] else None
               for runs in per_round]
        lines.append(f"| {name} | {cell(speed)} | " + " | ".join(f"{v:.2f}x" for v in speed)
                     + f" | {cell(ttt)} |")
    return "\n".join(lines)


def round_dir(out: Path, round_: int, rounds: int) -> Path:
    """Where round ``round_`` (1-based) of ``rounds`` keeps its runs: --out itself for one."""
    return out if rounds == 1 else out / f"round{round_}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--rates", nargs="+", default=["1gbit", "100mbit"], metavar="RATE",
                        help="link rates, tc's syntax (100mbit, 1gbit, 10gbit: each run inside "
                             "hvd_scripts/bandwidth_sandbox.sh, which needs root), or none: "
                             "the host's plain loopback, no sandbox, no root (default: 1gbit "
                             "100mbit)")
    parser.add_argument("--workload", choices=list(WORKLOADS), default="lstm")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"steps per run, more than the {WARMUP_STEPS} warm-up steps the "
                             "summary leaves out (default: " + ", ".join(
                            f"{steps} for {name}" for name, (_, _, steps) in WORKLOADS.items())
                        + ")")
    parser.add_argument("--methods", nargs="+", default=None, choices=list(METHODS),
                        metavar="METHOD",
                        help="what to run, dense among them (default: every one; with "
                             "--summarize-only, every one with a run under --out): "
                             + ", ".join(METHODS))
    parser.add_argument("--np", type=int, default=2, help="ranks per run (default: 2)")
    parser.add_argument("--hosts", type=int, default=1,
                        help="sandbox hosts (hvd_scripts/cluster_sandbox.sh) the --np ranks "
                             "are spread over, --np/--hosts per host; 1: one host, its "
                             "loopback limited to the rate (default)")
    parser.add_argument("--backend", nargs="+", default=["horovod"], choices=BACKENDS,
                        help="transports to run every method on (default: horovod)")
    parser.add_argument("--out", type=Path, default=REPO / "runs/benchmarks/e2e",
                        help="where the runs, results.md and results.json go (default: "
                             "runs/benchmarks/e2e)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every method this many times, alternating the order, and "
                             "report each method's ratios per round, median and range")
    parser.add_argument("--summarize-only", action="store_true",
                        help="do not train: summarize the runs already under --out")
    add_set_option(parser, dest="extra", help="extra train.py overrides for every run")
    result_set.add_argument(parser)
    args = parser.parse_args(argv)
    if args.result_set:
        result_set.check_name(args.result_set)
    if args.np < 1:
        parser.error(f"argument --np: must be >= 1, got {args.np}")
    if args.hosts < 1 or args.np % args.hosts:
        parser.error(f"--hosts {args.hosts} must be >= 1 and divide --np {args.np}")
    for rate in args.rates:
        try:
            bits_per_second(rate)
        except ValueError as exc:
            parser.error(f"argument --rates: {exc}")
    if args.hosts > 1 and "none" in args.rates:
        parser.error(f"--rates none (the host's plain loopback) is one host: --hosts "
                     f"{args.hosts} needs the sandbox's links, a rate such as 1gbit")
    if args.rounds < 1:
        parser.error(f"argument --rounds: must be >= 1, got {args.rounds}")
    if args.steps is None:
        args.steps = WORKLOADS[args.workload][2]
    if args.steps <= WARMUP_STEPS:
        parser.error(f"argument --steps: {args.steps} must exceed the {WARMUP_STEPS} warm-up "
                     "steps the summary leaves out")
    chosen = args.methods is not None
    asked = args.methods if chosen else list(METHODS)
    if "dense" not in asked:
        parser.error("--methods must include dense: every ratio is to the dense run")
    methods = ["dense"] + [m for m in asked if m != "dense"]
    backends = list(dict.fromkeys(args.backend))
    if args.summarize_only:
        methods = existing_methods(parser, args, methods, backends, chosen)
    workload = WORKLOADS[args.workload][0]
    layout = f"{args.np} ranks" + (f" on {args.hosts} hosts" if args.hosts > 1 else "")
    print(f"end-to-end: {len(methods)} methods x {len(args.rates)} rates x {len(backends)} "
          f"backends x {args.rounds} rounds, {args.steps} steps, {layout}, workload {workload}",
          flush=True)
    sections, everything, rounds, failed = [], {}, {}, []
    for round_ in range(1, args.rounds + 1):
        out = round_dir(args.out, round_, args.rounds)
        if args.rounds > 1:
            print(f"round {round_} of {args.rounds}: {out}", flush=True)
            sections.append(f"## Round {round_}")
        # even rounds run the methods in the reverse order: a drifting machine favours none
        order = methods if round_ % 2 else methods[::-1]
        part = run_round(args, methods, order, backends, out)
        sections += part["sections"]
        failed += part["failed"]
        for rate, by_backend in part["everything"].items():
            for backend, result in by_backend.items():
                key = f"round{round_}" if args.rounds > 1 else None
                everything.setdefault(rate, {}).setdefault(backend, {} if key else result)
                if key:
                    everything[rate][backend][key] = result
                    rounds.setdefault((rate, backend), []).append(result["runs"])
    for (rate, backend), per_round in rounds.items():
        sections.append(rounds_table(rate, backend, per_round))
        print("\n" + sections[-1] + "\n", flush=True)
    if failed:
        sections.append("### Failed runs\n\n" + "\n".join(f"- {f}" for f in failed))
    from gravac.util.atomic import atomic_write_text

    header = (f"# End-to-end results\n\n{len(methods)} methods, {args.steps} steps, {layout},"
              f" {args.rounds} round{'s' if args.rounds > 1 else ''}, workload `{workload}`, "
              f"command `{' '.join(sys.argv)}`\n\n")
    atomic_write_text(args.out / "results.md", header + "\n\n".join(sections) + "\n")
    atomic_write_text(args.out / "results.json", json.dumps(everything, indent=1, default=str))
    print(f"results: {args.out / 'results.md'}; reports: {args.out}/.../<rate>/<backend>/report/"
          "report.md")
    if failed:
        # A set is the measurement as a whole: one with runs missing is not kept.
        kept = f"; not kept as result set {args.result_set}" if args.result_set else ""
        for line in failed:
            print(f"end_to_end.py: {line}", file=sys.stderr)
        print(f"end_to_end.py: {len(failed)} run(s) failed{kept}", file=sys.stderr)
        return 1
    result_set.keep(args.result_set, [args.out / "results.json", args.out / "results.md"])
    return 0


def existing_methods(parser: argparse.ArgumentParser, args, methods: list[str],
                     backends: list[str], chosen: bool) -> list[str]:
    """For --summarize-only: ``methods`` as asked (``chosen``: every one must have its run
    under --out) or, by default, those with a run under --out, dense always; a missing run
    is refused in one line naming its directory, before any table."""
    wanted = [(m, run_dir_of(round_dir(args.out, r, args.rounds), rate, backend, m))
              for r in range(1, args.rounds + 1) for rate in args.rates for backend in backends
              for m in methods if not (torch_only(m) and backend != "torch")]
    missing = [(m, d) for m, d in wanted if not d.is_dir() and (chosen or m == "dense")]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        parser.error(f"--summarize-only: no run {missing[0][1]}{more}; train it first"
                     + (", or leave its method out of --methods" if chosen else ""))
    present = {m for m, d in wanted if d.is_dir()}
    return [m for m in methods if m in present]


def run_round(args, methods: list[str], order: list[str], backends: list[str],
              out: Path) -> dict:
    """Every method at every rate and backend once (in ``order``), under ``out``; returns
    the tables ("sections"), summaries ("everything": rate -> backend -> target, runs) and
    the runs that failed ("failed": one line each). A failed run does not stop the round:
    the others' hours of measurement are kept, and main reports it at the end; a failed
    dense run leaves its rate and backend without a baseline, so the methods after it
    there are not run."""
    sections, everything, failed = [], {}, []
    for rate in args.rates:
        by_backend = {}
        for backend in backends:
            runs = {}
            for method in order:
                if torch_only(method) and backend != "torch":
                    print(f"  {rate:>8} {backend:<8} {method:<18} skipped: a DDP hook runs on "
                          "torch.distributed only (--backend torch)", flush=True)
                    continue
                if args.summarize_only and not run_dir_of(out, rate, backend, method).is_dir():
                    continue              # not asked for by name, and not run here
                try:
                    run_dir = (run_dir_of(out, rate, backend, method) if args.summarize_only
                               else run_one(method, rate, args.steps, out, args.np, args.extra,
                                            args.workload, backend,
                                            sandbox=bits_per_second(rate) is not None,
                                            hosts=args.hosts))
                    runs[method] = load(run_dir)
                except RunFailed as exc:
                    failed.append(str(exc))
                    if method == "dense":
                        print(f"  {rate:>8} {backend:<8} dense failed: the other methods at "
                              "this rate and backend are not run (every ratio is to dense)",
                              flush=True)
                        break
            if "dense" not in runs:
                continue
            results = {m: runs[m] for m in methods if m in runs}      # dense first
            dense_steps = results["dense"]["steps"]
            target = smoothed(dense_steps)[int(0.8 * len(dense_steps)) - 1]
            summary = {m: summarize(r, target) for m, r in results.items()}
            by_backend[backend] = summary
            sections.append(table(rate, summary, target, backend))
            everything.setdefault(rate, {})[backend] = {"target": target, "runs": summary}
            print("\n" + sections[-1] + "\n", flush=True)
            where = out / rate / backend
            subprocess.call([str(REPO / ".venv/bin/python"), "-m", "gravac.report",
                             *[str(where / m) for m in results],    # skipped ones left out
                             "--baseline", str(where / "dense"),
                             "--out", str(where / "report")], cwd=REPO, stdout=subprocess.DEVNULL)
        if len(by_backend) == 2:
            sections.append(backend_table(rate, by_backend))
            print("\n" + sections[-1] + "\n", flush=True)
        peers = peer_table(rate, by_backend)
        if peers:
            sections.append(peers)
            print("\n" + peers + "\n", flush=True)
    return {"sections": sections, "everything": everything, "failed": failed}


if __name__ == "__main__":
    sys.exit(main())
