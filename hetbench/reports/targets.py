"""Convergence targets ("accuracy:0.85", "loss:0.5") and the time each run takes to reach one."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from hetbench.errors import UserError
from hetbench.harness.target import ANY_WORKLOAD, METRICS, Target, parse_target

__all__ = ["ANY_WORKLOAD", "METRICS", "Target", "parse_target", "parse_targets",
           "resolve_targets", "targets_from_matrix", "time_to_target"]


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
