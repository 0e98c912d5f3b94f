"""No injected slowdown."""

from hetbench.slowdown.base import Injector


class NoSlowdown(Injector):
    spec = "none"

    def factor(self, worker: int, iteration: int, elapsed_s: float) -> float:
        return 1.0
