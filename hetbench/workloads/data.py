"""Sharding and batching shared by the workloads."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import torch
from torch import nn


def shard_indices(n: int, worker: int, workers: int, seed: int) -> np.ndarray:
    """This worker's disjoint share of a seeded permutation of range(n)."""
    return _permutation(n, seed)[worker::workers]


@functools.lru_cache(maxsize=4)
def _permutation(n: int, seed: int) -> np.ndarray:
    """The seeded permutation every worker's shard is cut from (made once per process: the
    learning simulator cuts 1,024 shards from it, 1 ms each when each made its own)."""
    order = np.random.default_rng([seed, 7919]).permutation(n)
    order.flags.writeable = False
    return order


class ShardedBatches:
    """Endless batches from this worker's shard, reshuffled each epoch (seeded per worker).

    An iterator of (x, y) batches, and of their indices into x and y (next_indices), so that
    a caller drawing many workers' batches at once gathers them in one indexing: the learning
    simulator, where at 1,024 workers indexing a batch at a time was most of the run's time.
    The same batches either way."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, worker: int, workers: int,
                 batch_size: int, seed: int):
        self.x, self.y = x, y
        self._shard = shard_indices(len(x), worker, workers, seed)
        self._worker, self._batch_size, self._seed = worker, batch_size, seed
        self._epoch = 0
        self._order: np.ndarray | None = None
        self._start = 0

    def check(self) -> None:
        """ValueError when the shard holds fewer samples than a batch."""
        if len(self._shard) < self._batch_size:
            raise ValueError(f"worker {self._worker}'s shard has {len(self._shard)} samples "
                             f"< batch {self._batch_size}")

    def next_indices(self) -> np.ndarray:
        """The next batch's indices into x and y."""
        if self._order is None or self._start + self._batch_size > len(self._order):
            self.check()
            self._order = np.random.default_rng(
                [self._seed, self._worker, self._epoch]).permutation(self._shard)
            self._epoch += 1
            self._start = 0
        start, self._start = self._start, self._start + self._batch_size
        return self._order[start:self._start]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.from_numpy(self.next_indices())
        return self.x[idx], self.y[idx]


def sharded_batches(x: torch.Tensor, y: torch.Tensor, worker: int, workers: int, batch_size: int,
                    seed: int) -> ShardedBatches:
    """Endless batches from this worker's shard, reshuffled each epoch (seeded per worker);
    ValueError at the first draw when the shard is smaller than a batch."""
    return ShardedBatches(x, y, worker, workers, batch_size, seed)


@torch.no_grad()
def classification_eval(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                        batch_size: int = 512) -> dict[str, float]:
    """Mean cross-entropy and accuracy of `model` on (x, y)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    loss_sum, correct = 0.0, 0
    for start in range(0, len(x), batch_size):
        xb, yb = x[start:start + batch_size].to(device), y[start:start + batch_size].to(device)
        logits = model(xb)
        loss_sum += nn.functional.cross_entropy(logits, yb, reduction="sum").item()
        correct += (logits.argmax(dim=1) == yb).sum().item()
    model.train(was_training)
    return {"test_loss": loss_sum / len(x), "test_accuracy": correct / len(x)}


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits (1797 x 64, scaled to [0, 1]) read straight from its data file.

    Importing sklearn.datasets costs seconds per worker on a small machine; the file is the same
    one `sklearn.datasets.load_digits` reads.
    """
    spec = find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the digits need scikit-learn installed (it ships the digits data)")
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
    data = np.loadtxt(path, delimiter=",", dtype=np.float32)
    return data[:, :-1] / 16.0, data[:, -1].astype(np.int64)


def digits_split(test_fraction: float) -> tuple[torch.Tensor, ...]:
    """(x_train, y_train, x_test, y_test) of the digits, x as (n, 64) in [0, 1].

    The split is stratified and fixed (not the run's seed), so every run is scored on the same
    test set.
    """
    x, y = load_digits()
    rng = np.random.default_rng(0)
    test = np.concatenate([
        rng.permutation(np.flatnonzero(y == c))[: round(test_fraction * (y == c).sum())]
        for c in range(10)])
    train = np.setdiff1d(np.arange(len(y)), test)
    t = torch.tensor
    return t(x[train]), t(y[train]), t(x[test]), t(y[test])
