"""Models of the GraVAC experiments, written from scratch (no torchvision), one family per
file (resnet.py, vgg.py, lstm.py, cnn.py); this module is the registry.

* ``resnet18`` / ``resnet50`` / ``resnet101``: CIFAR-style ResNets (3x3 stem, no max-pool,
  32x32 inputs).
* ``vgg16``: the usual CIFAR VGG-16 (optionally with BatchNorm), classifier width
  configurable so a benchmark can make the dense layers large.
* ``LSTMLanguageModel`` (``lstm``): the 2-layer LSTM language model of Zaremba et al. / the
  PyTorch ``word_language_model`` example, with optional weight tying.
* The models of the GraVAC paper's Table 1, as the authors built them: ``resnet101_paper``
  (torchvision's ``resnet101()``, ~170 MiB), ``vgg16_paper`` (torchvision's ``vgg16_bn()``,
  ~528 MiB) and ``lstm_paper`` (untied, 1500 x 2; ~252 MiB on 10,000 words).
* ``SmallCNN``: a tiny CNN for the demo on scikit-learn's 8x8 digits.
* ``build_model(name, **kwargs)``: build any of the above by name.

Example::

    model = build_model("resnet18", num_classes=10)
    logits = model(torch.randn(2, 3, 32, 32))          # [2, 10]
"""
from __future__ import annotations

import inspect
from typing import Callable

from torch import nn

from ..util.choices import did_you_mean
from .cnn import SmallCNN, WideHeadCNN
from .lstm import Hidden, LSTMLanguageModel, detach_hidden, lstm_paper
from .resnet import BasicBlock, Bottleneck, ResNet, resnet18, resnet50, resnet101, resnet101_paper
from .vgg import VGG, VGG16_CFG, vgg16, vgg16_paper

__all__ = ["BasicBlock", "Bottleneck", "ResNet", "resnet18", "resnet50", "resnet101",
           "resnet101_paper", "VGG", "VGG16_CFG", "vgg16", "vgg16_paper", "LSTMLanguageModel",
           "Hidden", "detach_hidden", "lstm_paper", "SmallCNN", "WideHeadCNN", "MODEL_NAMES",
           "IMAGE_MODELS", "LANGUAGE_MODELS", "build_model"]


_REGISTRY: dict[str, Callable[..., nn.Module]] = {
    "resnet18": resnet18,
    "resnet50": resnet50,
    "resnet101": resnet101,
    "resnet101_paper": resnet101_paper,
    "vgg16": vgg16,
    "vgg16_paper": vgg16_paper,
    "lstm": LSTMLanguageModel,
    "lstm_paper": lstm_paper,
    "small_cnn": SmallCNN,
    "wide_head_cnn": WideHeadCNN,
}

#: Names accepted by ``build_model``.
MODEL_NAMES: tuple[str, ...] = tuple(_REGISTRY)
#: Language models (token ids in, next-token logits out): they take ``vocab_size``.
LANGUAGE_MODELS: tuple[str, ...] = ("lstm", "lstm_paper")
#: Image classifiers of any input size that take ``in_channels`` (the data's channels are
#: their default); ``small_cnn``/``wide_head_cnn`` also take ``image_size``.
IMAGE_MODELS: tuple[str, ...] = ("resnet18", "resnet50", "resnet101", "resnet101_paper",
                                 "vgg16", "vgg16_paper")


def build_model(name: str, **kwargs) -> nn.Module:
    """Build a model by name; ``kwargs`` go to its constructor and are checked first.

    Names: ``resnet18``, ``resnet50``, ``resnet101``, ``vgg16``, ``lstm``
    (``LSTMLanguageModel``, needs ``vocab_size``), ``small_cnn``.

    Example::

        model = build_model("vgg16", num_classes=100, batch_norm=True)
        lm = build_model("lstm", vocab_size=10000, embedding_dim=650, hidden_dim=650)
    """
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(MODEL_NAMES)}"
                         f"{did_you_mean(name, MODEL_NAMES)}")
    params = inspect.signature(factory).parameters
    allowed = [p for p in params if p != "self"]
    unknown = [k for k in kwargs if k not in params]
    if unknown:
        raise ValueError(f"model {name!r} got unknown argument(s) {', '.join(map(repr, unknown))}; "
                         f"allowed: {', '.join(allowed)}{did_you_mean(unknown[0], allowed)}")
    missing = [p.name for p in params.values()
               if p.default is inspect.Parameter.empty and p.name not in kwargs]
    if missing:
        raise ValueError(f"model {name!r} needs argument(s) {', '.join(missing)} "
                         f"(e.g. build_model({name!r}, {missing[0]}=...))")
    return factory(**kwargs)
