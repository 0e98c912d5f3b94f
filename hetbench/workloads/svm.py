"""Linear SVM with hinge loss: synthetic separable-ish data from the seed, or a LIBSVM file."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
from torch import nn

from hetbench.core.options import opt
from hetbench.core.workload import Workload, WorkloadOptions
from hetbench.errors import UserError
from hetbench.workloads.data import sharded_batches


@dataclass(frozen=True, kw_only=True)
class SVMOptions(WorkloadOptions):
    lr: float = opt(0.05, "SGD learning rate")
    data_file: str = opt("", "LIBSVM-format training file; empty = synthetic data from the seed")
    test_file: str = opt("", "LIBSVM-format test file; empty = hold out test_fraction of data_file")
    features: int = opt(100, "feature count of the synthetic data")
    samples: int = opt(8000, "sample count of the synthetic data")
    noise: float = opt(0.1, "label noise of the synthetic data (flip probability)")
    l2: float = opt(1e-4, "L2 regularisation of the hinge loss")
    test_fraction: float = opt(0.2, "held-out share")


class LinearSVM(Workload):
    name = "svm"
    description = "linear SVM, hinge loss; synthetic data from the seed, or a LIBSVM data_file"
    Config = SVMOptions

    @classmethod
    def validate(cls, config):
        for key in ("data_file", "test_file"):
            path = getattr(config, key)
            if path and not Path(path).is_file():
                raise UserError(f"workload svm: {key} {path} does not exist or is not a file")

    @classmethod
    def is_synthetic(cls, config):
        return not config.data_file

    @classmethod
    def real_data(cls, config):
        return f"LIBSVM {config.data_file}"

    @cached_property
    def _data(self):
        c = self.config
        if c.data_file:
            x, y = _load_libsvm(c.data_file)
            if c.test_file:
                x_te, y_te = _load_libsvm(c.test_file, n_features=x.shape[1])
            else:
                x, y, x_te, y_te = _hold_out(x, y, c.test_fraction)
        else:
            # The problem is a function of the run's seed so repeated seeds repeat the data.
            rng = np.random.default_rng([self.seed, 1009])
            w_true = rng.normal(size=c.features)
            x = rng.normal(size=(c.samples, c.features)).astype(np.float32)
            y = np.sign(x @ w_true + 1e-9)
            y[rng.random(c.samples) < c.noise] *= -1
            x, y, x_te, y_te = _hold_out(x, y, c.test_fraction)
        t = torch.tensor
        return (t(x, dtype=torch.float32), t(y, dtype=torch.float32),
                t(x_te, dtype=torch.float32), t(y_te, dtype=torch.float32))

    def build_model(self):
        return nn.Linear(self._data[0].shape[1], 1)

    def train_batches(self, worker, workers):
        x, y, _, _ = self._data
        return sharded_batches(x, y, worker, workers, self.config.batch_size, self.seed)

    def loss(self, model, batch):
        x, y = batch
        margin = y * model(x).squeeze(1)
        hinge = torch.clamp(1 - margin, min=0).mean()
        return hinge + 0.5 * self.config.l2 * model.weight.pow(2).sum()

    @torch.no_grad()
    def evaluate(self, model):
        _, _, x, y = self._data
        score = model(x).squeeze(1)
        loss = torch.clamp(1 - y * score, min=0).mean().item()
        accuracy = ((score >= 0).float() * 2 - 1 == y).float().mean().item()
        return {"test_loss": loss, "test_accuracy": accuracy}


def _load_libsvm(path: str, n_features: int | None = None):
    from sklearn.datasets import load_svmlight_file

    try:
        x, y = load_svmlight_file(path, n_features=n_features)
    except ValueError as exc:
        raise UserError(f"workload svm: {path} is not a LIBSVM file: {exc}") from None
    labels = np.unique(y)
    if len(labels) != 2:
        raise UserError(f"workload svm: {path} has {len(labels)} classes; a binary SVM needs 2")
    return x.toarray().astype(np.float32), np.where(y == labels.max(), 1.0, -1.0)


def _hold_out(x, y, fraction):
    n_test = max(1, int(len(x) * fraction))
    order = np.random.default_rng(0).permutation(len(x))
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]
