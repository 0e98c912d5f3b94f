"""`bench tune`: every algorithm gets the same number of hyperparameter trials (AlgoPerf's
external tuning ruleset, Dahl et al. 2023), so a time-to-target comparison is not won by the
algorithm whose defaults happen to suit the workload.

A matrix file's `[tune]` table declares the budget and the search space:

    [tune]
    trials = 8                 # per algorithm, in every cell (workload x workers x slowdown x seed)
    seed = 0                   # of the quasi-random draws
    [tune.workload]            # workload options, drawn for every algorithm
    lr = {min = 0.01, max = 0.5, scale = "log"}
    momentum = [0.0, 0.5, 0.9] # a list: one of these values
    [tune.algorithm.hop]       # that algorithm's own options
    backup_workers = {min = 0, max = 2}   # integer bounds: an integer, both ends included

Trial t of every algorithm uses the same point of one scrambled Halton sequence for the
workload dimensions (common random numbers: no algorithm draws luckier learning rates), and
its own sequence for its own options. Every trial is a normal run (its own id, resumable); the
trials, their values and the ruleset go to tune.json in the results directory, from which
`bench report` scores each algorithm by its best trial's time to target.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Any

from hetbench.core.config import RunConfig
from hetbench.errors import UserError

TUNE_FILE = "tune.json"


@dataclasses.dataclass(frozen=True)
class Dimension:
    """One searched option: `choices`, or [low, high] on a linear or log scale."""

    name: str
    choices: tuple | None = None
    low: float | None = None
    high: float | None = None
    log: bool = False
    integer: bool = False

    def value(self, u: float) -> Any:
        """The option's value at `u` in [0, 1)."""
        if self.choices is not None:
            return self.choices[min(int(u * len(self.choices)), len(self.choices) - 1)]
        if self.integer:
            return min(int(self.low + u * (self.high - self.low + 1)), int(self.high))
        if self.log:
            return float(math.exp(math.log(self.low) + u * (math.log(self.high)
                                                             - math.log(self.low))))
        return float(self.low + u * (self.high - self.low))


def parse_dimension(name: str, spec: Any, where: str) -> Dimension:
    if isinstance(spec, list):
        if not spec:
            raise UserError(f"{where} {name}: an empty list of choices")
        return Dimension(name, choices=tuple(spec))
    if not isinstance(spec, dict) or set(spec) - {"min", "max", "scale"} or not {
            "min", "max"} <= set(spec):
        raise UserError(f"{where} {name}: give a list of values or {{min = A, max = B}} "
                        f"(scale = \"log\" optional), got {spec!r}")
    low, high, scale = spec["min"], spec["max"], spec.get("scale", "linear")
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (low, high)):
        raise UserError(f"{where} {name}: min and max must be numbers, got {low!r}, {high!r}")
    if scale not in ("linear", "log"):
        raise UserError(f"{where} {name}: scale must be \"linear\" or \"log\", got {scale!r}")
    if low > high:
        raise UserError(f"{where} {name}: min {low} is above max {high}")
    if scale == "log" and low <= 0:
        raise UserError(f"{where} {name}: a log scale needs min > 0, got {low}")
    integer = isinstance(low, int) and isinstance(high, int) and scale == "linear"
    return Dimension(name, low=low, high=high, log=scale == "log", integer=integer)


@dataclasses.dataclass(frozen=True)
class Ruleset:
    trials: int
    seed: int
    workload: tuple[Dimension, ...]
    algorithm: dict[str, tuple[Dimension, ...]]

    def describe(self) -> str:
        def dims(ds):
            return ", ".join(_describe(d) for d in ds) or "nothing"
        own = "; ".join(f"{name}: {dims(ds)}" for name, ds in sorted(self.algorithm.items()))
        return (f"{self.trials} trial(s) per algorithm and cell, quasi-random (scrambled Halton, "
                f"seed {self.seed}) over workload options {dims(self.workload)}"
                + (f"; own options {own}" if own else ""))


def _describe(d: Dimension) -> str:
    if d.choices is not None:
        return f"{d.name} in {list(d.choices)}"
    return f"{d.name} in [{d.low:g}, {d.high:g}]" + (" (log)" if d.log else "")


def parse_ruleset(spec: dict[str, Any], trials: int | None = None) -> Ruleset:
    """The `[tune]` table of a matrix (trials overridden by --trials)."""
    table = spec.get("tune")
    if not isinstance(table, dict):
        raise UserError("bench tune needs a [tune] table in the matrix file: trials = N and the "
                        "search space ([tune.workload], [tune.algorithm.<name>]); see "
                        "docs/tuning.md")
    unknown = sorted(set(table) - {"trials", "seed", "workload", "algorithm"})
    if unknown:
        raise UserError(f"[tune]: unknown key(s) {', '.join(unknown)}; keys are: algorithm, "
                        "seed, trials, workload")
    trials = trials if trials is not None else table.get("trials")
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        raise UserError(f"[tune]: trials must be an integer >= 1, got {trials!r}")
    seed = table.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise UserError(f"[tune]: seed must be an integer, got {seed!r}")
    shared = table.get("workload", {})
    own = table.get("algorithm", {})
    if not isinstance(shared, dict) or not isinstance(own, dict) or not all(
            isinstance(v, dict) for v in own.values()):
        raise UserError("[tune]: [tune.workload] and [tune.algorithm.<name>] must be tables of "
                        "option = list or {min, max}")
    algorithms = spec.get("algorithms") or []
    for name in own:
        if name not in algorithms:
            raise UserError(f"[tune.algorithm.{name}] names an algorithm not in `algorithms`")
    return Ruleset(
        trials=trials, seed=seed,
        workload=tuple(parse_dimension(k, v, "[tune.workload]") for k, v in shared.items()),
        algorithm={name: tuple(parse_dimension(k, v, f"[tune.algorithm.{name}]")
                               for k, v in dims.items()) for name, dims in own.items()})


def halton(dimensions: int, points: int, seed: int) -> list[list[float]]:
    """`points` scrambled Halton points in [0, 1)^dimensions (empty rows for no dimension)."""
    if dimensions == 0:
        return [[] for _ in range(points)]
    from scipy.stats import qmc

    return qmc.Halton(d=dimensions, scramble=True, seed=seed).random(points).tolist()


def _stable_seed(seed: int, name: str) -> int:
    """A seed for `name`'s own sequence that does not depend on Python's hash salt."""
    return seed * 1_000_003 + int(hashlib.sha256(name.encode()).hexdigest()[:8], 16)


def trials(base: list[RunConfig], ruleset: Ruleset) -> list[tuple[RunConfig, int, dict]]:
    """(config, trial index, drawn values) of every trial of every base run."""
    shared_points = halton(len(ruleset.workload), ruleset.trials, ruleset.seed)
    own_points = {name: halton(len(dims), ruleset.trials, _stable_seed(ruleset.seed, name))
                  for name, dims in ruleset.algorithm.items()}
    out = []
    for config in base:
        own_dims = ruleset.algorithm.get(config.algorithm, ())
        for t in range(ruleset.trials):
            load = {d.name: d.value(u) for d, u in zip(ruleset.workload, shared_points[t],
                                                       strict=True)}
            algo = ({d.name: d.value(u) for d, u in zip(own_dims, own_points[config.algorithm][t],
                                                         strict=True)} if own_dims else {})
            try:
                trial = dataclasses.replace(
                    config, algorithm_options={**config.algorithm_options, **algo},
                    workload_options={**config.workload_options, **load})
            except UserError as exc:
                drew = ", ".join(f"{k}={v!r}" for k, v in {**algo, **load}.items())
                raise UserError(f"[tune]: trial {t} of {config.algorithm} on {config.workload} "
                                f"draws {drew}, which cannot run: {exc}") from None
            out.append((trial, t, {**algo, **load}))
    return out


def expand_tuning(spec: dict[str, Any], base: list[RunConfig], trials_flag: int | None
                  ) -> tuple[Ruleset, list[tuple[RunConfig, int, dict]]]:
    """The ruleset and every trial; sweeps (lists in option tables) are refused: the search
    space is where values vary."""
    for table in ("algorithm", "workload"):
        for name, options in (spec.get(table) or {}).items():
            swept = [k for k, v in options.items() if isinstance(v, list)]
            if swept:
                raise UserError(f"bench tune: [{table}.{name}] sweeps {', '.join(swept)}; under "
                                "tuning, values vary only through [tune] (move it there, or "
                                "use bench run)")
    ruleset = parse_ruleset(spec, trials_flag)
    if not spec.get("target"):
        raise UserError("bench tune scores each algorithm by its best trial's time to target: "
                        "set target = \"accuracy:V\" or \"loss:V\" in the matrix")
    return ruleset, trials(base, ruleset)


def tune_record(ruleset: Ruleset, drawn: list[tuple[RunConfig, int, dict]]) -> dict[str, Any]:
    """What tune.json holds: the ruleset, and each trial run's index and values."""
    return {
        "ruleset": "external tuning (AlgoPerf): same trials per algorithm, best trial scored",
        "trials": ruleset.trials, "seed": ruleset.seed, "space": ruleset.describe(),
        "runs": {config.run_id: {"algorithm": config.algorithm, "trial": t, "values": values}
                 for config, t, values in drawn},
    }
