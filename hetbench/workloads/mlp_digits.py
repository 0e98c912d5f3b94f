"""A small MLP on scikit-learn's handwritten digits: real data that ships with a package."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import torch
from torch import nn

from hetbench.core.options import opt
from hetbench.core.workload import Workload, WorkloadOptions
from hetbench.workloads.data import classification_eval, sharded_batches


@dataclass(frozen=True, kw_only=True)
class MLPDigitsOptions(WorkloadOptions):
    lr: float = opt(0.1, "SGD learning rate")
    hidden: int = opt(64, "hidden units")
    test_fraction: float = opt(0.2, "held-out share of the 1797 digits")


class MLPDigits(Workload):
    name = "mlp-digits"
    description = "2-layer MLP on scikit-learn digits (8x8, 10 classes; real data, in-package)"
    Config = MLPDigitsOptions

    @cached_property
    def _split(self):
        x, y = load_digits()
        # Stratified and fixed (not the run's seed), so every run is scored on the same test set.
        rng = np.random.default_rng(0)
        fraction = self.config.test_fraction
        test = np.concatenate([
            rng.permutation(np.flatnonzero(y == c))[: round(fraction * (y == c).sum())]
            for c in range(10)])
        train = np.setdiff1d(np.arange(len(y)), test)
        t = torch.tensor
        return (t(x[train]), t(y[train]), t(x[test]), t(y[test]))

    def build_model(self):
        return nn.Sequential(nn.Linear(64, self.config.hidden), nn.ReLU(),
                             nn.Linear(self.config.hidden, 10))

    def train_batches(self, worker, workers):
        x, y, _, _ = self._split
        return sharded_batches(x, y, worker, workers, self.config.batch_size, self.seed)

    def evaluate(self, model):
        _, _, x, y = self._split
        return classification_eval(model, x, y)


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits (1797 x 64, scaled to [0, 1]) read straight from its data file.

    Importing sklearn.datasets costs seconds per worker on a small machine; the file is the same
    one `sklearn.datasets.load_digits` reads.
    """
    spec = find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("mlp-digits needs scikit-learn installed (it ships the digits data)")
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
    data = np.loadtxt(path, delimiter=",", dtype=np.float32)
    return data[:, :-1] / 16.0, data[:, -1].astype(np.int64)
