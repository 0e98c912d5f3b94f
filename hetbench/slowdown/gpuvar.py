"""gpuvar(spread=V;outlier_p=P;outlier_k=K): static GPU-to-GPU variability. Each worker's
factor is fixed for the run: 1 + V x U (U uniform in [0, 1), so the slowest ordinary GPU is V
slower than the fastest), or, with probability P, an outlier K times slower.

Sinha et al., "Not All GPUs Are Created Equal", SC'22: GPUs of one model and SKU vary by 8%
on average (up to 22%), with outliers up to 1.5x slower than the median GPU (the arXiv
abstract, 2208.11035v3). The paper's share of outliers was not reachable here: P = 0.01 is
hetbench's choice.
"""

from __future__ import annotations

import numpy as np

from hetbench.slowdown.blocks import Block, Param


class GpuVarBlock(Block):
    name = "gpuvar"
    salt = 5
    params = {
        "spread": Param(0.08, 0.0, 10.0, "slowest ordinary GPU vs the fastest, minus 1"),
        "outlier_p": Param(0.01, 0.0, 1.0, "probability that a GPU is an outlier"),
        "outlier_k": Param(1.5, 1.0, 100.0, "an outlier's slowdown factor"),
    }

    def validate(self, workers: int) -> None:
        super().validate(workers)
        spread = 1.0 + self.values["spread"] * self.static_uniforms(workers, word=2)
        outlier = self.static_uniforms(workers, word=3) < self.values["outlier_p"]
        self.static = np.where(outlier, np.maximum(spread, self.values["outlier_k"]), spread)

    def column(self, workers: np.ndarray, iteration: int) -> np.ndarray:
        return self.static[workers % len(self.static)]
