"""Multi-level vs direct compression, and the GraVAC step overhead.

Part 1, per compressor and model (parameter shapes of ResNet-101/CIFAR-10, VGG-16/CIFAR-100
and the 2-layer LSTM language model, built from gravac.models; no training): time of

  direct:      compress every compressible layer to θmin AND, separately, to θc from the
               full gradient (two passes over n elements per layer);
  multi-level: compress to θmin, then θmin -> θc over the k_min kept values;

with θmin = 10 and θc = 1000, and print direct / multi-level (the paper reports 1.1x to
1.83x; target >= 1.5x). "Compress" is select + gathering the values.

Part 2: the GraVAC compression phase as the optimizer runs it (both levels, the squared
norms, the gain allreduce) divided by a static single-level compression at θmin, measured
through the optimizer's own code path (Horovod with one rank). Target <= 1.3x.

    .venv/bin/python benchmarks/multilevel.py [--models resnet101 vgg16 lstm] [--repeats 3]
        [--result-set NAME]

Ratios are measured within one run, on one CPU thread, median of ``--repeats``.
"""
from __future__ import annotations

import argparse
import json

import torch

from gravac import compressors
from gravac.compressors import SelectContext, num_kept
from gravac.models import build_model
import result_set
from timing import median_time as timed

#: Compressors with two levels to compare: the registry's sparsifiers but "none" (it
#: keeps everything, and the static controller of part 2 refuses it).
TWO_LEVEL = tuple(name for name, cls in compressors.REGISTRY.items()
                  if not cls.is_lowrank and name != "none")

MODELS = {
    "resnet101": dict(name="resnet101", num_classes=10),
    "vgg16": dict(name="vgg16", num_classes=100),
    "lstm": dict(name="lstm", vocab_size=10_000),
    # Table 1's models (the paper's Table 3 times these): configs/paper/table3_multilevel.sh
    "resnet101_paper": dict(name="resnet101_paper", num_classes=1000),
    "vgg16_paper": dict(name="vgg16_paper", num_classes=1000),
    "lstm_paper": dict(name="lstm_paper", vocab_size=10_000),
}


def layer_gradients(model_key: str, min_numel: int, seed: int = 0) -> list[torch.Tensor]:
    """Random stand-in gradients, flat, one per compressible parameter of the model."""
    kwargs = dict(MODELS[model_key])
    model = build_model(kwargs.pop("name"), **kwargs)
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(p.numel(), generator=g) for p in model.parameters()
            if p.numel() >= min_numel]


def direct(comp, grads, theta_min, theta_c):
    for i, g in enumerate(grads):
        idx = comp.select(g, num_kept(g.numel(), theta_min), SelectContext(layer=i))
        g[idx]
        idx = comp.select(g, num_kept(g.numel(), theta_c), SelectContext(layer=i, level=1))
        g[idx]


def multilevel(comp, grads, theta_min, theta_c):
    for i, g in enumerate(grads):
        idx = comp.select(g, num_kept(g.numel(), theta_min), SelectContext(layer=i))
        vals = g[idx]
        sub = comp.select(vals, num_kept(g.numel(), theta_c), SelectContext(layer=i, level=1))
        idx[sub], vals[sub]


def single(comp, grads, theta_min):
    for i, g in enumerate(grads):
        idx = comp.select(g, num_kept(g.numel(), theta_min), SelectContext(layer=i))
        g[idx]


def part1(models, names, theta_min, theta_c, repeats, min_numel):
    rows = []
    for model_key in models:
        grads = layer_gradients(model_key, min_numel)
        numel = sum(g.numel() for g in grads)
        for name in names:
            comp = compressors.get(name)
            t_direct = timed(lambda: direct(comp, grads, theta_min, theta_c), repeats)
            t_multi = timed(lambda: multilevel(comp, grads, theta_min, theta_c), repeats)
            t_single = timed(lambda: single(comp, grads, theta_min), repeats)
            rows.append((model_key, numel, len(grads), name, t_direct, t_multi, t_single))
    return rows


def part2(models, names, theta_min, theta_c, repeats, min_numel):
    """GraVAC's phase through the optimizer's own engine: both levels' selection and the
    gains allreduce (Horovod, 1 rank)."""
    import horovod.torch as hvd

    import gravac
    from gravac.controllers import Static
    from gravac.engine.selection import gain_rows, select_levels

    hvd.init()
    rows = []
    for model_key in models:
        kwargs = dict(MODELS[model_key])
        model = build_model(kwargs.pop("name"), **kwargs)
        g = torch.Generator().manual_seed(1)
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=g)
        for name in names:
            opt = gravac.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                              model.named_parameters(), compressor=name,
                                              controller=Static(theta_min),
                                              min_compress_numel=min_numel)
            engine = opt._engine
            layers = [l for l in engine.layers if l.compressible]
            g_efs = [opt.memory.compensate(l.name, l.param.grad) for l in layers]

            comp = engine.compressor

            def static_phase():
                select_levels(comp, [(l, g, theta_min, None) for l, g in zip(layers, g_efs)],
                              0, 0)

            def gravac_phase():
                sels = select_levels(
                    comp, [(l, g, theta_min, theta_c) for l, g in zip(layers, g_efs)], 0, 0)
                engine.agree_gain_rows(gain_rows(sels, "energy"))

            t_static = timed(static_phase, repeats)
            t_gravac = timed(gravac_phase, repeats)
            rows.append((model_key, name, t_static, t_gravac))
    return rows


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--compressors", nargs="+", default=list(TWO_LEVEL),
                        choices=TWO_LEVEL, metavar="NAME",
                        help=f"sparsifiers, both levels (default: {' '.join(TWO_LEVEL)})")
    parser.add_argument("--theta-min", type=float, default=10,
                        help="the first level's CF, >= 1 (default: 10)")
    parser.add_argument("--theta-c", type=float, default=1000,
                        help="the second level's CF, >= --theta-min (default: 1000)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--min-compress-numel", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip-overhead", action="store_true", help="only part 1")
    result_set.add_argument(parser)
    args = parser.parse_args(argv)
    if not args.theta_min >= 1:
        parser.error(f"argument --theta-min: must be >= 1 (1 = dense), got {args.theta_min:g}")
    if not args.theta_c >= args.theta_min:
        parser.error(f"argument --theta-c: {args.theta_c:g} is below --theta-min "
                     f"{args.theta_min:g}; the second level compresses the first's values "
                     "further")
    if args.result_set:
        result_set.check_name(args.result_set)
    torch.set_num_threads(args.threads)
    with result_set.recording_stdout() as printed:
        data = measure(args)
    result_set.keep(args.result_set, [], {"results.md": printed.getvalue(),
                                          "multilevel.json": json.dumps(data, indent=1)})


def measure(args) -> dict:
    """Print both tables for ``args`` and return their rows (seconds) as data."""
    data = {"torch": torch.__version__, "threads": args.threads, "repeats": args.repeats,
            "theta_min": args.theta_min, "theta_c": args.theta_c, "multilevel": [],
            "overhead": []}
    print(f"torch {torch.__version__}, {args.threads} thread(s), median of {args.repeats}; "
          f"θmin={args.theta_min:g}, θc={args.theta_c:g}\n")
    print("Multi-level vs direct compression (target: direct / multi-level >= 1.5x)\n")
    print("| model | compressed elements (layers) | compressor | direct (ms) | multi-level (ms) "
          "| θmin only (ms) | direct / multi-level |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for model_key, numel, n_layers, name, t_d, t_m, t_s in part1(
            args.models, args.compressors, args.theta_min, args.theta_c, args.repeats,
            args.min_compress_numel):
        print(f"| {model_key} | {numel:,} ({n_layers}) | {name} | {t_d * 1e3:.0f} | "
              f"{t_m * 1e3:.0f} | {t_s * 1e3:.0f} | {t_d / t_m:.2f}x |")
        data["multilevel"].append({"model": model_key, "numel": numel, "layers": n_layers,
                                   "compressor": name, "direct": t_d, "multilevel": t_m,
                                   "theta_min_only": t_s})
    if args.skip_overhead:
        return data
    print("\nGraVAC compression phase vs static single-level at θmin (target <= 1.3x)\n")
    print("| model | compressor | static θmin (ms) | GraVAC: 2 levels + norms + allreduce (ms) "
          "| ratio |")
    print("|---|---|---:|---:|---:|")
    for model_key, name, t_static, t_gravac in part2(
            args.models, args.compressors, args.theta_min, args.theta_c, args.repeats,
            args.min_compress_numel):
        print(f"| {model_key} | {name} | {t_static * 1e3:.0f} | {t_gravac * 1e3:.0f} | "
              f"{t_gravac / t_static:.2f}x |")
        data["overhead"].append({"model": model_key, "compressor": name, "static": t_static,
                                 "gravac": t_gravac})
    return data

if __name__ == "__main__":
    main()
