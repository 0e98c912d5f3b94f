"""Random stragglers: each worker, each iteration, independently slowed with probability p."""

from __future__ import annotations

import numpy as np

from hetbench.errors import UserError
from hetbench.slowdown.base import Injector, parse_factor
from hetbench.slowdown.draws import SlowBlocks


class ProbabilisticSlowdown(Injector):
    time_free = True
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

    #: Words appended to every draw's key [seed, worker, iteration] (a kind's own stream).
    salt: tuple[int, ...] = ()

    def __init__(self, spec: str, factor: float, probability: float | None, seed: int):
        self.spec = spec
        self.slow_factor = factor
        # None means 1/workers, resolved in validate() once the world is known.
        self.probability = probability
        self.seed = seed
        self._slowed: SlowBlocks | None = None

    def validate(self, workers: int) -> None:
        if self.probability is None:
            self.probability = 1.0 / workers
        # The same draws, 64 iterations of every worker at a time (bench sim's hot path).
        self._slowed = SlowBlocks(self.seed, workers, self.probability, self.salt)

    def slowed(self, worker: int, column: int) -> bool:
        """Whether the stateless draw keyed [seed, worker, column, *salt] falls under the
        probability: replayable, and independent of how many draws came before (a skipped
        iteration shifts nothing)."""
        blocks = self._slowed
        if blocks is not None and 0 <= worker < blocks.rows and column >= 0:
            return blocks(worker, column)
        draw = np.random.default_rng([self.seed, worker, column, *self.salt]).random()
        return draw < self.probability

    def factor(self, worker: int, iteration: int, elapsed_s: float) -> float:
        return self.slow_factor if self.slowed(worker, iteration) else 1.0

    def factors(self, iteration: int, elapsed_s: np.ndarray) -> np.ndarray:
        blocks = self._slowed
        if blocks is None or blocks.rows != len(elapsed_s) or iteration < 0:
            return super().factors(iteration, elapsed_s)
        return np.where(blocks.column(iteration), self.slow_factor, 1.0)
