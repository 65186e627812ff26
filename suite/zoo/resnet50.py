"""ResNet-50 (He et al., CVPR 2016), the torchvision v1.5 layout (stride in the 3x3 convolution), in plain
PyTorch (no torchvision): 224x224x3 inputs, 1000 classes. Workload of Post (Gao et al., NeurIPS 2018) and
HSDAG (Duan et al., NeurIPS 2024).

Published figures (torchvision model card): 25,557,032 parameters, 4.09 G multiply-adds per 224x224
image. Scopes: "stem" (conv1, bn1, relu, maxpool), "layer{1..4}.{block}", "head" (pool, fc, loss).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from suite.zoo.layers import ClassifierHead

LAYERS = (3, 4, 6, 3)


class Bottleneck(nn.Module):
    def __init__(self, in_ch: int, width: int, stride: int) -> None:
        super().__init__()
        out_ch = width * 4
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.relu2 = nn.ReLU()
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.relu3 = nn.ReLU()
        self.downsample = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.relu2(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu3(out + identity)


class Stem(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.maxpool(self.relu(self.bn1(self.conv1(x))))


class ResNet50(nn.Module):
    def __init__(self, num_classes: int, with_loss: bool) -> None:
        super().__init__()
        self.stem = Stem()
        in_ch = 64
        for i, (blocks, width) in enumerate(zip(LAYERS, (64, 128, 256, 512), strict=True)):
            layer = []
            for b in range(blocks):
                layer.append(Bottleneck(in_ch, width, stride=2 if (b == 0 and i > 0) else 1))
                in_ch = width * 4
            setattr(self, f"layer{i + 1}", nn.Sequential(*layer))
        self.head = ClassifierHead(in_ch, num_classes, with_loss)

    def forward(self, images: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        x = self.stem(images)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.head(x, labels)


def model_and_inputs(*, batch_size: int, image_size: int = 224, num_classes: int = 1000, with_loss: bool) -> tuple[nn.Module, tuple]:
    model = ResNet50(num_classes, with_loss)
    images = torch.zeros(batch_size, 3, image_size, image_size)
    if not with_loss:
        return model, (images,)
    return model, (images, torch.zeros(batch_size, dtype=torch.long))

