"""CIFAR-10 data shared by the image workloads: torchvision's format from a local directory,
scikit-learn's digits as 32x32 colour images (`dataset = "digits"`: real images that ship
offline, small enough for convergence runs with real compute on a CPU), or seeded synthetic
images when (and only when) the config says `synthetic = true`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from hetbench.core.options import opt
from hetbench.core.workload import Workload, WorkloadOptions
from hetbench.errors import UserError
from hetbench.workloads.data import classification_eval, digits_split, sharded_batches

DEFAULT_DATA_DIR = os.environ.get("HETBENCH_CIFAR10", "data/cifar10")
MEAN = torch.tensor([0.4914, 0.4822, 0.4465]).view(1, 3, 1, 1)
STD = torch.tensor([0.2470, 0.2435, 0.2616]).view(1, 3, 1, 1)


@dataclass(frozen=True, kw_only=True)
class CifarOptions(WorkloadOptions):
    dataset: Literal["cifar10", "digits"] = opt(
        "cifar10", "cifar10 (from data_dir), or digits: scikit-learn's 1797 8x8 handwritten "
        "digits upscaled to 32x32x3 (real images, shipped offline; 20% held out)",
        added_later=True)
    data_dir: str = opt(DEFAULT_DATA_DIR, "directory holding torchvision's cifar-10-batches-py")
    synthetic: bool = opt(False, "use seeded random images instead of CIFAR-10 (throughput only)")
    synthetic_samples: int = opt(2048, "training images generated when synthetic = true")
    test_samples: int = opt(2000, "test images scored at each evaluation (first N of the test set)")


class CifarWorkload(Workload):
    """Base of the CIFAR-10 image classifiers; subclasses only build the model."""

    Config = CifarOptions

    @classmethod
    def validate(cls, config):
        if config.synthetic and config.dataset != "cifar10":
            raise UserError(f"workload {cls.name}: synthetic = true and dataset = "
                            f"{config.dataset!r} contradict each other; set one")
        if config.synthetic or config.compute == "emulated" or config.dataset == "digits":
            return
        batches = Path(config.data_dir) / "cifar-10-batches-py"
        if not batches.is_dir():
            raise UserError(
                f"workload {cls.name}: no CIFAR-10 at {batches}; put torchvision's "
                "cifar-10-batches-py there and set data_dir, or set synthetic = true"
            )

    @classmethod
    def is_synthetic(cls, config):
        return config.synthetic

    @classmethod
    def real_data(cls, config):
        if config.dataset == "digits":
            return "scikit-learn digits, upscaled to 32x32x3"
        return f"CIFAR-10 ({config.data_dir})"

    @cached_property
    def _data(self):
        c = self.config
        if c.synthetic:
            g = torch.Generator().manual_seed(self.seed * 7907 + 3)
            x = torch.randn(c.synthetic_samples + c.test_samples, 3, 32, 32, generator=g)
            y = torch.randint(0, 10, (len(x),), generator=g)
            n = c.synthetic_samples
            return x[:n], y[:n], x[n:], y[n:]
        if c.dataset == "digits":
            return _digits_as_images(c.test_samples)
        from torchvision.datasets import CIFAR10

        def load(train: bool):
            ds = CIFAR10(c.data_dir, train=train, download=False)
            x = torch.tensor(ds.data).permute(0, 3, 1, 2).float().div_(255)
            return (x - MEAN) / STD, torch.tensor(ds.targets)

        x, y = load(True)
        x_te, y_te = load(False)
        return x, y, x_te[: c.test_samples], y_te[: c.test_samples]

    def train_batches(self, worker, workers):
        x, y, _, _ = self._data
        return sharded_batches(x, y, worker, workers, self.config.batch_size, self.seed)

    def evaluate(self, model):
        _, _, x, y = self._data
        return classification_eval(model, x, y, batch_size=256)


def _digits_as_images(test_samples: int) -> tuple[torch.Tensor, ...]:
    """The digits' stratified 80/20 split as normalised 32x32 3-channel images (bilinear
    upscaling of the 8x8 grey images, the grey copied to each channel), so the CIFAR models run
    on them unchanged."""
    x, y, x_te, y_te = digits_split(0.2)

    def images(flat: torch.Tensor) -> torch.Tensor:
        big = nn.functional.interpolate(flat.view(-1, 1, 8, 8), size=32, mode="bilinear",
                                        align_corners=False)
        return big.expand(-1, 3, -1, -1).contiguous()

    train, test = images(x), images(x_te)
    mean, std = train.mean(), train.std()
    return ((train - mean) / std, y, ((test - mean) / std)[:test_samples], y_te[:test_samples])
