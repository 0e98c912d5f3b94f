"""Convergence targets ("accuracy:0.85", "loss:0.5") and the time each run takes to reach one."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import pandas as pd

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


def parse_targets(specs: list[str] | tuple[str, ...],
                  source: str = "--target") -> dict[str, Target]:
    """`--target` values: `SPEC` for every workload or `WORKLOAD=SPEC` for one."""
    targets: dict[str, Target] = {}
    for spec in specs:
        workload, eq, rest = spec.partition("=")
        if eq:
            targets[workload.strip()] = parse_target(rest, source)
        else:
            targets[ANY_WORKLOAD] = parse_target(spec, source)
    return targets


def targets_from_matrix(spec: dict[str, Any]) -> dict[str, Target]:
    """A matrix's `target = "accuracy:0.85"`, or a `[target]` table of workload = spec."""
    value = spec.get("target")
    if value is None:
        return {}
    if isinstance(value, str):
        return {ANY_WORKLOAD: parse_target(value, "matrix")}
    if isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
        return {k: parse_target(v, "matrix") for k, v in value.items()}
    raise UserError(f"matrix: target must be 'accuracy:V' / 'loss:V' or a table of workload = "
                    f"spec, got {value!r}")


def resolve_targets(evals: pd.DataFrame, given: dict[str, Target]) -> dict[str, Target]:
    """A target per workload: the given one, else an automatic one every run can be timed to.

    The automatic target is 90% of the lowest final accuracy of any run of that workload (rounded
    down to 0.01), so each run has a time to compare and the report says it was picked that way.
    """
    targets = {}
    if evals.empty:
        return targets
    for workload, rows in evals.groupby("workload"):
        if workload in given or ANY_WORKLOAD in given:
            targets[workload] = given.get(workload, given.get(ANY_WORKLOAD))
            continue
        finals = rows[rows["kind"] == "final"]["test_accuracy"].dropna()
        if finals.empty:
            continue
        targets[workload] = Target("accuracy", math.floor(finals.min() * 0.9 * 100) / 100, "auto")
    return targets


def time_to_target(run_evals: pd.DataFrame, target: Target) -> tuple[float, float]:
    """(wall seconds, iteration) of the first evaluation of one run that meets `target`.

    No interpolation: the answer is a measured point, so its resolution is the run's
    eval_interval_s. (nan, nan) if the run never reached the target.
    """
    ordered = run_evals.sort_values(["wall_s", "kind"], kind="stable")
    for _, row in ordered.iterrows():
        if target.met(row.get(target.column)):
            return float(row["wall_s"]), float(row["iteration"])
    return math.nan, math.nan
