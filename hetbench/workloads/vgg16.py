"""torchvision VGG-16 on CIFAR-10: a large, communication-heavy model."""

from torchvision import models

from hetbench.workloads.cifar import CifarWorkload


class VGG16(CifarWorkload):
    name = "vgg16"
    description = "torchvision VGG-16 (134M params) on CIFAR-10 from data_dir, or synthetic"

    def build_model(self):
        return models.vgg16(num_classes=10)
