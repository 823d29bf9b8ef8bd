"""One GPU's training step, broken down: forward + backward, compression, update.

For each model at the paper's batch size and each method, trains ``--steps`` steps in one
process (gravac's optimizer over the local transport: the whole compression path runs,
nothing travels) and prints medians after ``--warmup`` steps; every method of a model is
built first, and the steps run in ``--rounds`` interleaved rounds (each method in turn),
so that a drift of the host's speed touches every method alike:

  forward+backward | compression (the engine's local phases: error feedback, both
  levels' selection, norms, residual, pack, unpack) | the rest of opt.step() (update,
  bookkeeping) | step | compression / step

with the engine's exact phase split (a device sync at each phase boundary, as
``exact_phases`` does; the syncs cost a few microseconds each). Methods: ``plain`` (torch
SGD, no gravac), ``dense`` (gravac's optimizer, compressor none), ``topk10`` (static Top-k
at θmin 10x) and ``gravac10`` (GraVAC, θmin 10x with its 20x candidate: two levels and the
gains every step); ``topk10_per_layer`` / ``gravac10_per_layer``: the same without Top-k's
batched selection of the layers (``batch_layers=False``: one ``torch.topk`` per layer);
``topk10_triton`` / ``gravac10_triton``: every layer above ``DEVICE_BATCH_MAX`` (1M) entries,
instead of ``torch.topk``, takes the sampled path with Triton's candidate kernels
(``device_candidates="triton"``: the LSTM's 9-15M-entry layers, ResNet-101's largest);
``topk10_layerwise_residual`` / ``gravac10_layerwise_residual``: the residuals updated one
layer at a time (``FLAT_UPDATE_MIN_LAYERS`` out of reach) instead of by one launch over
their flat buffer: the before and after of that change in one run;
``topk10_layerwise_gather`` / ``gravac10_layerwise_gather``: the values each level kept
gathered one layer at a time (``GATHER_MIN_LAYERS`` out of reach) instead of by one launch
over all layers; ``powersgd4``:
PowerSGD at rank 4 (``Static(rank=4)``), ``powersgd4_layerwise_orthogonalize`` the same
with each layer's Gram-Schmidt on its own instead of all layers' at once; ``auto``: the method choice (``controller:
auto``) over the local transport, where nothing travels, so it shows what its trials cost
on this GPU, not what it would choose on a link. Target: compression < 15% of the step at
θmin 10x.

Models (``--models``): ``resnet101`` (CIFAR-10 images, batch 32), ``lstm`` (2 layers,
1500 units, tied weights, PTB's 10,000 words, batch 20, bptt 35) and ``resnet101_b128``
/ ``lstm_b80`` (4x the batch: the compression cost stays, the compute grows).

    python benchmarks/gpu_step.py [--device cuda] [--models resnet101 lstm]
        [--methods plain dense topk10 gravac10] [--steps 30] [--warmup 10] [--rounds 3]
        [--json OUT]

Runs on CPU too (``--device cpu --small``: tiny models, for the tests).

``--comm torch`` under ``torchrun --nproc-per-node N``: the ranks share the one GPU and
exchange over torch.distributed's gloo (NCCL refuses two ranks on one device), whose wire
is the host: the exchange costs what a device-to-host copy and a loopback socket cost, so
``auto`` meets a real trade-off between what a method saves on the wire and what its local
work costs. Rank 0 prints and writes the JSON.

    torchrun --standalone --nproc-per-node 2 benchmarks/gpu_step.py --comm torch \
        --models lstm --methods dense topk10 auto --steps 100 --rounds 1
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gravac.comm import LocalComm  # noqa: E402
from gravac.compressors.topk import DEVICE_BATCH_MAX  # noqa: E402
from gravac import memory as memory_module  # noqa: E402
from gravac.compressors import powersgd as powersgd_module  # noqa: E402
from gravac.controllers import Auto, GraVAC, Static  # noqa: E402
from gravac.engine import wrap_optimizer  # noqa: E402
from gravac.engine import selection as selection_module  # noqa: E402
from gravac.engine.phases import LOCAL_PHASES  # noqa: E402
from gravac.models import build_model  # noqa: E402
from timing import device_description, exit_without_cuda  # noqa: E402

#: name -> (model, options, batch, kind); kind "image" (3x32x32, 10 classes) or "lm" (bptt 35)
MODELS = {
    "resnet101": ("resnet101", {"num_classes": 10, "in_channels": 3}, 32, "image"),
    "resnet101_b128": ("resnet101", {"num_classes": 10, "in_channels": 3}, 128, "image"),
    "lstm": ("lstm", {"vocab_size": 10_000, "embedding_dim": 1500, "hidden_dim": 1500,
                      "num_layers": 2, "dropout": 0.65, "tie_weights": True}, 20, "lm"),
    "lstm_b80": ("lstm", {"vocab_size": 10_000, "embedding_dim": 1500, "hidden_dim": 1500,
                          "num_layers": 2, "dropout": 0.65, "tie_weights": True}, 80, "lm"),
}
#: --small: the same shapes of work, small enough for a CPU test.
SMALL = {
    "resnet101": ("resnet18", {"num_classes": 10, "in_channels": 3}, 4, "image"),
    "lstm": ("lstm", {"vocab_size": 500, "embedding_dim": 32, "hidden_dim": 32,
                      "num_layers": 2, "dropout": 0.0, "tie_weights": True}, 4, "lm"),
}
METHODS = ("plain", "dense", "topk10", "gravac10", "topk10_per_layer", "gravac10_per_layer",
           "topk10_triton", "gravac10_triton", "topk10_layerwise_residual",
           "gravac10_layerwise_residual", "topk10_layerwise_gather", "gravac10_layerwise_gather",
           "powersgd4", "powersgd4_layerwise_orthogonalize", "auto")
#: Method suffix -> (module, threshold) set out of reach for the run: the one-launch path
#: it names replaced by its per-layer loop, the "before" of that path in the same call.
LAYERWISE = {"_layerwise_residual": (memory_module, "FLAT_UPDATE_MIN_LAYERS"),
             "_layerwise_gather": (selection_module, "GATHER_MIN_LAYERS"),
             "_layerwise_orthogonalize": (powersgd_module, "BATCH_MIN_MATRICES")}
BPTT = 35


def _optimizer(method: str, model: torch.nn.Module, comm):
    sgd = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if method == "plain":
        return sgd
    if method == "dense":
        return wrap_optimizer(sgd, model.named_parameters(), comm, compressor="none")
    if method.startswith("powersgd4") or method == "auto":
        opt = wrap_optimizer(sgd, model.named_parameters(), comm,
                             **(dict(compressor="powersgd", controller=Static(rank=4))
                                if method != "auto" else dict(controller=Auto())))
        opt._engine.exact_phases = True
        return opt
    controller = (Static(cf=10) if method.startswith("topk10") else
                  GraVAC(theta_min=10, theta_max=1000, window=10_000))
    # "_per_layer": Top-k's select_many without batching the layers (one torch.topk each)
    options = {"batch_layers": not method.endswith("_per_layer")}
    if method.endswith("_triton"):
        options.update(device_candidates="triton", device_direct_below=DEVICE_BATCH_MAX)
    opt = wrap_optimizer(sgd, model.named_parameters(), comm, compressor="topk",
                         compressor_options=options, controller=controller)
    opt._engine.exact_phases = True    # a device sync per phase boundary: the exact split
    return opt


def _batches(kind: str, batch: int, device, vocab: int, count: int = 4):
    """A few fixed batches of random data (never zeros), cycled."""
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(count):
        if kind == "image":
            x = torch.randn(batch, 3, 32, 32, generator=g)
            y = torch.randint(0, 10, (batch,), generator=g)
        else:
            x = torch.randint(0, vocab, (BPTT, batch), generator=g)
            y = torch.randint(0, vocab, (BPTT * batch,), generator=g)
        out.append((x.to(device), y.to(device)))
    return out


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextmanager
def _batched_path_off(method: str):
    """For a ``_layerwise_...`` method, its batched path out of reach while it runs (its
    "before"); for any other method nothing."""
    toggle = next((t for suffix, t in LAYERWISE.items() if method.endswith(suffix)), None)
    saved = getattr(*toggle) if toggle else None
    if toggle:
        setattr(*toggle, 1 << 30)
    try:
        yield
    finally:
        if toggle:
            setattr(*toggle, saved)


@dataclass
class Setup:
    """One model and method, built once and trained in several rounds."""

    method: str
    model: torch.nn.Module
    opt: object
    batches: list
    kind: str
    batch: int
    rows: list = field(default_factory=list)
    done: int = 0


def _setup(model_name: str, method: str, device, comm, small: bool = False) -> Setup:
    name, options, batch, kind = (SMALL if small else MODELS)[model_name]
    torch.manual_seed(0)
    model = build_model(name, **options).to(device)
    with _batched_path_off(method):
        opt = _optimizer(method, model, comm)
    return Setup(method, model, opt, _batches(kind, batch, device, options.get("vocab_size", 0)),
                 kind, batch)


def _steps(setup: Setup, device, count: int, record: bool) -> None:
    """``count`` training steps of one setup, each timed in its parts (a device sync at
    each boundary); with ``record`` their times go to ``setup.rows``."""
    model, opt = setup.model, setup.opt
    with _batched_path_off(setup.method):
        for _ in range(count):
            x, y = setup.batches[setup.done % len(setup.batches)]
            setup.done += 1
            _sync(device)
            t0 = time.perf_counter()
            opt.zero_grad()
            _loss(model, x, y, setup.kind).backward()
            _sync(device)
            t1 = time.perf_counter()
            opt.step()
            _sync(device)
            t2 = time.perf_counter()
            if not record:
                continue
            stats = getattr(opt, "last_stats", None)
            compress = stats.t_compress if stats is not None and stats.t_compress is not None \
                else 0.0
            setup.rows.append({
                "fwd_bwd": t1 - t0, "opt_step": t2 - t1, "compress": compress, "step": t2 - t0,
                "sent": None if stats is None else (stats.method or stats.sent),
                **{p: (getattr(stats, p) or 0.0) if stats is not None else 0.0
                   for p in LOCAL_PHASES}})


def _medians(setup: Setup) -> dict:
    rows = setup.rows
    med = {k: statistics.median(r[k] for r in rows) * 1e3
           for k in ("fwd_bwd", "opt_step", "compress", "step", *LOCAL_PHASES)}
    med["rest"] = med["opt_step"] - med["compress"]
    med["share"] = med["compress"] / med["step"]
    med["params"] = sum(p.numel() for p in setup.model.parameters())
    med["batch"] = setup.batch
    med["sent"] = sorted({r["sent"] for r in rows if r["sent"]})
    # what the measured steps sent, in the order first sent (auto: its trials, then its
    # choice), and the last step's
    med["sent_steps"] = {}
    for r in rows:
        if r["sent"]:
            med["sent_steps"][r["sent"]] = med["sent_steps"].get(r["sent"], 0) + 1
    med["last_sent"] = rows[-1]["sent"] if rows else None
    return med


def _sent_cell(m: dict) -> str:
    """One method: its name; several (auto): each with its steps, then the last step's."""
    steps = m.get("sent_steps") or {}
    if len(steps) <= 1:
        return "/".join(m["sent"]) or "-"
    return ", ".join(f"{k} x{n}" for k, n in steps.items()) + f" -> {m['last_sent']}"


def _loss(model, x, y, kind: str) -> torch.Tensor:
    """The training loss of one batch (an LSTM's output is (logits, hidden))."""
    out = model(x)
    return F.cross_entropy(out if kind == "image" else out[0], y)


def measure_all(model_name: str, methods: list[str], device, steps: int, warmup: int,
                rounds: int = 3, small: bool = False, profile: Path | None = None,
                comm=None) -> dict:
    """Median milliseconds of each part of the step for one model and each method. Every
    method is built first and warmed up; then ``rounds`` rounds each train every method
    for its share of ``steps`` in turn, so that a drift of the host's speed over the
    minutes a run takes touches every method alike. With ``profile`` (a folder), three
    more ``opt.step()`` calls of each under torch's profiler and three under cProfile,
    written to ``profile/<model>_<method>.txt``. ``comm``: the transport the optimizers
    use (default the local one: nothing travels)."""
    comm = comm if comm is not None else LocalComm()
    setups = [_setup(model_name, method, device, comm, small) for method in methods]
    for setup in setups:
        _steps(setup, device, warmup, record=False)
    for r in range(rounds):
        for setup in setups:
            _steps(setup, device, steps // rounds + (r < steps % rounds), record=True)
    out = {}
    for setup in setups:
        out[setup.method] = _medians(setup)
        if profile is not None:
            with _batched_path_off(setup.method):
                _profile(setup.model, setup.opt, setup.batches, setup.kind, device,
                         profile / f"{model_name}_{setup.method}.txt")
    return out


def _profile(model, opt, batches, kind, device, path: Path) -> None:
    """Three steps under torch's profiler (forward and backward under a label of their
    own, ``opt.step`` under its own): the top operators by device time and by host time,
    then every operator and runtime call by count, where a step's launches
    (``cudaLaunchKernel``) and host syncs (``cudaStreamSynchronize``, device-to-host
    ``cudaMemcpyAsync``) show."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda"
                                           else [])
    engine = getattr(opt, "_engine", None)     # None: torch's own optimizer ("plain")
    if engine is not None:
        engine.exact_phases = False      # no phase syncs inside the trace
    with profile(activities=activities) as prof:
        for x, y in batches[:3]:
            opt.zero_grad()
            with torch.profiler.record_function("forward+backward"):
                _loss(model, x, y, kind).backward()
            _sync(device)
            with torch.profiler.record_function("opt.step"):
                opt.step()
            _sync(device)
    averages = prof.key_averages()
    python_table = _python_profile(model, opt, batches, kind, device)
    path.parent.mkdir(parents=True, exist_ok=True)
    by_device = ""
    if device.type == "cuda":
        for key in ("self_device_time_total", "self_cuda_time_total"):   # torch's names
            try:
                by_device = "by device time\n" + averages.table(sort_by=key, row_limit=30)
                break
            except (AttributeError, KeyError, ValueError):
                continue
    path.write_text(by_device + "\n\nby host time\n"
                    + averages.table(sort_by="self_cpu_time_total", row_limit=30)
                    + "\n\nevery operator, by count\n"
                    + averages.table(sort_by="count", row_limit=-1)
                    + "\n\nopt.step's Python, by own time (cProfile, three more steps)\n"
                    + python_table)


def _python_profile(model, opt, batches, kind, device) -> str:
    """Three more ``opt.step()`` calls under cProfile, alone (torch's profiler off): where
    the host's time goes function by function, the launches of torch's operators
    included, since a GPU step whose kernels are short waits on the host."""
    import cProfile
    import io
    import pstats
    profiler = cProfile.Profile()
    for x, y in batches[:3]:
        opt.zero_grad()
        _loss(model, x, y, kind).backward()
        _sync(device)
        profiler.enable()
        opt.step()
        _sync(device)
        profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(60)
    return text.getvalue()


def table(results: dict, device_name: str) -> str:
    lines = [f"device: {device_name}; medians (ms)", "",
             "| model | batch | params | method | sent | fwd+bwd | compression | rest of opt.step | "
             "step | compression / step | selection | feedback | norms | residual | pack+unpack |",
             "|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for (model, method), m in results.items():
        target = ""
        if method != "plain" and method != "dense":
            target = " (< 15%: " + ("met" if m["share"] < 0.15 else "MISSED") + ")"
        lines.append(
            f"| {model} | {m['batch']} | {m['params'] / 1e6:.1f}M | {method} | "
            f"{_sent_cell(m)} | {m['fwd_bwd']:.2f} | "
            f"{m['compress']:.2f} | {m['rest']:.2f} | {m['step']:.2f} | "
            f"{100 * m['share']:.1f}%{target} | {m['t_select']:.2f} | {m['t_feedback']:.2f} | "
            f"{m['t_norms']:.2f} | {m['t_residual']:.2f} | {m['t_pack'] + m['t_unpack']:.2f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--models", nargs="+", default=["resnet101", "lstm"],
                        choices=list(MODELS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS[:4]), choices=METHODS)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3,
                        help="the steps of every method in this many interleaved rounds")
    parser.add_argument("--small", action="store_true", help="tiny models (CPU tests)")
    parser.add_argument("--json", type=Path, help="write every median here")
    parser.add_argument("--comm", choices=("local", "torch"), default="local",
                        help="torch: the ranks of a torchrun launch share the GPU over gloo")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="also write profiles of each run into DIR: torch's operators "
                             "over three steps, opt.step's Python over three more")
    args = parser.parse_args()
    device = torch.device(args.device)
    exit_without_cuda("gpu_step.py", device, "use --device cpu --small to try it on a CPU")
    if args.small and any(m not in SMALL for m in args.models):
        print(f"gpu_step.py: --small knows {', '.join(SMALL)} only", file=sys.stderr)
        return 2
    comm = LocalComm()
    if args.comm == "torch":
        from gravac.comm import init
        comm = init("torch", gpu=False)          # gloo: every rank on the one GPU
    name = device_description(device)
    lead = comm.rank == 0                # the other ranks train alongside, silently
    say = print if lead else (lambda *a, **k: None)
    results = {}
    for model in args.models:
        medians = measure_all(model, args.methods, device, args.steps, args.warmup,
                              max(1, args.rounds), args.small, args.profile, comm)
        for method, m in medians.items():
            results[(model, method)] = m
            say(f"{model} {method}: step {m['step']:.2f} ms, compression {m['compress']:.2f} ms "
                f"({100 * m['share']:.1f}%)", flush=True)
    say(table(results, name))
    if args.json and lead:
        args.json.write_text(json.dumps({"device": name, "torch": torch.__version__,
                                         "steps": args.steps, "rounds": args.rounds,
                                         "results": [{"model": k[0], "method": k[1], **v}
                                                     for k, v in results.items()]}, indent=1))
    comm.close()          # torch.distributed: a barrier, then the group destroyed
    return 0


if __name__ == "__main__":
    from gravac.comm import end_process
    end_process(main())      # after gloo, without the interpreter's finalization
