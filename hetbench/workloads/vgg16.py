"""VGG-16 on CIFAR-10: a large, communication-heavy model, and a narrow form of it for
convergence runs with real compute on a CPU.

- `variant = "torchvision"`: torchvision's VGG-16 (configuration D, three 4096-unit
  classifier layers): 134M parameters, the message size of the papers' VGG-16.
- `variant = "cifar-bn"`: VGG-16 as CIFAR-10 training code writes it: the same 13 conv layers,
  each followed by batch norm, and one linear classifier on the last pool's channels (14.7M
  parameters). Plain VGG-16 narrowed for a CPU did not train reliably here (stuck at chance for
  some widths and learning rates); with batch norm it does (evaluation averages the running
  statistics with the parameters, see harness.evaluation.evaluate).

`width` scales every layer's channels (and the torchvision classifier's units): cifar-bn at
width 1/8 has 0.23M parameters and a batch of 32 takes about 17 ms on one core.
"""

from dataclasses import dataclass
from typing import Literal

from torch import nn

from hetbench.core.options import opt
from hetbench.workloads.cifar import CifarOptions, CifarWorkload


@dataclass(frozen=True, kw_only=True)
class VGG16Options(CifarOptions):
    variant: Literal["torchvision", "cifar-bn"] = opt(
        "torchvision", "torchvision (ImageNet classifier, 134M params) or cifar-bn (batch norm, "
                       "one linear classifier, 14.7M)", added_later=True)
    width: float = opt(1.0, "every layer's width times this (0.125 for real compute on a CPU)",
                       added_later=True)

    def __post_init__(self):
        super().__post_init__()
        if not 0 < self.width <= 1:
            raise ValueError(f"width must be in (0, 1], got {self.width}")


def vgg16(variant: str, width: float, num_classes: int) -> nn.Module:
    """VGG-16 (configuration D) in `variant`, each layer's width scaled by `width`."""
    # Here, not at the top: importing torchvision costs about a second (see resnet.py).
    from torchvision import models
    from torchvision.models.vgg import VGG, cfgs, make_layers

    if variant == "torchvision" and width == 1:
        return models.vgg16(num_classes=num_classes)
    layout = [v if v == "M" else max(1, round(v * width)) for v in cfgs["D"]]
    model = VGG(make_layers(layout, batch_norm=variant == "cifar-bn"), num_classes=num_classes)
    channels = layout[-2]
    if variant == "cifar-bn":
        # 32x32 inputs are 1x1 after the five pools: no pooling to 7x7, one linear layer.
        model.avgpool = nn.Identity()
        model.classifier = nn.Linear(channels, num_classes)
        head = [model.classifier]
    else:
        hidden = max(1, round(4096 * width))
        model.classifier = nn.Sequential(
            nn.Linear(channels * 7 * 7, hidden), nn.ReLU(True), nn.Dropout(),
            nn.Linear(hidden, hidden), nn.ReLU(True), nn.Dropout(),
            nn.Linear(hidden, num_classes))
        head = [m for m in model.classifier if isinstance(m, nn.Linear)]
    for layer in head:  # VGG's own initialisation of its classifier
        nn.init.normal_(layer.weight, 0, 0.01)
        nn.init.zeros_(layer.bias)
    return model


class VGG16(CifarWorkload):
    name = "vgg16"
    description = ("VGG-16 (torchvision's, 134M params, or the CIFAR form with batch norm; "
                   "`width` narrows it) on CIFAR-10 from data_dir, the digits, or synthetic")
    Config = VGG16Options

    def build_model(self):
        return vgg16(self.config.variant, self.config.width, num_classes=10)
