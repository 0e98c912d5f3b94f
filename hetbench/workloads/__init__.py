"""Workload registry: model + dataset + loss + evaluation. Built-ins are imported on first use."""

from hetbench.harness.registry import Registry

WORKLOADS: Registry = Registry("workload", "hetbench.workloads", {
    "svm": "hetbench.workloads.svm:LinearSVM",
    "mlp-digits": "hetbench.workloads.mlp_digits:MLPDigits",
    "cnn-cifar10": "hetbench.workloads.cnn_cifar10:CNNCifar10",
    "resnet18": "hetbench.workloads.resnet:ResNet18",
    "resnet50": "hetbench.workloads.resnet:ResNet50",
    "vgg16": "hetbench.workloads.vgg16:VGG16",
})
