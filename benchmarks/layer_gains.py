"""Per-layer compression gains: would a choice per layer group make a compressed method
eligible where the whole model's gain is below ε?

Trains a workload's model densely on one process (its config, its data, its optimizer) and,
beside the training, runs each compressor with its own per-layer error feedback on the
gradients: Top-k at a CF (largest |values| of g_ef) and PowerSGD at a rank (one power
iteration with a warm-started Q, as ``gravac.compressors.powersgd`` does; layers whose
rank-r form is not smaller go dense). Per layer it reports the mean over the last
``--measure`` steps of the energy gain ‖C(g_ef)‖² / ‖g_ef‖², the layer's share of the
model's g_ef energy and of the bytes the method sends. Then the cheapest split: which
layers to compress, the others dense, for the fewest bytes while the gain GraVAC measures
(over the compressed layers: docs/ALGORITHM.md §1) stays >= ε (``best_split``).

One process, no exchange: gains of one rank's g_ef (with N ranks gravac measures the
averaged ones), a dense trajectory (the compressors' residuals do not feed the training).
It answers where per-group choice could pay, not how fast a run would be.

    .venv/bin/python benchmarks/layer_gains.py [--workloads lstm wide_cnn resnet18]
        [--steps 100] [--measure 30] [--methods powersgd:4 sparse:10 sparse:40]
        [--epsilon 0.7] [--result-set NAME]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
import result_set  # noqa: E402
from end_to_end import WORKLOADS  # noqa: E402

from gravac.controllers.split import LayerGain, compressed_layers, measured_gain  # noqa: E402
from gravac.engine.options import GravacOptions  # noqa: E402
from gravac.train.config import load_config  # noqa: E402
from gravac.train.tasks import build_task  # noqa: E402
from gravac.util import sizes  # noqa: E402

#: Layers below this many elements go dense: the engine's default.
MIN_COMPRESS_NUMEL = GravacOptions().min_compress_numel
VALUE_BYTES, INDEX_BYTES = 4, 4


class TopK:
    def __init__(self, cf: float):
        self.cf = cf

    def compresses(self, shape) -> bool:
        return True

    def sent_bytes(self, shape) -> int:
        return (VALUE_BYTES + INDEX_BYTES) * sizes.num_kept(math.prod(shape), self.cf)

    def __call__(self, name: str, g: torch.Tensor) -> torch.Tensor:
        flat = g.reshape(-1)
        keep = torch.topk(flat.abs(), sizes.num_kept(flat.numel(), self.cf), sorted=False).indices
        out = torch.zeros_like(flat)
        out[keep] = flat[keep]
        return out.view_as(g)


class PowerSGD:
    def __init__(self, rank: int):
        self.rank, self.q = rank, {}

    def compresses(self, shape) -> bool:
        return sizes.compression_factor(*sizes.matrix_shape(shape), self.rank) > 1

    def sent_bytes(self, shape) -> int:
        rows, cols = sizes.matrix_shape(shape)
        return VALUE_BYTES * self.rank * (rows + cols)

    def __call__(self, name: str, g: torch.Tensor) -> torch.Tensor:
        m = g.reshape(g.shape[0], -1)
        if name not in self.q:
            gen = torch.Generator().manual_seed(len(self.q))
            self.q[name] = torch.randn(m.shape[1], self.rank, generator=gen)
        p = torch.linalg.qr(m @ self.q[name]).Q
        self.q[name] = m.T @ p
        return (p @ self.q[name].T).view_as(g)


def parse_method(text: str):
    kind, _, level = text.partition(":")
    if kind == "sparse":
        return TopK(float(level))
    if kind == "powersgd":
        return PowerSGD(int(level))
    raise SystemExit(f"--methods {text!r}: write sparse:CF or powersgd:RANK")


def one_process(workload: str, steps: int):
    """``workload``'s task on one process (local transport, its config's seed) and its
    config's SGD over the task's model, unwrapped: (task, optimizer)."""
    config, _, _ = WORKLOADS[workload]
    cfg = load_config([str(REPO / config), str(REPO / "configs/compression/dense.yaml")],
                      ["run.backend=local", f"run.steps={steps}", "run.report=false"])
    torch.manual_seed(cfg.run.seed)
    task = build_task(cfg, 0, 1)
    o = cfg.optimizer
    return task, torch.optim.SGD(task.model.parameters(), lr=o.lr, momentum=o.momentum,
                                 weight_decay=o.weight_decay)


def endless_batches(task):
    """``task``'s training batches, epoch after epoch."""
    epoch = 0
    while True:
        yield from task.batches(epoch, 0)
        epoch += 1


def measure(workload: str, steps: int, measure_steps: int, methods: list[str]) -> dict:
    task, opt = one_process(workload, steps)
    model = task.model
    layers = [(n, p) for n, p in model.named_parameters() if p.numel() >= MIN_COMPRESS_NUMEL]
    compressors = {text: parse_method(text) for text in methods}
    residual = {text: {n: torch.zeros_like(p) for n, p in layers} for text in methods}
    # Per method and layer: sums of ||C(g_ef)||^2 and ||g_ef||^2 over the measured steps.
    kept = {text: dict.fromkeys((n for n, _ in layers), 0.0) for text in methods}
    total = {text: dict.fromkeys((n for n, _ in layers), 0.0) for text in methods}
    batches, step = endless_batches(task), 0
    while step < steps:
        batch = next(batches)
        opt.zero_grad()
        task.loss(batch).backward()
        with torch.no_grad():
            for text, compress in compressors.items():
                for n, p in layers:
                    g_ef = p.grad + residual[text][n]
                    sent = compress(n, g_ef) if compress.compresses(p.shape) else g_ef
                    residual[text][n] = g_ef - sent
                    if step >= steps - measure_steps:
                        kept[text][n] += float(sent.square().sum())
                        total[text][n] += float(g_ef.square().sum())
        opt.step()
        step += 1
    return {"workload": workload, "steps": steps, "measured_steps": measure_steps,
            "methods": {text: _per_layer(compressors[text], layers, kept[text], total[text])
                        for text in methods}}


def _per_layer(compress, layers, kept, total) -> list[dict]:
    energy = sum(total.values())
    rows = []
    for n, p in layers:
        low = compress.compresses(p.shape)
        rows.append({"layer": n, "shape": list(p.shape), "numel": p.numel(),
                     "gain": kept[n] / total[n] if total[n] > 0 else 1.0,
                     "energy_share": total[n] / energy if energy > 0 else 0.0,
                     "sent_bytes": compress.sent_bytes(p.shape) if low else VALUE_BYTES * p.numel(),
                     "compressed": low})
    return rows


def best_split(rows: list[dict], epsilon: float) -> dict:
    """The layers to compress for the fewest bytes while the gain GraVAC measures, over the
    compressed layers only, stays >= ε (``gravac.controllers.split``, what ``controller:
    auto`` with ``split_layers`` runs); the others go dense. Also the gain counted over
    the whole model, dense layers at 1: what a criterion over every parameter would read."""
    dense = sum(VALUE_BYTES * r["numel"] for r in rows)
    gains = [LayerGain(r["layer"], r["gain"], r["energy_share"],
                       VALUE_BYTES * r["numel"] - r["sent_bytes"] if r["compressed"] else 0)
             for r in rows]
    low = [g.name for g in gains if g.saved > 0]
    names = set(compressed_layers(gains, epsilon))
    chosen = [r for r in rows if r["layer"] in names]
    split_bytes = sum(r["sent_bytes"] if r["layer"] in names else VALUE_BYTES * r["numel"]
                      for r in rows)
    return {"whole_gain": measured_gain(gains, low), "whole_bytes_vs_dense": sum(
                r["sent_bytes"] if r["layer"] in low else VALUE_BYTES * r["numel"]
                for r in rows) / dense,
            "split_layers": [r["layer"] for r in chosen],
            "split_gain": measured_gain(gains, names),
            "split_model_gain": 1 - sum((1 - r["gain"]) * r["energy_share"] for r in chosen),
            "split_bytes_vs_dense": split_bytes / dense}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS),
                        default=list(WORKLOADS))
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--measure", type=int, default=30,
                        help="the gains of the last this many steps are summed")
    parser.add_argument("--methods", nargs="+", default=["powersgd:4", "sparse:10", "sparse:40"])
    parser.add_argument("--epsilon", type=float, default=0.7,
                        help="the gain a split must reach, in (0, 1] (default: 0.7)")
    result_set.add_argument(parser)
    args = parser.parse_args(argv)
    if not 0 < args.epsilon <= 1:
        parser.error(f"argument --epsilon: must be in (0, 1] (a share of the energy), got "
                     f"{args.epsilon:g}")
    if not 1 <= args.measure <= args.steps:
        parser.error(f"--measure {args.measure}: must be in [1, --steps={args.steps}]")
    for text in args.methods:
        parse_method(text)              # a bad method fails before any training
    if args.result_set:
        result_set.check_name(args.result_set)
    torch.set_num_threads(1)
    data = []
    with result_set.recording_stdout() as printed:
        for workload in args.workloads:
            out = measure(workload, args.steps, args.measure, args.methods)
            data.append(out)
            for text, rows in out["methods"].items():
                split = best_split(rows, args.epsilon)
                out.setdefault("splits", {})[text] = split
                _print(workload, text, rows, split, args.epsilon)
    result_set.keep(args.result_set, [], {"results.md": printed.getvalue(),
                                          "layer_gains.json": json.dumps(data, indent=1)})
    return 0


def _print(workload: str, text: str, rows: list[dict], split: dict, epsilon: float) -> None:
    def gain(value):
        return "none compressed" if value is None else f"{value:.3f}"
    print(f"\n### {workload}, {text}\n\nAll its layers compressed: gain {gain(split['whole_gain'])} "
          f"(over the compressed layers, as gravac measures it), "
          f"{split['whole_bytes_vs_dense']:.3f} of dense's bytes. The cheapest split whose "
          f"gain is >= {epsilon:g}: {len(split['split_layers'])} of {len(rows)} layers "
          f"compressed (the others dense), gain {gain(split['split_gain'])}, "
          f"{split['split_bytes_vs_dense']:.3f} of dense's bytes; counted over the whole "
          f"model with the dense layers at 1, {split['split_model_gain']:.3f}.\n")
    print("| layer | shape | gain | energy share | bytes share | compressed in the split |")
    print("|---|---|---:|---:|---:|---|")
    sent = sum(r["sent_bytes"] for r in rows)
    for r in sorted(rows, key=lambda r: -r["energy_share"])[:12]:
        print(f"| {r['layer']} | {'x'.join(map(str, r['shape']))} | {r['gain']:.3f} | "
              f"{r['energy_share']:.3f} | {r['sent_bytes'] / sent:.3f} | "
              f"{'yes' if r['layer'] in split['split_layers'] else 'no'} |")
    if len(rows) > 12:
        print(f"\n({len(rows) - 12} more layers, with less energy each, in layer_gains.json)")


if __name__ == "__main__":
    sys.exit(main())
