"""Model shapes and FLOPs from train.py configs, built by gravac's own model zoo (torch is
imported here only, when a config's model is built).

Example::

    from gravac.train.config import load_config
    cfg = load_config(["configs/models/resnet101_cifar10.yaml"])
    built = build_config_model(cfg)
    shapes_from_config(cfg, built=built).n_total, training_flops(cfg, built)
"""
from __future__ import annotations

from .shapes import ModelShapes

#: The paper's three workloads (docs/ALGORITHM.md, configs/models/).
PAPER_MODELS = {
    "resnet101": "configs/models/resnet101_cifar10.yaml",
    "vgg16": "configs/models/vgg16_cifar100.yaml",
    "lstm": "configs/models/lstm_ptb.yaml",
}
#: PTB's vocabulary (the word_language_model corpus of ptb.train.txt: 9,999 words + <eos>).
PTB_VOCAB = 10_000


def model_kwargs(cfg) -> tuple[dict, str, tuple]:
    """The ``build_model`` options of a config as gravac/train/tasks.py would make them,
    without reading data: (kwargs, input kind "image"/"text", input shape per rank)."""
    from gravac.models import IMAGE_MODELS
    from gravac.train.tasks import data_options

    d = cfg.data
    opts = data_options(cfg)
    language = d.name in ("ptb", "synthetic_text")
    if language:
        vocab = PTB_VOCAB if d.name == "ptb" else opts["vocab_size"]
        return ({"vocab_size": vocab, **cfg.model.options}, "text", (d.bptt, d.batch_size))
    classes, channels, size = {"digits": (10, 1, 8), "cifar10": (10, 3, 32),
                               "cifar100": (100, 3, 32)}.get(
        d.name, (opts.get("num_classes", 10), 3, opts.get("image_size", 32)))
    defaults: dict = {"num_classes": classes}
    if cfg.model.name in ("small_cnn", "wide_head_cnn"):
        defaults.update(in_channels=channels, image_size=size)
    elif cfg.model.name in IMAGE_MODELS:
        defaults.update(in_channels=channels)
    return ({**defaults, **cfg.model.options}, "image", (d.batch_size, channels, size, size))


def build_config_model(cfg):
    """(the config's model, input kind, per-rank input shape). Built on the CPU, where
    initialisation is fast (on the meta device each init op is a slow Python
    decomposition); ``training_flops`` moves it to the meta device to count."""
    from gravac.models import build_model

    kwargs, kind, shape = model_kwargs(cfg)
    return build_model(cfg.model.name, **kwargs), kind, shape


def shapes_from_config(cfg, name: str | None = None, built=None) -> ModelShapes:
    model, _, _ = built or build_config_model(cfg)
    return ModelShapes.from_module(model, cfg.compression.min_compress_numel,
                                   name or cfg.model.name)


def training_flops(cfg, built=None) -> float:
    """Forward + backward FLOPs of one step at the config's per-rank batch (counted by
    torch.utils.flop_counter on the meta device: matmuls and convolutions; nothing is
    computed)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    model, kind, shape = built or build_config_model(cfg)
    model = model.to("meta")
    if kind == "text":
        x = torch.zeros(shape, dtype=torch.long, device="meta")
    else:
        x = torch.zeros(shape, device="meta")
    with FlopCounterMode(display=False) as counter:
        out = model(x)
        out = out[0] if isinstance(out, tuple) else out
        out.float().sum().backward()
    return float(counter.get_total_flops())
