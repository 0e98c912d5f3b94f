"""Convergence targets ("accuracy:0.85", "loss:0.5"): pure code, used by runs and reports.

A run whose config names a target times it to the iteration after training
(harness/evaluation.py); reports read that time, or interpolate between evaluations for a target
chosen later.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from hetbench.errors import UserError

METRICS = {"accuracy": "test_accuracy", "loss": "test_loss"}
#: Applies to every workload without a target of its own.
ANY_WORKLOAD = "*"


@dataclass(frozen=True)
class Target:
    """Reach test accuracy >= value, or test loss <= value."""

    metric: Literal["accuracy", "loss"]
    value: float
    #: Where it came from: "--target", "matrix", or "auto" (picked from the runs themselves).
    source: str = "--target"

    @property
    def column(self) -> str:
        return METRICS[self.metric]

    def met(self, value: float) -> bool:
        """Whether one evaluation's metric value reaches the target."""
        if value is None or math.isnan(value):
            return False
        return value >= self.value if self.metric == "accuracy" else value <= self.value

    @property
    def spec(self) -> str:
        """The canonical matrix spelling, e.g. accuracy:0.85 (what runs record)."""
        return f"{self.metric}:{self.value:g}"

    def __str__(self) -> str:
        sign = ">=" if self.metric == "accuracy" else "<="
        return f"test {self.metric} {sign} {self.value:g}"


def parse_target(text: str, source: str = "--target") -> Target:
    """`accuracy:0.85` or `loss:0.5` -> Target."""
    metric, sep, value = str(text).partition(":")
    metric = metric.strip().removeprefix("test_")
    if not sep or metric not in METRICS:
        raise UserError(f"target {text!r}: write accuracy:VALUE or loss:VALUE, e.g. accuracy:0.85")
    try:
        number = float(value)
    except ValueError:
        raise UserError(f"target {text!r}: {value!r} is not a number; e.g. accuracy:0.85") from None
    if metric == "accuracy" and not 0 < number <= 1:
        raise UserError(f"target {text!r}: accuracy is a fraction in (0, 1], e.g. accuracy:0.85")
    return Target(metric, number, source)  # type: ignore[arg-type]


