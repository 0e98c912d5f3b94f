"""gc(every=E;pause=P): unsynchronized periodic pauses. Each worker pauses once every E
iterations, at its own phase (drawn once per run from the seed), for P times that iteration's
compute (factor 1 + P).

The OSDI'25 study names unsynchronized garbage collection among straggler causes (Python's
collector runs in each rank at its own moments); the period and length here are hetbench's
choice, not the paper's (its numbers were not reachable here): a pause of half a step every 50
steps.
"""

from __future__ import annotations

import numpy as np

from hetbench.slowdown.blocks import Block, Param


class GcPauseBlock(Block):
    name = "gc"
    salt = 6
    params = {
        "every": Param(50, 1, 1e9, "iterations between a worker's pauses", integer=True),
        "pause": Param(0.5, 0.0, 100.0, "a pause's length, in that iteration's compute"),
    }

    def validate(self, workers: int) -> None:
        super().validate(workers)
        every = int(self.values["every"])
        self.phase = np.floor(self.static_uniforms(workers, word=4) * every).astype(np.int64)

    def column(self, workers: np.ndarray, iteration: int) -> np.ndarray:
        every = int(self.values["every"])
        pausing = (iteration + self.phase[workers % len(self.phase)]) % every == 0
        return np.where(pausing, 1.0 + self.values["pause"], 1.0)
