"""Helpers shared by the model files: argument checks and the standard initialisation."""
from __future__ import annotations

from torch import nn


def check_positive(**values: int) -> None:
    for name, value in values.items():
        if int(value) < 1:
            raise ValueError(f"{name} must be a positive integer, got {value}")


def init_conv_bn(model: nn.Module) -> None:
    # He initialisation for ReLU networks, BN as identity: the torchvision defaults.
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
