"""Random stragglers: each worker, each iteration, independently slowed with probability p."""

from __future__ import annotations

import numpy as np

from hetbench.errors import UserError
from hetbench.slowdown.base import Injector, parse_factor


class ProbabilisticSlowdown(Injector):
    kind = "prob"
    syntax = "prob:K[@P]"
    description = "each worker each iteration slowed K times with probability P (1/workers)"

    @classmethod
    def from_spec(cls, spec: str, args: str, seed: int) -> ProbabilisticSlowdown:
        factor_text, _, prob_text = args.partition("@")
        prob = None
        if prob_text:
            try:
                prob = float(prob_text)
            except ValueError:
                raise UserError(
                    f"slowdown {spec!r}: probability {prob_text!r} is not a number; "
                    "write e.g. prob:5@0.25"
                ) from None
            if not 0 <= prob <= 1:
                raise UserError(f"slowdown {spec!r}: probability must be in [0, 1], got {prob:g}")
        return cls(spec, parse_factor(factor_text, spec), prob, seed)

    def __init__(self, spec: str, factor: float, probability: float | None, seed: int):
        self.spec = spec
        self.slow_factor = factor
        # None means 1/workers, resolved in validate() once the world is known.
        self.probability = probability
        self.seed = seed

    def validate(self, workers: int) -> None:
        if self.probability is None:
            self.probability = 1.0 / workers

    def factor(self, worker: int, iteration: int, elapsed_s: float) -> float:
        # Stateless draw keyed by (seed, worker, iteration): the schedule is replayable and does
        # not depend on how many draws came before (a skipped iteration shifts nothing).
        draw = np.random.default_rng([self.seed, worker, iteration]).random()
        return self.slow_factor if draw < self.probability else 1.0
