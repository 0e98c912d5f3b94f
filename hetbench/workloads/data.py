"""Sharding and batching shared by the workloads."""

from __future__ import annotations

from collections.abc import Iterator

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
