"""Convergence targets ("accuracy:0.85", "loss:0.5", "accuracy:0.85~0.01"): pure code, used by
runs and reports.

A run whose config names a target times it to the iteration after training
(harness/evaluation.py); reports read that time, or interpolate between evaluations for a target
chosen later. A run that crossed the target *holds* it when every later evaluation stays within
the target's hold tolerance of it: a run that touched the target and fell back (diverged) did
not reach it, whatever its first crossing says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from hetbench.errors import UserError

METRICS = {"accuracy": "test_accuracy", "loss": "test_loss"}
#: Applies to every workload without a target of its own.
ANY_WORKLOAD = "*"
#: How far an evaluation after the first crossing may fall short of the target while the run
#: still holds it, unless the target says (`accuracy:0.85~0.01`): the evaluation's own noise
#: (a test set of a few hundred samples moves by a point or two between evaluations), not a
#: model that lost what it had learned. Accuracy: absolute; loss: a share of the target.
HOLD_ACCURACY = 0.02
HOLD_LOSS_SHARE = 0.05


@dataclass(frozen=True)
class Target:
    """Reach test accuracy >= value, or test loss <= value."""

    metric: Literal["accuracy", "loss"]
    value: float
    #: Where it came from: "--target", "matrix", or "auto" (picked from the runs themselves).
    source: str = "--target"
    #: How far below (accuracy) or above (loss) the target a later evaluation may be while the
    #: run still holds it, in the metric's units; None: HOLD_ACCURACY or HOLD_LOSS_SHARE.
    tolerance: float | None = None

    @property
    def column(self) -> str:
        return METRICS[self.metric]

    def met(self, value: float) -> bool:
        """Whether one evaluation's metric value reaches the target."""
        if value is None or math.isnan(value):
            return False
        return value >= self.value if self.metric == "accuracy" else value <= self.value

    @property
    def hold_tolerance(self) -> float:
        if self.tolerance is not None:
            return self.tolerance
        return HOLD_ACCURACY if self.metric == "accuracy" else HOLD_LOSS_SHARE * self.value

    def holds(self, value: float) -> bool:
        """Whether an evaluation after the first crossing still holds the target: within the
        hold tolerance of it (a NaN, a diverged model, never does)."""
        if value is None or math.isnan(value):
            return False
        if self.metric == "accuracy":
            return value >= self.value - self.hold_tolerance
        return value <= self.value + self.hold_tolerance

    @property
    def spec(self) -> str:
        """The canonical matrix spelling without the tolerance, e.g. accuracy:0.85 (what runs
        record beside their time to target: the tolerance matters only to the reports)."""
        return f"{self.metric}:{self.value:g}"

    def __str__(self) -> str:
        sign = ">=" if self.metric == "accuracy" else "<="
        return f"test {self.metric} {sign} {self.value:g}"

    def describe_hold(self) -> str:
        """How a run holds it, for the report's notes."""
        below = "below" if self.metric == "accuracy" else "above"
        how = ("" if self.tolerance is not None
               else " (the default; `~TOL` after the target sets another)")
        return (f"every evaluation after the first crossing stays within "
                f"{self.hold_tolerance:g} {below} {self.value:g}{how}")


def parse_target(text: str, source: str = "--target") -> Target:
    """`accuracy:0.85` or `loss:0.5`, optionally with a hold tolerance (`accuracy:0.85~0.01`)
    -> Target."""
    body, tilde, tolerance_text = str(text).partition("~")
    tolerance = None
    if tilde:
        try:
            tolerance = float(tolerance_text)
        except ValueError:
            raise UserError(f"target {text!r}: the hold tolerance {tolerance_text!r} after '~' "
                            "is not a number; e.g. accuracy:0.85~0.01") from None
        if not 0 <= tolerance < math.inf:
            raise UserError(f"target {text!r}: the hold tolerance is a non-negative number, "
                            "e.g. accuracy:0.85~0.01")
    metric, sep, value = body.partition(":")
    metric = metric.strip().removeprefix("test_")
    if not sep or metric not in METRICS:
        raise UserError(f"target {text!r}: write accuracy:VALUE or loss:VALUE, e.g. accuracy:0.85")
    try:
        number = float(value)
    except ValueError:
        raise UserError(f"target {text!r}: {value!r} is not a number; e.g. accuracy:0.85") from None
    if metric == "accuracy" and not 0 < number <= 1:
        raise UserError(f"target {text!r}: accuracy is a fraction in (0, 1], e.g. accuracy:0.85")
    return Target(metric, number, source, tolerance)  # type: ignore[arg-type]


