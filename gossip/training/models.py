"""Standard ``nn.Module`` models for the experiments: an MLP, a small CNN and ResNet-20.

Nothing here knows about gossip: any ``nn.Module`` trains the same way. These three cover the
usual scales — the MLP for flat features (digits, synthetic), the CNN for small images, and
ResNet-20 (He et al. 2016, the CIFAR variant used by CHOCO-SGD and PowerGossip) for 3×32×32.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from gossip.catalog import MODELS, NORMS
from gossip.errors import ConfigError


def norm2d(kind: str, channels: int) -> nn.Module:
    """BatchNorm (``batch``), GroupNorm with up to 8 groups (``group``) or nothing (``none``).

    GroupNorm keeps no running statistics, which suits decentralized training on skewed data.
    """
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    if kind == "group":
        return nn.GroupNorm(math.gcd(8, channels), channels)
    if kind == "none":
        return nn.Identity()
    raise ConfigError(f"unknown norm {kind!r}; choose one of {NORMS}")


class MLP(nn.Sequential):
    """Flatten, then ``Linear → ReLU`` per hidden width, then a ``Linear`` to the classes."""

    def __init__(self, in_features: int, num_classes: int, hidden: Sequence[int] = (128,)):
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, num_classes))
        super().__init__(*layers)


class SmallCNN(nn.Module):
    """Two ``conv3×3 → norm → ReLU → max-pool 2`` stages (``width``, ``2·width`` channels),
    then ``Linear(·, 128) → ReLU → Linear(128, classes)``. Inputs ``C×H×W`` with H, W ≥ 4."""

    def __init__(self, in_channels: int, num_classes: int, image_size: tuple[int, int],
                 width: int = 32, norm: str = "none"):
        super().__init__()
        h, w = image_size
        if h < 4 or w < 4:
            raise ConfigError(f"SmallCNN needs images of at least 4×4, got {h}×{w}")
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1), norm2d(norm, width), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), norm2d(norm, 2 * width), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(2 * width * (h // 4) * (w // 4), 128), nn.ReLU(),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class BasicBlock(nn.Module):
    """Two 3×3 convolutions with a residual connection (option A: a parameter-free shortcut
    that subsamples and zero-pads channels when the shape changes, as in the CIFAR ResNets)."""

    def __init__(self, in_planes: int, planes: int, stride: int, norm: str):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = norm2d(norm, planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = norm2d(norm, planes)
        self.stride = stride
        self.pad = planes - in_planes

    def shortcut(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1 and self.pad == 0:
            return x
        x = x[:, :, :: self.stride, :: self.stride]
        return F.pad(x, (0, 0, 0, 0, self.pad // 2, self.pad - self.pad // 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """CIFAR ResNet of depth ``6k + 2``: a 3×3 stem, three stages of ``k`` basic blocks
    (``width``, ``2·width``, ``4·width`` channels; stride 2 between stages), global average
    pooling and a linear classifier. Depth 20 has about 0.27 M parameters."""

    def __init__(self, depth: int = 20, num_classes: int = 10, in_channels: int = 3,
                 width: int = 16, norm: str = "batch"):
        super().__init__()
        if depth < 8 or (depth - 2) % 6:
            raise ConfigError(f"a CIFAR ResNet has depth 6k + 2 (20, 32, 44, 56…), got {depth}")
        k = (depth - 2) // 6
        self.conv = nn.Conv2d(in_channels, width, 3, padding=1, bias=False)
        self.bn = norm2d(norm, width)
        blocks: list[nn.Module] = []
        planes = width
        for stage, out in enumerate((width, 2 * width, 4 * width)):
            for b in range(k):
                stride = 2 if stage > 0 and b == 0 else 1
                blocks.append(BasicBlock(planes, out, stride, norm))
                planes = out
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(planes, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn(self.conv(x)))
        out = self.blocks(out)
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.fc(out)


def resnet20(num_classes: int = 10, in_channels: int = 3, norm: str = "batch") -> ResNet:
    """ResNet-20 for 3×32×32 images (CIFAR-10 shape)."""
    return ResNet(20, num_classes, in_channels, norm=norm)


def make_model(
    name: str,
    input_shape: Sequence[int],
    num_classes: int,
    *,
    hidden: Sequence[int] = (128,),
    width: int | None = None,
    norm: str | None = None,
) -> nn.Module:
    """A model by name for inputs of ``input_shape`` (one sample, without the batch).

    ``mlp`` flattens any input; ``cnn`` and ``resnet20`` need ``C×H×W`` images (a flat input of
    a square number of features is read as a one-channel square image).
    """
    shape = tuple(int(s) for s in input_shape)
    if name == "mlp":
        return MLP(math.prod(shape), num_classes, hidden)
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    unflatten = None
    if len(shape) == 1 and math.isqrt(shape[0]) ** 2 == shape[0]:
        side = math.isqrt(shape[0])
        shape = (1, side, side)
        unflatten = nn.Unflatten(1, shape)
    if len(shape) != 3:
        raise ConfigError(f"{name} needs C×H×W image inputs, got samples of shape {shape}")
    if name == "cnn":
        model: nn.Module = SmallCNN(shape[0], num_classes, (shape[1], shape[2]),
                                    width=width or 32, norm=norm or "none")
    else:
        model = ResNet(20, num_classes, shape[0], width=width or 16, norm=norm or "batch")
    return model if unflatten is None else nn.Sequential(unflatten, model)
