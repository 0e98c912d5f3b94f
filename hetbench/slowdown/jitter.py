"""jitter(sigma=S): every worker, every iteration, independently: compute times spread
log-normally around the iteration's median (log-sd S), and a worker above the median is slowed
by its ratio to it, max(1, exp(S x Z)): the shape `replay:` gives a trace, drawn afresh.

What sequence-length imbalance does to data-parallel ranks (OSDI'25): each rank's batch holds
different sequence lengths each step. The default S is the log-sd of compute / median over the
SE job's 32 data-parallel ranks x 43 steps (slowdown/traces/bytedance-se.csv).
"""

from __future__ import annotations

import numpy as np

from hetbench.slowdown.blocks import Block, Param


class JitterBlock(Block):
    name = "jitter"
    salt = 2
    params = {
        "sigma": Param(0.094, 0.0, 3.0, "log-sd of compute around the iteration's median"),
    }

    def column(self, workers: np.ndarray, iteration: int) -> np.ndarray:
        z = self.normals(workers, iteration)
        return np.maximum(1.0, np.exp(self.values["sigma"] * z))
