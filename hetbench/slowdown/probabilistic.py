"""Random stragglers: each worker, each iteration, independently slowed with probability p."""

from __future__ import annotations

import numpy as np

from hetbench.slowdown.base import Injector


class ProbabilisticSlowdown(Injector):
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
