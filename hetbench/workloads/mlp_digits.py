"""A small MLP on scikit-learn's handwritten digits: real data that ships with a package."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from torch import nn

from hetbench.core.options import opt
from hetbench.core.workload import Workload, WorkloadOptions
from hetbench.workloads.data import classification_eval, digits_split, sharded_batches


@dataclass(frozen=True, kw_only=True)
class MLPDigitsOptions(WorkloadOptions):
    lr: float = opt(0.1, "SGD learning rate")
    hidden: int = opt(64, "hidden units")
    test_fraction: float = opt(0.2, "held-out share of the 1797 digits")


class MLPDigits(Workload):
    name = "mlp-digits"
    description = "2-layer MLP on scikit-learn digits (8x8, 10 classes; real data, in-package)"
    Config = MLPDigitsOptions

    @classmethod
    def real_data(cls, config):
        return "scikit-learn digits"

    @cached_property
    def _split(self):
        return digits_split(self.config.test_fraction)

    def build_model(self):
        return nn.Sequential(nn.Linear(64, self.config.hidden), nn.ReLU(),
                             nn.Linear(self.config.hidden, 10))

    def train_batches(self, worker, workers):
        x, y, _, _ = self._split
        return sharded_batches(x, y, worker, workers, self.config.batch_size, self.seed)

    def evaluate(self, model):
        _, _, x, y = self._split
        return classification_eval(model, x, y)
