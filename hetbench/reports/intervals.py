"""The spread over seeds every table shows: a mean with its 95% Student-t interval and n.

A t-interval, not a bootstrap: a matrix has 2-5 seeds per cell, too few for a bootstrap's
resampling to say anything a t-interval does not, and the t-interval is what a reader of a
paper expects beside "± ... (n = 3)".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import pandas as pd

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Interval:
    """Mean of per-seed values and its 95% t-interval (nan bounds with fewer than 2 seeds)."""

    mean: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: Iterable) -> Interval:
        values = [float(v) for v in values if not pd.isna(v)]
        n = len(values)
        if n == 0:
            return cls(math.nan, math.nan, math.nan, 0)
        mean = sum(values) / n
        if n < 2:
            return cls(mean, math.nan, math.nan, n)
        from scipy.stats import t

        sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
        half = t.ppf(0.5 + CONFIDENCE / 2, n - 1) * sd / math.sqrt(n)
        return cls(mean, mean - half, mean + half, n)

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def text(self, fmt) -> str:
        """`1.23 ± 0.04 (n=3)`, `1.23 (n=1)`, or "" without values (`fmt`: a number's text)."""
        if self.n == 0:
            return ""
        if math.isnan(self.low):
            return f"{fmt(self.mean)} (n={self.n})"
        return f"{fmt(self.mean)} ± {fmt(self.half_width)} (n={self.n})"


def paired_ratios(mine: Mapping, base: Mapping) -> Interval:
    """The interval of per-seed ratios mine[seed] / base[seed] over the seeds both have (a
    seed's run against the baseline's run of the same seed: the same data order and initial
    model, so the seed's own luck cancels)."""
    return Interval.of(mine[s] / base[s] for s in mine
                       if s in base and not pd.isna(mine[s]) and not pd.isna(base[s])
                       and base[s] != 0)
