"""Small CNNs: ``SmallCNN`` for the demo on 8x8 digits, ``WideHeadCNN`` for the
communication-bound benchmark workload (large dense head).

Example::

    model = SmallCNN(num_classes=10, in_channels=1)
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .common import check_positive


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
        check_positive(num_classes=num_classes, in_channels=in_channels)
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
        check_positive(num_classes=num_classes, in_channels=in_channels, width=width)
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
