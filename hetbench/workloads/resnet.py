"""torchvision ResNets on CIFAR-10: real parameter counts, so real message sizes."""

from torchvision import models

from hetbench.workloads.cifar import CifarWorkload


class ResNet18(CifarWorkload):
    name = "resnet18"
    description = "torchvision ResNet-18 (11.7M params) on CIFAR-10 from data_dir, or synthetic"

    def build_model(self):
        return models.resnet18(num_classes=10)


class ResNet50(CifarWorkload):
    name = "resnet50"
    description = "torchvision ResNet-50 (23.5M params) on CIFAR-10 from data_dir, or synthetic"

    def build_model(self):
        return models.resnet50(num_classes=10)
