"""Models of the GraVAC experiments, written from scratch (no torchvision).

* ``resnet18`` / ``resnet50`` / ``resnet101``: CIFAR-style ResNets (3x3 stem, no max-pool,
  32x32 inputs).
* ``vgg16``: the usual CIFAR VGG-16 (optionally with BatchNorm), classifier width
  configurable so a benchmark can make the dense layers large.
* ``LSTMLanguageModel``: the 2-layer LSTM language model of Zaremba et al. / the PyTorch
  ``word_language_model`` example, with optional weight tying.
* ``SmallCNN``: a tiny CNN for the demo on scikit-learn's 8x8 digits.
* ``build_model(name, **kwargs)``: build any of the above by name.

Example::

    model = build_model("resnet18", num_classes=10)
    logits = model(torch.randn(2, 3, 32, 32))          # [2, 10]
"""
from __future__ import annotations

import inspect
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["BasicBlock", "Bottleneck", "ResNet", "resnet18", "resnet50", "resnet101",
           "VGG", "VGG16_CFG", "vgg16", "LSTMLanguageModel", "detach_hidden", "SmallCNN",
           "MODEL_NAMES", "build_model", "WideHeadCNN"]


# --------------------------------------------------------------------------- ResNet


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (ResNet-18/34).

    Example::

        block = BasicBlock(64, 128, stride=2)
        block(torch.randn(1, 64, 32, 32)).shape        # [1, 128, 16, 16]
    """

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = _shortcut(in_planes, planes * self.expansion, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3, 1x1 expand (x4) with a residual connection (ResNet-50/101).

    Example::

        block = Bottleneck(64, 64)
        block(torch.randn(1, 64, 8, 8)).shape          # [1, 256, 8, 8]
    """

    expansion = 4

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.shortcut = _shortcut(in_planes, planes * self.expansion, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + self.shortcut(x))


def _shortcut(in_planes: int, out_planes: int, stride: int) -> nn.Module:
    # Projection only where the shape changes; identity otherwise (option B of He et al.).
    if stride == 1 and in_planes == out_planes:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(in_planes, out_planes, 1, stride=stride, bias=False),
                         nn.BatchNorm2d(out_planes))


class ResNet(nn.Module):
    """CIFAR-style ResNet: 3x3 stem conv (no max-pool), four stages, global average pool.

    Args:
        block: ``BasicBlock`` or ``Bottleneck``.
        num_blocks: blocks per stage, e.g. ``(2, 2, 2, 2)`` for ResNet-18.
        num_classes: output logits.
        in_channels: input image channels.

    Input ``[batch, in_channels, H, W]`` (32x32 for CIFAR), output ``[batch, num_classes]``.

    Example::

        model = ResNet(BasicBlock, (2, 2, 2, 2), num_classes=10)   # == resnet18()
    """

    def __init__(self, block: type[BasicBlock] | type[Bottleneck], num_blocks: tuple[int, ...],
                 num_classes: int = 10, in_channels: int = 3):
        super().__init__()
        _check_positive(num_classes=num_classes, in_channels=in_channels)
        self.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        in_planes = 64
        stages = []
        for i, (planes, blocks) in enumerate(zip((64, 128, 256, 512), num_blocks)):
            stride = 1 if i == 0 else 2
            layers = []
            for s in [stride] + [1] * (blocks - 1):
                layers.append(block(in_planes, planes, s))
                in_planes = planes * block.expansion
            stages.append(nn.Sequential(*layers))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.linear = nn.Linear(512 * block.expansion, num_classes)
        _init_conv_bn(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.linear(out)


def resnet18(num_classes: int = 10, in_channels: int = 3) -> ResNet:
    """CIFAR ResNet-18 (~11.2M parameters for 10 classes).

    Example::

        resnet18(num_classes=10)(torch.randn(2, 3, 32, 32)).shape   # [2, 10]
    """
    return ResNet(BasicBlock, (2, 2, 2, 2), num_classes, in_channels)


def resnet50(num_classes: int = 10, in_channels: int = 3) -> ResNet:
    """CIFAR ResNet-50 (~23.5M parameters for 10 classes).

    Example::

        model = resnet50(num_classes=100)
    """
    return ResNet(Bottleneck, (3, 4, 6, 3), num_classes, in_channels)


def resnet101(num_classes: int = 10, in_channels: int = 3) -> ResNet:
    """CIFAR ResNet-101 (~42.5M parameters for 10 classes), the GraVAC CIFAR-10 model.

    Example::

        model = resnet101(num_classes=10)
    """
    return ResNet(Bottleneck, (3, 4, 23, 3), num_classes, in_channels)


# --------------------------------------------------------------------------- VGG

#: CIFAR VGG-16 feature configuration: channel counts, "M" = 2x2 max-pool.
VGG16_CFG: tuple[int | str, ...] = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M",
                                    512, 512, 512, "M", 512, 512, 512, "M")


class VGG(nn.Module):
    """VGG for small images: 3x3 conv stacks, then a 3-layer classifier.

    The features end with a global average pool, a no-op for 32x32 inputs (five max-pools
    leave 1x1) that lets other sizes work too. The classifier is
    ``Dropout, Linear(C, W), ReLU, Dropout, Linear(W, W), ReLU, Linear(W, num_classes)``
    with ``W = classifier_width``; make ``W`` large (e.g. 4096) to get big dense layers.

    Example::

        model = VGG(VGG16_CFG, num_classes=100, batch_norm=True)   # == vgg16()
    """

    def __init__(self, cfg: tuple[int | str, ...], num_classes: int = 100, batch_norm: bool = True,
                 classifier_width: int = 512, dropout: float = 0.5, in_channels: int = 3):
        super().__init__()
        _check_positive(num_classes=num_classes, classifier_width=classifier_width,
                        in_channels=in_channels)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"vgg: dropout must be in [0, 1), got {dropout}")
        layers: list[nn.Module] = []
        channels = in_channels
        for v in cfg:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
                continue
            # The conv bias is redundant right before BatchNorm (BN has its own shift).
            layers.append(nn.Conv2d(channels, int(v), 3, padding=1, bias=not batch_norm))
            if batch_norm:
                layers.append(nn.BatchNorm2d(int(v)))
            layers.append(nn.ReLU(inplace=True))
            channels = int(v)
        self.features = nn.Sequential(*layers)
        w = classifier_width
        self.classifier = nn.Sequential(
            nn.Dropout(dropout), nn.Linear(channels, w), nn.ReLU(inplace=True),
            nn.Dropout(dropout), nn.Linear(w, w), nn.ReLU(inplace=True),
            nn.Linear(w, num_classes))
        _init_conv_bn(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.adaptive_avg_pool2d(self.features(x), 1).flatten(1)
        return self.classifier(out)


def vgg16(num_classes: int = 100, batch_norm: bool = True, classifier_width: int = 512,
          dropout: float = 0.5, in_channels: int = 3) -> VGG:
    """CIFAR VGG-16 (~15.3M parameters with BatchNorm, 100 classes, width 512).

    Example::

        model = vgg16(num_classes=100)                        # the GraVAC CIFAR-100 model
        big = vgg16(num_classes=100, classifier_width=4096)   # ~34M params, big dense layers
    """
    return VGG(VGG16_CFG, num_classes, batch_norm, classifier_width, dropout, in_channels)


# --------------------------------------------------------------------------- LSTM LM


Hidden = tuple[torch.Tensor, torch.Tensor]


class LSTMLanguageModel(nn.Module):
    """Word-level LSTM language model (Zaremba et al. 2014, PyTorch ``word_language_model``).

    Embedding -> dropout -> ``num_layers``-layer LSTM -> dropout -> Linear to the vocabulary.
    With ``tie_weights`` the decoder shares the embedding matrix (Press & Wolf 2016), which
    requires ``embedding_dim == hidden_dim``. The defaults are the "large" PTB setting.

    Shapes (sequence-first, as produced by ``gravac.train.data.get_bptt_batch``):

    * ``input``: int64 ``[seq_len, batch]`` token ids.
    * ``hidden``: ``(h, c)``, each ``[num_layers, batch, hidden_dim]`` (see ``init_hidden``).
    * returns ``(logits, hidden)``: logits ``[seq_len * batch, vocab_size]`` (flattened, so
      ``F.cross_entropy(logits, target)`` takes the flat target of ``get_bptt_batch``) and the
      new hidden state, same shapes as the input one.

    Example::

        model = LSTMLanguageModel(vocab_size=10000, embedding_dim=650, hidden_dim=650, dropout=0.5)
        hidden = model.init_hidden(batch_size=20)
        logits, hidden = model(tokens[:35], hidden)     # tokens: [steps, 20]
        hidden = detach_hidden(hidden)                  # truncate BPTT between batches
    """

    def __init__(self, vocab_size: int, embedding_dim: int = 1500, hidden_dim: int = 1500,
                 num_layers: int = 2, dropout: float = 0.65, tie_weights: bool = True):
        super().__init__()
        _check_positive(vocab_size=vocab_size, embedding_dim=embedding_dim,
                        hidden_dim=hidden_dim, num_layers=num_layers)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"lstm: dropout must be in [0, 1), got {dropout}")
        if tie_weights and embedding_dim != hidden_dim:
            raise ValueError(f"lstm: tie_weights=True requires embedding_dim == hidden_dim, got "
                             f"embedding_dim={embedding_dim} and hidden_dim={hidden_dim}; make "
                             f"them equal or pass tie_weights=False")
        self.vocab_size = vocab_size
        self.hidden_dim = hidden_dim
        self.num_layers = num_layers
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(vocab_size, embedding_dim)
        # nn.LSTM's dropout acts between layers only; self.drop handles input and output.
        self.rnn = nn.LSTM(embedding_dim, hidden_dim, num_layers,
                           dropout=dropout if num_layers > 1 else 0.0)
        self.decoder = nn.Linear(hidden_dim, vocab_size)
        # Same initialisation as the PyTorch example: small uniform embeddings/decoder.
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        if tie_weights:
            self.decoder.weight = self.encoder.weight
        else:
            nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def init_hidden(self, batch_size: int) -> Hidden:
        """Zero ``(h, c)``, each ``[num_layers, batch_size, hidden_dim]``, on the model's device.

        Example::

            hidden = model.init_hidden(20)
        """
        weight = self.decoder.bias
        shape = (self.num_layers, batch_size, self.hidden_dim)
        return (weight.new_zeros(shape), weight.new_zeros(shape))

    def forward(self, input: torch.Tensor, hidden: Hidden | None = None
                ) -> tuple[torch.Tensor, Hidden]:
        if input.dim() != 2:
            raise ValueError(f"lstm: input must be [seq_len, batch] token ids, got shape "
                             f"{tuple(input.shape)}")
        if hidden is None:
            hidden = self.init_hidden(input.shape[1])
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        logits = self.decoder(self.drop(output))
        return logits.view(-1, self.vocab_size), hidden


def detach_hidden(hidden: Hidden) -> Hidden:
    """Cut the autograd history of an LSTM state (truncated BPTT between batches).

    Example::

        hidden = detach_hidden(hidden)
    """
    return tuple(h.detach() for h in hidden)  # type: ignore[return-value]


# --------------------------------------------------------------------------- SmallCNN


class SmallCNN(nn.Module):
    """A small CNN for the demo on scikit-learn's 8x8 handwritten digits (~38k parameters).

    conv3x3(in->16) -> ReLU -> conv3x3(16->32) -> ReLU -> max-pool 2 -> Linear(->64) -> ReLU
    -> Linear(64->num_classes). ``conv2.weight`` (4,608 entries) and ``fc1.weight``
    (32,768 for 8x8 inputs) are large enough to be compressed.

    Input ``[batch, in_channels, image_size, image_size]``, output ``[batch, num_classes]``.

    Example::

        model = SmallCNN()
        model(torch.rand(4, 1, 8, 8)).shape             # [4, 10]
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 1, image_size: int = 8):
        super().__init__()
        _check_positive(num_classes=num_classes, in_channels=in_channels)
        if image_size < 2:
            raise ValueError(f"small_cnn: image_size must be >= 2 (one 2x2 max-pool), "
                             f"got {image_size}")
        self.conv1 = nn.Conv2d(in_channels, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * (image_size // 2) ** 2, 64)
        self.fc2 = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.conv1(x))
        out = F.max_pool2d(F.relu(self.conv2(out)), 2)
        out = F.relu(self.fc1(out.flatten(1)))
        return self.fc2(out)


class WideHeadCNN(nn.Module):
    """A small conv stem with a wide fully connected head: many parameters, little compute.

    The communication-bound regime gradient compression is for, at a size that trains in
    minutes on CPU (the end-to-end benchmark uses it): conv3x3(in->16) -> ReLU -> pool ->
    conv3x3(16->32) -> ReLU -> pool -> Linear(->width) -> ReLU -> Linear(width->width) ->
    ReLU -> Linear(width->num_classes). With 32x32 inputs and width 1024: ~3.2M parameters,
    ~95% of them in the two wide layers.

    Example::

        model = WideHeadCNN(num_classes=10, width=1024)
        model(torch.rand(4, 3, 32, 32)).shape           # [4, 10]
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 3, image_size: int = 32,
                 width: int = 1024):
        super().__init__()
        _check_positive(num_classes=num_classes, in_channels=in_channels, width=width)
        if image_size < 4:
            raise ValueError(f"wide_head_cnn: image_size must be >= 4 (two 2x2 max-pools), "
                             f"got {image_size}")
        self.conv1 = nn.Conv2d(in_channels, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * (image_size // 4) ** 2, width)
        self.fc2 = nn.Linear(width, width)
        self.fc3 = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.max_pool2d(F.relu(self.conv1(x)), 2)
        out = F.max_pool2d(F.relu(self.conv2(out)), 2)
        out = F.relu(self.fc1(out.flatten(1)))
        out = F.relu(self.fc2(out))
        return self.fc3(out)


# --------------------------------------------------------------------------- registry


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if int(value) < 1:
            raise ValueError(f"{name} must be a positive integer, got {value}")


def _init_conv_bn(model: nn.Module) -> None:
    # He initialisation for ReLU networks, BN as identity: the torchvision defaults.
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


_REGISTRY: dict[str, Callable[..., nn.Module]] = {
    "resnet18": resnet18,
    "resnet50": resnet50,
    "resnet101": resnet101,
    "vgg16": vgg16,
    "lstm": LSTMLanguageModel,
    "small_cnn": SmallCNN,
    "wide_head_cnn": WideHeadCNN,
}

#: Names accepted by ``build_model``.
MODEL_NAMES: tuple[str, ...] = tuple(_REGISTRY)


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
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(MODEL_NAMES)}")
    params = inspect.signature(factory).parameters
    allowed = [p for p in params if p != "self"]
    unknown = [k for k in kwargs if k not in params]
    if unknown:
        raise ValueError(f"model {name!r} got unknown argument(s) {', '.join(map(repr, unknown))}; "
                         f"allowed: {', '.join(allowed)}")
    missing = [p.name for p in params.values()
               if p.default is inspect.Parameter.empty and p.name not in kwargs]
    if missing:
        raise ValueError(f"model {name!r} needs argument(s) {', '.join(missing)} "
                         f"(e.g. build_model({name!r}, {missing[0]}=...))")
    return factory(**kwargs)
