"""The Workload interface: what a worker trains, on which shard of which data."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from hetbench.core.options import opt

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True, kw_only=True)
class WorkloadOptions:
    """Options every workload has; each workload subclasses this to change defaults or add own."""

    batch_size: int = opt(32, "samples per worker per iteration")
    lr: float = opt(0.05, "SGD learning rate")
    momentum: float = opt(0.0, "SGD momentum")
    weight_decay: float = opt(0.0, "SGD weight decay")
    compute: Literal["real", "emulated"] = opt(
        "real",
        "real forward/backward, or emulated: a paced wait of compute_ms with fixed synthetic "
        "gradients (throughput only, never convergence)",
    )
    compute_ms: float = opt(100.0, "per-iteration compute time when compute = emulated")
    compute_preset: str = opt(
        "", "compute = emulated: compute_ms measured on a named GPU for this workload and "
            "batch_size (\"h200\"; hetbench/core/compute_presets.py)", added_later=True)

    def __post_init__(self):
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.lr < 0:
            raise ValueError(f"lr must be >= 0, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")
        if self.compute_ms < 0:
            raise ValueError(f"compute_ms must be >= 0, got {self.compute_ms}")


class Workload(ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    Config: ClassVar[type] = WorkloadOptions

    def __init__(self, config: Any, seed: int):
        self.config = config
        self.seed = seed

    @classmethod
    def validate(cls, config: Any) -> None:
        """Raise UserError before any process starts (a missing data directory, say)."""

    @classmethod
    def is_synthetic(cls, config: Any) -> bool:
        """True when the data is generated, not real: every result says so."""
        return False

    @classmethod
    def data_source(cls, config: Any) -> str:
        """Which data a run trains on, as summary.json and reports name it."""
        if config.compute == "emulated":
            return "none (emulated compute)"
        return "synthetic" if cls.is_synthetic(config) else cls.real_data(config)

    @classmethod
    def real_data(cls, config: Any) -> str:
        """The real data set's name (and where it was read from)."""
        return "real"

    @abstractmethod
    def build_model(self) -> nn.Module:
        """A fresh model; the harness seeds torch first so every worker builds the same one."""

    @abstractmethod
    def train_batches(self, worker: int, workers: int) -> Iterator[Batch]:
        """An endless iterator over this worker's shard, reshuffled every epoch, seeded."""

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(model(x), y)

    @abstractmethod
    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """{'test_loss': ..., 'test_accuracy': ...} on the held-out set."""

    def make_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        c = self.config
        return torch.optim.SGD(model.parameters(), lr=c.lr, momentum=c.momentum,
                               weight_decay=c.weight_decay)
