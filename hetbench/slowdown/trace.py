"""Time-varying slowdowns read from a CSV trace: worker,t_from,t_to,factor (seconds)."""

from __future__ import annotations

import csv
from pathlib import Path

from hetbench.errors import UserError
from hetbench.slowdown.base import Injector


class TraceSlowdown(Injector):
    kind = "trace"
    syntax = "trace:PATH"
    description = "CSV worker,t_from,t_to,factor: time-varying slowdowns"

    @classmethod
    def from_spec(cls, spec: str, args: str, seed: int) -> TraceSlowdown:
        return cls.from_file(spec, args)

    def __init__(self, spec: str, rows: list[tuple[int, float, float, float]]):
        self.spec = spec
        self.rows = rows

    @classmethod
    def from_file(cls, spec: str, path_text: str) -> TraceSlowdown:
        path = Path(path_text)
        if not path.is_file():
            raise UserError(f"slowdown {spec!r}: trace file {path} does not exist")
        rows = []
        with path.open() as f:
            for line_no, row in enumerate(csv.reader(f), 1):
                if not row or row[0].startswith("#") or row[0].strip() == "worker":
                    continue
                try:
                    worker, t_from, t_to, factor = row
                    parsed = (int(worker), float(t_from), float(t_to), float(factor))
                except ValueError:
                    raise UserError(
                        f"slowdown trace {path}:{line_no}: expected worker,t_from,t_to,factor "
                        f"(int,float,float,float), got {','.join(row)!r}"
                    ) from None
                if parsed[3] < 1 or parsed[2] < parsed[1]:
                    raise UserError(
                        f"slowdown trace {path}:{line_no}: need factor >= 1 and t_to >= t_from"
                    )
                rows.append(parsed)
        return cls(spec, rows)

    def validate(self, workers: int) -> None:
        bad = sorted({w for w, *_ in self.rows if not 0 <= w < workers})
        if bad:
            raise UserError(f"slowdown {self.spec!r}: trace names workers {bad} beyond {workers}")

    def factor(self, worker: int, iteration: int, elapsed_s: float) -> float:
        factor = 1.0
        for w, t_from, t_to, k in self.rows:
            if w == worker and t_from <= elapsed_s < t_to:
                factor = max(factor, k)
        return factor
