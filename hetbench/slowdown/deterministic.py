"""Fixed stragglers: named workers are always k times slower."""

from hetbench.errors import UserError
from hetbench.slowdown.base import Injector


class DeterministicSlowdown(Injector):
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
