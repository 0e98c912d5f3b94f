"""torchvision ResNets on CIFAR-10: real parameter counts, so real message sizes.

torchvision is imported where a model is built, not with this module: importing it costs about
a second, and `bench sim` reads these workloads' layouts from its cache without a model.
"""

from __future__ import annotations

from hetbench.workloads.cifar import CifarWorkload


class ResNet18(CifarWorkload):
    name = "resnet18"
    description = "torchvision ResNet-18 (11.7M params) on CIFAR-10 from data_dir, or synthetic"

    def build_model(self):
        from torchvision import models

        return models.resnet18(num_classes=10)


class ResNet50(CifarWorkload):
    name = "resnet50"
    description = "torchvision ResNet-50 (23.5M params) on CIFAR-10 from data_dir, or synthetic"

    def build_model(self):
        from torchvision import models

        return models.resnet50(num_classes=10)


#: ResNet-200's bottleneck blocks per stage (He et al., "Identity Mappings in Deep Residual
#: Networks", 2016): 64.7M parameters with ImageNet's 1000 classes.
RESNET200_LAYERS = [3, 24, 36, 3]


def resnet200(num_classes: int):
    from torchvision.models.resnet import Bottleneck, ResNet

    return ResNet(Bottleneck, RESNET200_LAYERS, num_classes=num_classes)


class ResNet200(CifarWorkload):
    name = "resnet200"
    description = ("ResNet-200 (torchvision's ResNet, [3, 24, 36, 3] bottlenecks; 62.6M params "
                   "at 10 classes) on CIFAR-10 from data_dir, or synthetic")

    def build_model(self):
        return resnet200(num_classes=10)
