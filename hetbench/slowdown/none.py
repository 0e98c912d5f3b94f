"""No injected slowdown."""

from __future__ import annotations

import numpy as np

from hetbench.errors import UserError
from hetbench.slowdown.base import Injector


class NoSlowdown(Injector):
    time_free = True
    spec = "none"
    kind = "none"
    syntax = "none"
    description = "no injected slowdown"

    @classmethod
    def from_spec(cls, spec: str, args: str, seed: int) -> NoSlowdown:
        if args:
            raise UserError(f"slowdown {spec!r}: none takes no arguments")
        return cls()

    def factor(self, worker: int, iteration: int, elapsed_s: float) -> float:
        return 1.0

    def factors(self, iteration: int, elapsed_s: np.ndarray) -> np.ndarray:
        return np.ones(len(elapsed_s))
