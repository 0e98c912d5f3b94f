"""Fixed stragglers: named workers are always k times slower."""

from __future__ import annotations

import numpy as np

from hetbench.errors import UserError
from hetbench.slowdown.base import Injector, parse_factor


class DeterministicSlowdown(Injector):
    time_free = True
    kind = "det"
    syntax = "det:K@R1,R2"
    description = "workers R1, R2, ... always K times slower"

    @classmethod
    def from_spec(cls, spec: str, args: str, seed: int) -> DeterministicSlowdown:
        factor_text, _, ranks_text = args.partition("@")
        if not ranks_text:
            raise UserError(f"slowdown {spec!r}: name the slow workers, e.g. det:5@0,3")
        try:
            workers = tuple(sorted({int(r) for r in ranks_text.split(",")}))
        except ValueError:
            raise UserError(
                f"slowdown {spec!r}: workers must be integers separated by commas, e.g. det:5@0,3"
            ) from None
        return cls(spec, parse_factor(factor_text, spec), workers)

    def __init__(self, spec: str, factor: float, slow_workers: tuple[int, ...]):
        self.spec = spec
        self.slow_factor = factor
        self.slow_workers = frozenset(slow_workers)

    def validate(self, workers: int) -> None:
        bad = sorted(w for w in self.slow_workers if not 0 <= w < workers)
        if bad:
            raise UserError(
                f"slowdown {self.spec!r}: worker(s) {bad} do not exist with {workers} workers "
                f"(valid: 0..{workers - 1})"
            )

    def factor(self, worker: int, iteration: int, elapsed_s: float) -> float:
        return self.slow_factor if worker in self.slow_workers else 1.0

    def factors(self, iteration: int, elapsed_s: np.ndarray) -> np.ndarray:
        out = np.ones(len(elapsed_s))
        out[sorted(self.slow_workers)] = self.slow_factor
        return out
