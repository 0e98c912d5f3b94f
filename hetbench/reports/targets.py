"""Convergence targets ("accuracy:0.85", "loss:0.5") and the time each run takes to reach one."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from hetbench.core.target import ANY_WORKLOAD, METRICS, Target, parse_target
from hetbench.errors import UserError

__all__ = ["ANY_WORKLOAD", "METRICS", "Reach", "Target", "parse_target", "parse_targets",
           "reach", "resolve_targets", "targets_from_matrix", "time_to_target"]


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


#: How a run's time to target was found (time_to_target's third value).
REFINED, INTERPOLATED = "refined", "interpolated"


def time_to_target(run_evals: pd.DataFrame, target: Target) -> tuple[float, float, str]:
    """(wall seconds, iteration, how) at which one run's averaged model first met `target`.

    A run that was given this target recorded the moment itself, to one worker step (a
    "target" evaluation, found after training; how = "refined"). Otherwise the time is
    interpolated linearly between the last evaluation below the target and the first one that
    meets it (how = "interpolated"): an estimate, not quantised to eval_interval_s. (nan, nan,
    "") if the run never met it.
    """
    if "target" in run_evals:
        refined = run_evals[(run_evals["kind"] == "target")
                            & (run_evals["target"] == target.spec)]
        if not refined.empty:
            row = refined.iloc[0]
            return float(row["wall_s"]), float(row["iteration"]), REFINED
    ordered = run_evals[run_evals["kind"].isin(["snapshot", "final"])].sort_values(
        ["wall_s", "kind"], kind="stable")
    previous = None
    for _, row in ordered.iterrows():
        value = row.get(target.column)
        if target.met(value):
            if previous is None or previous[target.column] == value:
                return float(row["wall_s"]), float(row["iteration"]), INTERPOLATED
            share = (target.value - previous[target.column]) / (value - previous[target.column])
            share = min(max(share, 0.0), 1.0)
            wall_s, iteration = (
                float(previous[c] + share * (row[c] - previous[c])) for c in ("wall_s",
                                                                               "iteration"))
            return wall_s, iteration, INTERPOLATED
        if value is not None and not math.isnan(value):
            previous = row
    return math.nan, math.nan, ""


@dataclass(frozen=True)
class Reach:
    """One run against a target: its first crossing (time_to_target) and whether it held it."""

    seconds: float
    iteration: float
    how: str
    #: Every evaluation from the crossing to the end of the run held the target (within its
    #: hold tolerance); False for a run that never crossed.
    held: bool

    @property
    def crossed(self) -> bool:
        return not math.isnan(self.seconds)

    @property
    def verdict(self) -> str:
        """"held", "crossed, not held" or "not reached": what every table says of the run."""
        if not self.crossed:
            return NOT_REACHED
        return HELD if self.held else NOT_HELD


HELD, NOT_HELD, NOT_REACHED = "held", "crossed, not held", "not reached"


def reach(run_evals: pd.DataFrame, target: Target) -> Reach:
    """The run's first crossing of `target` and whether it held it: every evaluation (snapshot
    or final) at or after the crossing holds it (Target.holds), through the end of the run. A
    run that touched the target and fell back, or diverged, has a crossing but no hold."""
    seconds, iteration, how = time_to_target(run_evals, target)
    if math.isnan(seconds):
        return Reach(seconds, iteration, how, held=False)
    later = run_evals[run_evals["kind"].isin(["snapshot", "final"])
                      & (run_evals["wall_s"] >= seconds)]
    values = later[target.column] if target.column in later else pd.Series(dtype=float)
    held = not later.empty and all(target.holds(v) for v in values)
    return Reach(seconds, iteration, how, held)
