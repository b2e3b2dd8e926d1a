"""The PyTorch twins of dprun's plugin models, for the benchmarks that run both side by side.

  lenet()     plugins/lenet/lenet.cpp: conv3x3-20, ReLU, avg-pool 2, conv5x5-50, ReLU, avg-pool 2,
              linear 800-128, ReLU, linear 10; weights N(0, 0.01^2), biases 0.
  resnet18(channels=1)  plugins/resnet18/resnet18.cpp, d2l's small-image ResNet-18: conv3x3-64,
              BN, ReLU, four stages of two residual blocks (64..512 channels), global average
              pool, linear 10; `channels` input planes (1 for Fashion-MNIST, 3 for CIFAR-10).
  load_fashion_mnist(folder, split, count)  the IDX files as uint8 images (N, 1, 28, 28) and
              int64 labels, as numpy arrays.
"""
import gzip

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


def lenet():
    net = nn.Sequential(nn.Conv2d(1, 20, 3), nn.ReLU(), nn.AvgPool2d(2),
                        nn.Conv2d(20, 50, 5), nn.ReLU(), nn.AvgPool2d(2), nn.Flatten(),
                        nn.Linear(800, 128), nn.ReLU(), nn.Linear(128, 10))
    for m in net:
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.normal_(m.weight, 0, 0.01)
            nn.init.zeros_(m.bias)
    return net


class Residual(nn.Module):  # d2l's
    def __init__(self, i, o, use_1x1conv=False, strides=1):
        super().__init__()
        self.conv1 = nn.Conv2d(i, o, 3, padding=1, stride=strides)
        self.conv2 = nn.Conv2d(o, o, 3, padding=1)
        self.conv3 = nn.Conv2d(i, o, 1, stride=strides) if use_1x1conv else None
        self.bn1, self.bn2 = nn.BatchNorm2d(o), nn.BatchNorm2d(o)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        if self.conv3:
            x = self.conv3(x)
        return F.relu(y + x)


def _stage(i, o, n, first=False):
    return nn.Sequential(*[Residual(i, o, True, 2) if k == 0 and not first else Residual(o, o)
                           for k in range(n)])


def resnet18(channels=1):
    return nn.Sequential(nn.Conv2d(channels, 64, 3, 1, 1), nn.BatchNorm2d(64), nn.ReLU(),
                         _stage(64, 64, 2, True), _stage(64, 128, 2), _stage(128, 256, 2),
                         _stage(256, 512, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(512, 10))


MODELS = {"lenet": lenet, "resnet18": resnet18}


def load_fashion_mnist(folder, split="train", count=None):
    prefix = "train" if split == "train" else "t10k"
    images = np.frombuffer(gzip.open(f"{folder}/{prefix}-images-idx3-ubyte.gz").read(),
                           np.uint8, offset=16).reshape(-1, 1, 28, 28)
    labels = np.frombuffer(gzip.open(f"{folder}/{prefix}-labels-idx1-ubyte.gz").read(),
                           np.uint8, offset=8)
    if count is not None:
        images, labels = images[:count], labels[:count]
    return images, labels.astype(np.int64)
