"""The GPU step's batched paths against the per-layer loops they replace, each timed alone
on the layer shapes of ResNet-101 (CIFAR-10 head) and the paper's LSTM.

The paths:

* the residual update of Top-k at 10x (``ResidualMemory.update_sparse``: one
  ``index_add_`` over the flat buffer of all layers, against ``update`` per layer);
* PowerSGD's Gram-Schmidt at rank 4 (``orthogonalize_all_``, against ``orthogonalize_``
  per layer);
* spreading per-segment values over their segments (``repeat_by_counts``, against
  ``torch.repeat_interleave``): the layer offsets of the selected indices and the
  per-layer thresholds over every entry.

Wall-clock medians of ``--repeats`` calls, each between two device syncs (a per-layer
loop's cost is mostly launches, which device-side timers do not see), after a warm-up.

    python benchmarks/batched_paths.py [--device cuda] [--repeats 30] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gravac import memory as memory_module  # noqa: E402
from gravac.compressors import powersgd  # noqa: E402
from gravac.memory import ResidualMemory, SparseSent  # noqa: E402
from gravac.models import build_model  # noqa: E402
from gravac.util.segments import repeat_by_counts  # noqa: E402
from gravac.util.sizes import matrix_shape  # noqa: E402
from timing import device_description, exit_without_cuda  # noqa: E402

MODELS = {
    "resnet101": ("resnet101", {"num_classes": 10, "in_channels": 3}),
    "lstm": ("lstm", {"vocab_size": 10_000, "embedding_dim": 1500, "hidden_dim": 1500,
                      "num_layers": 2, "dropout": 0.65, "tie_weights": True}),
}
#: Layers of fewer entries go dense (the engine's default min_compress_numel).
MIN_COMPRESS = 1024


def _shapes(model: str) -> list[torch.Size]:
    name, options = MODELS[model]
    params = build_model(name, **options).parameters()
    return [p.shape for p in params if p.numel() >= MIN_COMPRESS]


def _time(fn, device, repeats: int) -> float:
    """Median milliseconds of fn() between two syncs, after three warm-up calls."""
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def residual_update(shapes, device, repeats: int) -> dict:
    """One step's residual update at CF 10 after ``compensate_all`` (both ways)."""
    g = torch.Generator(device=device).manual_seed(0)
    names = [f"l{i}" for i in range(len(shapes))]
    grads = [torch.randn(s, generator=g, device=device) for s in shapes]
    picks = [torch.randperm(s.numel(), generator=g, device=device)[:max(1, s.numel() // 10)]
             for s in shapes]
    out = {}
    for label, flat_min in (("per layer", 1 << 30), ("flat", 1)):    # whatever the default
        saved = memory_module.FLAT_UPDATE_MIN_LAYERS
        memory_module.FLAT_UPDATE_MIN_LAYERS = flat_min
        try:
            mem = ResidualMemory()

            def step():
                mem.begin_step()
                g_efs = mem.compensate_all(names, grads)
                sents = [SparseSent(i, e[i]) for i, e in zip(picks, g_efs)]
                mem.update_sparse(names, g_efs, sents)
            total = _time(step, device, repeats)

            def feedback_only():
                mem.begin_step()
                g_efs = mem.compensate_all(names, grads)
                [SparseSent(i, e[i]) for i, e in zip(picks, g_efs)]
            out[label] = total - _time(feedback_only, device, repeats)
        finally:
            memory_module.FLAT_UPDATE_MIN_LAYERS = saved
    return out


def gram_schmidt(shapes, device, repeats: int, rank: int = 4) -> dict:
    g = torch.Generator(device=device).manual_seed(1)
    ps = [torch.randn(min(matrix_shape(s)[0], 1 << 16), rank, generator=g, device=device)
          for s in shapes]
    work = [p.clone() for p in ps]

    def reset():
        torch._foreach_copy_(work, ps)
    base = _time(reset, device, repeats)
    per_layer = _time(lambda: (reset(), [powersgd.orthogonalize_(p) for p in work]),
                      device, repeats) - base
    batched = _time(lambda: (reset(), powersgd.orthogonalize_all_(work, batched=True)),
                    device, repeats) - base
    return {"per layer": per_layer, "batched": batched}


def spreads(shapes, device, repeats: int) -> dict:
    sizes = torch.tensor([s.numel() for s in shapes], device=device)
    kept = torch.clamp(sizes // 10, min=1)
    values = torch.arange(len(shapes), dtype=torch.int64, device=device)
    thresholds = torch.rand(len(shapes), device=device)
    total, total_kept = int(sizes.sum()), int(kept.sum())
    return {
        "offsets over the kept indices: repeat_interleave": _time(
            lambda: values.repeat_interleave(kept, output_size=total_kept), device, repeats),
        "offsets over the kept indices: repeat_by_counts": _time(
            lambda: repeat_by_counts(values, kept, total_kept), device, repeats),
        "thresholds over every entry: repeat_interleave": _time(
            lambda: thresholds.repeat_interleave(sizes, output_size=total), device, repeats),
        "thresholds over every entry: repeat_by_counts": _time(
            lambda: repeat_by_counts(thresholds, sizes, total), device, repeats),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    device = torch.device(args.device)
    exit_without_cuda("batched_paths.py", device, "--device cpu to try it here")
    results = {}
    for model in args.models:
        shapes = _shapes(model)
        rows = {}
        for what, fn in (("residual update, Top-k 10x", residual_update),
                         ("Gram-Schmidt, rank 4", gram_schmidt), ("spread", spreads)):
            for how, ms in fn(shapes, device, args.repeats).items():
                rows[f"{what}: {how}"] = ms
        results[model] = {"layers": len(shapes), "rows": rows}
    name = device_description(device)
    print(f"{name}; wall-clock medians of {args.repeats} calls (ms)")
    print("| model | layers | what | ms |\n|---|---:|---|---:|")
    for model, r in results.items():
        for what, ms in r["rows"].items():
            print(f"| {model} | {r['layers']} | {what} | {ms:.3f} |")
    if args.json:
        args.json.write_text(json.dumps({"device": name, "torch": torch.__version__,
                                         "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
