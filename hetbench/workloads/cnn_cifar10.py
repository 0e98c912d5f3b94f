"""A small CNN on CIFAR-10 (the kind of model the Hop paper's CNN experiments use)."""

from torch import nn

from hetbench.workloads.cifar import CifarWorkload


class CNNCifar10(CifarWorkload):
    name = "cnn-cifar10"
    description = "small CNN (2 conv + 2 fc) on CIFAR-10 from data_dir, or synthetic = true"

    def build_model(self):
        return nn.Sequential(
            nn.Conv2d(3, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * 8 * 8, 256), nn.ReLU(), nn.Linear(256, 10),
        )
