"""Replay a real job's stragglers from a compute table (slowdown/table.py).

Worker w at iteration k is slowed by max(1, c[w, k] / median over workers of c[., k]): the
table says how much slower than its iteration's median each worker was, and the run's own
workload supplies the time itself. A run with more workers or iterations than the table wraps
around (trace worker w mod W, iteration k mod K). Nothing is random, so every seed replays the
same factors, and no factor depends on time.
"""

from __future__ import annotations

import numpy as np

from hetbench.slowdown.base import Injector
from hetbench.slowdown.table import ComputeTable, read_table, resolve_table_path

#: Tables read in this process, by (path, mtime, size): a config builds its injector more than
#: once (validation, then the run), and a matrix names one table in many cells.
_READ: dict[tuple[str, int, int], ComputeTable] = {}


def load_table(path_text: str) -> ComputeTable:
    path = resolve_table_path(path_text)
    try:
        stat = path.stat()
        key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    except OSError:
        return read_table(path)  # says why in one line
    table = _READ.get(key)
    if table is None:
        table = _READ[key] = read_table(path)
    return table


class ReplaySlowdown(Injector):
    time_free = True
    kind = "replay"
    syntax = "replay:PATH"
    description = ("replay a compute table (CSV worker,iteration,compute_s or parquet; or a "
                   "shipped one by name): slowed by c[w,k] / median c[.,k], wrapping around")

    @classmethod
    def from_spec(cls, spec: str, args: str, seed: int) -> ReplaySlowdown:
        return cls(spec, load_table(args))

    def __init__(self, spec: str, table: ComputeTable):
        self.spec = spec
        self.table = table
        self.table_factors = table.factors()

    def factor(self, worker: int, iteration: int, elapsed_s: float) -> float:
        factors = self.table_factors
        return float(factors[worker % factors.shape[0], iteration % factors.shape[1]])

    def factors(self, iteration: int, elapsed_s: np.ndarray) -> np.ndarray:
        factors = self.table_factors
        rows = np.arange(len(elapsed_s)) % factors.shape[0]
        return factors[rows, iteration % factors.shape[1]].astype(np.float64)
