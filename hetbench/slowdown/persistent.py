"""persistent(frac=F;k=K): a fixed subset of the workers, always K times slower.

The OSDI'25 study (Lin et al.) finds a job's straggling steady over the job; its presets
(slowdown/presets.py) set K from the study's per-job slowdown distribution. Which workers, and
how many (round(F x workers), at least one), is drawn once per run from the seed.
"""

from __future__ import annotations

import numpy as np

from hetbench.slowdown.blocks import Block, Param, chosen_workers


class PersistentBlock(Block):
    name = "persistent"
    salt = 1
    params = {
        "frac": Param(0.1, 0.0, 1.0, "share of the workers that are slow (at least one)"),
        "k": Param(1.085, 1.0, 100.0, "their slowdown factor"),
    }

    def validate(self, workers: int) -> None:
        super().validate(workers)
        count = max(1, round(self.values["frac"] * workers))
        self.slow = np.zeros(workers, dtype=bool)
        self.slow[chosen_workers(self, count)] = True

    def column(self, workers: np.ndarray, iteration: int) -> np.ndarray:
        return np.where(self.slow[workers % len(self.slow)], self.values["k"], 1.0)
