"""Sharding and batching shared by the workloads."""

from __future__ import annotations

from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import torch
from torch import nn


def shard_indices(n: int, worker: int, workers: int, seed: int) -> np.ndarray:
    """This worker's disjoint share of a seeded permutation of range(n)."""
    order = np.random.default_rng([seed, 7919]).permutation(n)
    return order[worker::workers]


def sharded_batches(x: torch.Tensor, y: torch.Tensor, worker: int, workers: int, batch_size: int,
                    seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless batches from this worker's shard, reshuffled each epoch (seeded per worker)."""
    shard = shard_indices(len(x), worker, workers, seed)
    if len(shard) < batch_size:
        raise ValueError(f"worker {worker}'s shard has {len(shard)} samples < batch {batch_size}")
    epoch = 0
    while True:
        order = np.random.default_rng([seed, worker, epoch]).permutation(shard)
        for start in range(0, len(order) - batch_size + 1, batch_size):
            idx = torch.from_numpy(order[start:start + batch_size])
            yield x[idx], y[idx]
        epoch += 1


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
