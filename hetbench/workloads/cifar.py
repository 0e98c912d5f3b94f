"""CIFAR-10 data shared by the image workloads: torchvision's format from a local directory, or
seeded synthetic images when (and only when) the config says `synthetic = true`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch

from hetbench.core.options import opt
from hetbench.core.workload import Workload, WorkloadOptions
from hetbench.errors import UserError
from hetbench.workloads.data import classification_eval, sharded_batches

DEFAULT_DATA_DIR = os.environ.get("HETBENCH_CIFAR10", "data/cifar10")
MEAN = torch.tensor([0.4914, 0.4822, 0.4465]).view(1, 3, 1, 1)
STD = torch.tensor([0.2470, 0.2435, 0.2616]).view(1, 3, 1, 1)


@dataclass(frozen=True, kw_only=True)
class CifarOptions(WorkloadOptions):
    data_dir: str = opt(DEFAULT_DATA_DIR, "directory holding torchvision's cifar-10-batches-py")
    synthetic: bool = opt(False, "use seeded random images instead of CIFAR-10 (throughput only)")
    synthetic_samples: int = opt(2048, "training images generated when synthetic = true")
    test_samples: int = opt(2000, "test images scored at each evaluation (first N of the test set)")


class CifarWorkload(Workload):
    """Base of the CIFAR-10 image classifiers; subclasses only build the model."""

    Config = CifarOptions

    @classmethod
    def validate(cls, config):
        if config.synthetic or config.compute == "emulated":
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

    @cached_property
    def _data(self):
        c = self.config
        if c.synthetic:
            g = torch.Generator().manual_seed(self.seed * 7907 + 3)
            x = torch.randn(c.synthetic_samples + c.test_samples, 3, 32, 32, generator=g)
            y = torch.randint(0, 10, (len(x),), generator=g)
            n = c.synthetic_samples
            return x[:n], y[:n], x[n:], y[n:]
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
