"""Measured per-iteration compute of the papers' models on a named GPU: `compute_preset = "h200"`
in a workload's options sets an emulated run's compute_ms from here.

Each figure is benchmarks/gpu_compute.py's median: forward + backward + SGD step (momentum,
weight decay), fp32 with PyTorch's default TF32 for convolutions, batch norm in training mode,
random inputs of the paper's data shape. The input is the paper's, not the workload's: the
Prague paper trains the ResNets on ImageNet (224x224, 1000 classes) and VGG-16 on CIFAR-10, so
an emulated resnet18 run costs ImageNet compute while its messages are the workload's model
(10 classes: 11.18M parameters against 11.69M). Rows at 32 images are partly bound by the host's
kernel launches, so they move more between sittings than the larger batches' rows;
docs/results/benchmarks-history.md ("Compute on a GPU") has the sittings and their spread.
"""

from __future__ import annotations

from typing import Any

from hetbench.errors import UserError

#: name -> where it was measured, which input each workload's figures are of, the options the
#: workload must have for them to apply, and {(workload, batch_size): median ms}.
PRESETS: dict[str, dict[str, Any]] = {
    "h200": {
        "gpu": "NVIDIA H200 (141 GB), driver 580.159.04, CUDA 13.0, torch 2.11.0+cu130",
        "measured": "2026-11-26, benchmarks/gpu_check.py (its compute step)",
        "inputs": {"resnet18": "ImageNet 224x224", "resnet50": "ImageNet 224x224",
                   "resnet200": "ImageNet 224x224", "vgg16": "CIFAR-10 32x32",
                   "transformer": "256 tokens"},
        "requires": {"vgg16": {"variant": "torchvision", "width": 1.0},
                     "transformer": {"size": "paper"}},
        "ms": {
            ("resnet18", 32): 7.86, ("resnet18", 64): 13.70, ("resnet18", 128): 25.11,
            ("resnet50", 32): 18.15, ("resnet50", 64): 32.55, ("resnet50", 128): 60.79,
            ("resnet200", 32): 52.85, ("resnet200", 64): 93.57, ("resnet200", 128): 173.56,
            ("vgg16", 128): 8.12,
            ("transformer", 16): 43.16, ("transformer", 32): 80.14,
        },
    },
}


def preset_compute_ms(preset: str, workload: str, options: Any) -> float:
    """The compute_ms `preset` gives `workload` at the options' batch size; UserError with what
    the table has when it has no such figure."""
    table = PRESETS.get(preset)
    if table is None:
        raise UserError(f"compute_preset {preset!r} is unknown; known: {', '.join(PRESETS)}")
    batch = options.batch_size
    if (workload, batch) not in table["ms"]:
        batches = sorted(b for w, b in table["ms"] if w == workload)
        have = (f"batch_size {', '.join(map(str, batches))}" if batches
                else f"workloads {', '.join(sorted({w for w, _ in table['ms']}))}")
        raise UserError(f"compute_preset {preset!r} has no figure for {workload} at batch_size "
                        f"{batch}; it has {have}")
    for key, wanted in table["requires"].get(workload, {}).items():
        if getattr(options, key) != wanted:
            raise UserError(f"compute_preset {preset!r} measured {workload} with {key} = "
                            f"{wanted!r}, not {getattr(options, key)!r}")
    return table["ms"][(workload, batch)]
