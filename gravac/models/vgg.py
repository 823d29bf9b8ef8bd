"""VGG-16: the compact CIFAR one (``vgg16``: a global pool, classifier width configurable)
and the GraVAC paper's (``vgg16_paper``: torchvision's ``vgg16_bn()`` layout, a 7x7 adaptive
pool and a 4096-4096 classifier, 1000 classes: 138,365,992 parameters, ~528 MiB in fp32,
the size of the paper's Table 1; the authors trained it unchanged on CIFAR-100).

Example::

    model = vgg16(num_classes=100, batch_norm=True)
    paper = vgg16_paper()
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .common import check_positive, init_conv_bn


#: VGG-16 feature configuration: channel counts, "M" = 2x2 max-pool (13 convolutions).
VGG16_CFG: tuple[int | str, ...] = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M",
                                    512, 512, 512, "M", 512, 512, 512, "M")


#: "cifar": a global pool and a compact classifier; "imagenet": torchvision's layout.
VGG_LAYOUTS = ("cifar", "imagenet")


class VGG(nn.Module):
    """VGG for small images: 3x3 conv stacks, then a 3-layer classifier.

    The features end with a global average pool, a no-op for 32x32 inputs (five max-pools
    leave 1x1) that lets other sizes work too. The classifier is
    ``Dropout, Linear(C, W), ReLU, Dropout, Linear(W, W), ReLU, Linear(W, num_classes)``
    with ``W = classifier_width``; make ``W`` large (e.g. 4096) to get big dense layers.

    ``layout="imagenet"`` is torchvision's instead: every convolution has a bias, the
    features end with an adaptive average pool to 7x7 (a 1x1 map is repeated), and the
    classifier is ``Linear(C·49, W), ReLU, Dropout, Linear(W, W), ReLU, Dropout,
    Linear(W, num_classes)``.

    Example::

        model = VGG(VGG16_CFG, num_classes=100, batch_norm=True)   # == vgg16()
    """

    def __init__(self, cfg: tuple[int | str, ...], num_classes: int = 100, batch_norm: bool = True,
                 classifier_width: int = 512, dropout: float = 0.5, in_channels: int = 3,
                 layout: str = "cifar"):
        super().__init__()
        if layout not in VGG_LAYOUTS:
            raise ValueError(f"vgg: layout must be one of {', '.join(VGG_LAYOUTS)}, "
                             f"got {layout!r}")
        self.pool_size = 1 if layout == "cifar" else 7
        check_positive(num_classes=num_classes, classifier_width=classifier_width,
                        in_channels=in_channels)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"vgg: dropout must be in [0, 1), got {dropout}")
        layers: list[nn.Module] = []
        channels = in_channels
        for v in cfg:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
                continue
            # The conv bias is redundant right before BatchNorm (BN has its own shift);
            # torchvision's layout keeps it.
            layers.append(nn.Conv2d(channels, int(v), 3, padding=1,
                                    bias=not batch_norm or layout == "imagenet"))
            if batch_norm:
                layers.append(nn.BatchNorm2d(int(v)))
            layers.append(nn.ReLU(inplace=True))
            channels = int(v)
        self.features = nn.Sequential(*layers)
        w = classifier_width
        if layout == "cifar":
            self.classifier = nn.Sequential(
                nn.Dropout(dropout), nn.Linear(channels, w), nn.ReLU(inplace=True),
                nn.Dropout(dropout), nn.Linear(w, w), nn.ReLU(inplace=True),
                nn.Linear(w, num_classes))
        else:
            self.classifier = nn.Sequential(
                nn.Linear(channels * 49, w), nn.ReLU(inplace=True), nn.Dropout(dropout),
                nn.Linear(w, w), nn.ReLU(inplace=True), nn.Dropout(dropout),
                nn.Linear(w, num_classes))
        init_conv_bn(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.adaptive_avg_pool2d(self.features(x), self.pool_size).flatten(1)
        return self.classifier(out)


def vgg16(num_classes: int = 100, batch_norm: bool = True, classifier_width: int = 512,
          dropout: float = 0.5, in_channels: int = 3) -> VGG:
    """CIFAR VGG-16 (~15.3M parameters with BatchNorm, 100 classes, width 512).

    Example::

        model = vgg16(num_classes=100)                        # the GraVAC CIFAR-100 model
        big = vgg16(num_classes=100, classifier_width=4096)   # ~34M params, big dense layers
    """
    return VGG(VGG16_CFG, num_classes, batch_norm, classifier_width, dropout, in_channels)


def vgg16_paper(num_classes: int = 1000, in_channels: int = 3, dropout: float = 0.5) -> VGG:
    """The GraVAC paper's VGG-16: torchvision's ``vgg16_bn()`` layout (13 convolutions with
    BatchNorm, 7x7 adaptive pool, 4096-4096 classifier; 1000 classes by default: 138,365,992
    parameters, ~528 MiB in fp32).

    Example::

        vgg16_paper()(torch.randn(2, 3, 32, 32)).shape        # [2, 1000]
    """
    return VGG(VGG16_CFG, num_classes, True, 4096, dropout, in_channels, layout="imagenet")
