"""faulty(k=K;n=N): N workers (drawn once per run from the seed) always K times slower: a
faulty machine, which the OSDI'25 study finds rare but severe (about 3x)."""

from __future__ import annotations

import numpy as np

from hetbench.slowdown.blocks import Block, Param, chosen_workers


class FaultyBlock(Block):
    name = "faulty"
    salt = 3
    params = {
        "k": Param(3.0, 1.0, 100.0, "the faulty workers' slowdown factor"),
        "n": Param(1, 1, 1e6, "how many workers are faulty", integer=True),
    }

    def validate(self, workers: int) -> None:
        super().validate(workers)
        self.slow = np.zeros(workers, dtype=bool)
        self.slow[chosen_workers(self, min(workers, int(self.values["n"])))] = True

    def column(self, workers: np.ndarray, iteration: int) -> np.ndarray:
        return np.where(self.slow[workers % len(self.slow)], self.values["k"], 1.0)
