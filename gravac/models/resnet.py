"""ResNets: CIFAR-style (3x3 stem, no max-pool, 32x32 inputs) ResNet-18/50/101, and the
GraVAC paper's ResNet-101 (``resnet101_paper``: torchvision's ``resnet101()`` layout, a 7x7
stride-2 stem and a max-pool, 1000 classes: 44,549,160 parameters, ~170 MiB in fp32, the
size of the paper's Table 1; the authors trained it unchanged on CIFAR-10).

Example::

    model = resnet101(num_classes=10)
    logits = model(torch.randn(2, 3, 32, 32))          # [2, 10]
    paper = resnet101_paper()                          # [2, 1000] on the same input
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .common import check_positive, init_conv_bn


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


#: Stems: "cifar" (3x3 conv, stride 1, no max-pool) or "imagenet" (torchvision's: 7x7 conv,
#: stride 2, then a 3x3 stride-2 max-pool).
STEMS = ("cifar", "imagenet")


class ResNet(nn.Module):
    """ResNet: a stem, four stages, global average pool, a linear classifier.

    Args:
        block: ``BasicBlock`` or ``Bottleneck``.
        num_blocks: blocks per stage, e.g. ``(2, 2, 2, 2)`` for ResNet-18.
        num_classes: output logits.
        in_channels: input image channels.
        stem: ``"cifar"`` (3x3 conv, no max-pool) or ``"imagenet"`` (torchvision's 7x7
            stride-2 conv and max-pool).

    Input ``[batch, in_channels, H, W]`` (32x32 for CIFAR), output ``[batch, num_classes]``.

    Example::

        model = ResNet(BasicBlock, (2, 2, 2, 2), num_classes=10)   # == resnet18()
    """

    def __init__(self, block: type[BasicBlock] | type[Bottleneck], num_blocks: tuple[int, ...],
                 num_classes: int = 10, in_channels: int = 3, stem: str = "cifar"):
        super().__init__()
        check_positive(num_classes=num_classes, in_channels=in_channels)
        if stem not in STEMS:
            raise ValueError(f"resnet: stem must be one of {', '.join(STEMS)}, got {stem!r}")
        if stem == "cifar":
            self.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
            self.pool = nn.Identity()
        else:
            self.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
            self.pool = nn.MaxPool2d(3, stride=2, padding=1)
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
        init_conv_bn(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.pool(F.relu(self.bn1(self.conv1(x))))
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


def resnet101_paper(num_classes: int = 1000, in_channels: int = 3) -> ResNet:
    """The GraVAC paper's ResNet-101: torchvision's ``resnet101()`` layout (7x7 stem and
    max-pool, 1000 classes by default: 44,549,160 parameters, ~170 MiB in fp32).

    Example::

        resnet101_paper()(torch.randn(2, 3, 32, 32)).shape   # [2, 1000]
    """
    return ResNet(Bottleneck, (3, 4, 23, 3), num_classes, in_channels, stem="imagenet")
