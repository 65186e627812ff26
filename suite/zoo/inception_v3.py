"""Inception-V3 (Szegedy et al., CVPR 2016), the torchvision layout, in plain PyTorch (no torchvision):
299x299x3 inputs, 1000 classes, no auxiliary classifier. Workload of Mirhoseini et al. (ICML 2017, batch
32), Placeto (Addanki et al., NeurIPS 2019) and HSDAG (Duan et al., NeurIPS 2024).

Every convolution is BasicConv2d = conv (no bias) + batch norm (eps 0.001) + ReLU, three ops. Published
figures: 5.71 G multiply-adds per 299x299 image (torchvision model card, "GFLOPS" 5.71, counted without
the auxiliary classifier, which only runs in training), 23.8 M parameters without the auxiliary
classifier (Keras Applications table: 23.9 M; torchvision's 27.2 M includes the auxiliary classifier).
Scopes: "stem", "mixed_5b" ... "mixed_7c", "head".
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from suite.zoo.layers import ClassifierHead

MIXED = ("mixed_5b", "mixed_5c", "mixed_5d", "mixed_6a", "mixed_6b", "mixed_6c", "mixed_6d", "mixed_6e",
         "mixed_7a", "mixed_7b", "mixed_7c")


class BasicConv2d(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, kernel_size, stride=1, padding=0) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_ch, out_ch, kernel_size, stride=stride, padding=padding, bias=False)
        self.bn = nn.BatchNorm2d(out_ch, eps=0.001)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn(self.conv(x)))


class InceptionA(nn.Module):
    def __init__(self, in_ch: int, pool_features: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(in_ch, 64, 1)
        self.branch5x5_1 = BasicConv2d(in_ch, 48, 1)
        self.branch5x5_2 = BasicConv2d(48, 64, 5, padding=2)
        self.branch3x3dbl_1 = BasicConv2d(in_ch, 64, 1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, 3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, 3, padding=1)
        self.branch_pool = BasicConv2d(in_ch, pool_features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b1 = self.branch1x1(x)
        b5 = self.branch5x5_2(self.branch5x5_1(x))
        b3 = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        bp = self.branch_pool(F.avg_pool2d(x, kernel_size=3, stride=1, padding=1))
        return torch.cat([b1, b5, b3, bp], 1)


class InceptionB(nn.Module):
    def __init__(self, in_ch: int) -> None:
        super().__init__()
        self.branch3x3 = BasicConv2d(in_ch, 384, 3, stride=2)
        self.branch3x3dbl_1 = BasicConv2d(in_ch, 64, 1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, 3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b3 = self.branch3x3(x)
        bd = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        bp = F.max_pool2d(x, kernel_size=3, stride=2)
        return torch.cat([b3, bd, bp], 1)


class InceptionC(nn.Module):
    def __init__(self, in_ch: int, c7: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(in_ch, 192, 1)
        self.branch7x7_1 = BasicConv2d(in_ch, c7, 1)
        self.branch7x7_2 = BasicConv2d(c7, c7, (1, 7), padding=(0, 3))
        self.branch7x7_3 = BasicConv2d(c7, 192, (7, 1), padding=(3, 0))
        self.branch7x7dbl_1 = BasicConv2d(in_ch, c7, 1)
        self.branch7x7dbl_2 = BasicConv2d(c7, c7, (7, 1), padding=(3, 0))
        self.branch7x7dbl_3 = BasicConv2d(c7, c7, (1, 7), padding=(0, 3))
        self.branch7x7dbl_4 = BasicConv2d(c7, c7, (7, 1), padding=(3, 0))
        self.branch7x7dbl_5 = BasicConv2d(c7, 192, (1, 7), padding=(0, 3))
        self.branch_pool = BasicConv2d(in_ch, 192, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b1 = self.branch1x1(x)
        b7 = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
        bd = self.branch7x7dbl_1(x)
        bd = self.branch7x7dbl_5(self.branch7x7dbl_4(self.branch7x7dbl_3(self.branch7x7dbl_2(bd))))
        bp = self.branch_pool(F.avg_pool2d(x, kernel_size=3, stride=1, padding=1))
        return torch.cat([b1, b7, bd, bp], 1)


class InceptionD(nn.Module):
    def __init__(self, in_ch: int) -> None:
        super().__init__()
        self.branch3x3_1 = BasicConv2d(in_ch, 192, 1)
        self.branch3x3_2 = BasicConv2d(192, 320, 3, stride=2)
        self.branch7x7x3_1 = BasicConv2d(in_ch, 192, 1)
        self.branch7x7x3_2 = BasicConv2d(192, 192, (1, 7), padding=(0, 3))
        self.branch7x7x3_3 = BasicConv2d(192, 192, (7, 1), padding=(3, 0))
        self.branch7x7x3_4 = BasicConv2d(192, 192, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b3 = self.branch3x3_2(self.branch3x3_1(x))
        b7 = self.branch7x7x3_4(self.branch7x7x3_3(self.branch7x7x3_2(self.branch7x7x3_1(x))))
        bp = F.max_pool2d(x, kernel_size=3, stride=2)
        return torch.cat([b3, b7, bp], 1)


class InceptionE(nn.Module):
    def __init__(self, in_ch: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(in_ch, 320, 1)
        self.branch3x3_1 = BasicConv2d(in_ch, 384, 1)
        self.branch3x3_2a = BasicConv2d(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3_2b = BasicConv2d(384, 384, (3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = BasicConv2d(in_ch, 448, 1)
        self.branch3x3dbl_2 = BasicConv2d(448, 384, 3, padding=1)
        self.branch3x3dbl_3a = BasicConv2d(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = BasicConv2d(384, 384, (3, 1), padding=(1, 0))
        self.branch_pool = BasicConv2d(in_ch, 192, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b1 = self.branch1x1(x)
        b3 = self.branch3x3_1(x)
        b3 = torch.cat([self.branch3x3_2a(b3), self.branch3x3_2b(b3)], 1)
        bd = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        bd = torch.cat([self.branch3x3dbl_3a(bd), self.branch3x3dbl_3b(bd)], 1)
        bp = self.branch_pool(F.avg_pool2d(x, kernel_size=3, stride=1, padding=1))
        return torch.cat([b1, b3, bd, bp], 1)


class Stem(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv2d_1a_3x3 = BasicConv2d(3, 32, 3, stride=2)
        self.conv2d_2a_3x3 = BasicConv2d(32, 32, 3)
        self.conv2d_2b_3x3 = BasicConv2d(32, 64, 3, padding=1)
        self.maxpool1 = nn.MaxPool2d(3, stride=2)
        self.conv2d_3b_1x1 = BasicConv2d(64, 80, 1)
        self.conv2d_4a_3x3 = BasicConv2d(80, 192, 3)
        self.maxpool2 = nn.MaxPool2d(3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool1(self.conv2d_2b_3x3(self.conv2d_2a_3x3(self.conv2d_1a_3x3(x))))
        return self.maxpool2(self.conv2d_4a_3x3(self.conv2d_3b_1x1(x)))


class InceptionV3(nn.Module):
    def __init__(self, num_classes: int, with_loss: bool) -> None:
        super().__init__()
        self.stem = Stem()
        self.mixed_5b = InceptionA(192, 32)
        self.mixed_5c = InceptionA(256, 64)
        self.mixed_5d = InceptionA(288, 64)
        self.mixed_6a = InceptionB(288)
        self.mixed_6b = InceptionC(768, 128)
        self.mixed_6c = InceptionC(768, 160)
        self.mixed_6d = InceptionC(768, 160)
        self.mixed_6e = InceptionC(768, 192)
        self.mixed_7a = InceptionD(768)
        self.mixed_7b = InceptionE(1280)
        self.mixed_7c = InceptionE(2048)
        self.head = ClassifierHead(2048, num_classes, with_loss)

    def forward(self, images: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        x = self.stem(images)
        for name in MIXED:
            x = getattr(self, name)(x)
        return self.head(x, labels)


def model_and_inputs(*, batch_size: int, image_size: int = 299, num_classes: int = 1000, with_loss: bool) -> tuple[nn.Module, tuple]:
    model = InceptionV3(num_classes, with_loss)
    images = torch.zeros(batch_size, 3, image_size, image_size)
    if not with_loss:
        return model, (images,)
    return model, (images, torch.zeros(batch_size, dtype=torch.long))

