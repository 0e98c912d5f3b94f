"""The papers' published ratios beside ours.

Sources, cited by the `source` of each figure:
- "Prague slides": the talk of Q. Luo, J. He, Y. Zhuo, X. Qian, "Prague: High-Performance
  Heterogeneity-Aware Asynchronous Decentralized Training", ASPLOS 2020 (throughput normalised
  to All-Reduce, ResNet-18/50/200 on 16 GPUs, without slowdown and with random 5x slowdown).
- "Ripples abstract": the same authors, "Heterogeneity-Aware Asynchronous Decentralized
  Training" (Ripples), arXiv, September 2019: the abstract's speedups.
- "Prague ASPLOS'20 abstract": the ASPLOS 2020 paper above, its abstract.
- "Prague slides, VGG-16 convergence": the talk's "time required to attain a desired loss (for
  VGG-16)" figure. The slides give no values for it, so each row is the direction the abstracts'
  training speedups state (Prague faster than All-Reduce under slowdown, than AD-PSGD and than a
  parameter server in both settings), checked as "> 1".
- "Hop ASPLOS'19": Q. Luo, J. Lin, Y. Zhuo, X. Qian, "Hop: Heterogeneity-Aware Decentralized
  Training", ASPLOS 2019 (speedups over standard decentralized training, CNN and SVM).

We reproduce the *shape* (which algorithm beats which, and roughly by how much) on a 2-core
machine with emulated compute, not the absolute numbers of a GPU cluster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import pandas as pd

from hetbench.reports.tables import format_number

#: The matrices' slowdown specs for the papers' settings.
HOMOGENEOUS = "none"
RANDOM_5X = "prob:5"  # each worker slowed 5x with probability 1/n each iteration
DETERMINISTIC_5X = "det:5@0"  # worker 0 always 5x slower


@dataclass(frozen=True)
class Published:
    """One published ratio: algorithm in (workload, slowdown) / reference in its own setting."""

    source: str
    algorithm: str
    reference: str
    workload: str
    slowdown: str
    #: Throughput ratio (the slides' normalised tables) or end-to-end training speedup.
    metric: Literal["throughput", "speedup"]
    #: None for a qualitative claim ("significant speedup"): we check the ratio is > 1.
    value: float | None
    reference_slowdown: str | None = None

    @property
    def ref_slowdown(self) -> str:
        return self.reference_slowdown or self.slowdown


def _slides(workload: str, values: dict[str, float], slowdown: str = HOMOGENEOUS):
    return [Published("Prague slides", algorithm, "allreduce", workload, slowdown, "throughput",
                      value, HOMOGENEOUS) for algorithm, value in values.items()]


PRAGUE: list[Published] = [
    *_slides("resnet18", {"adpsgd": 0.62, "prague-static": 1.10, "prague-smart": 1.10}),
    *_slides("resnet50", {"adpsgd": 0.58, "prague-static": 1.04, "prague-smart": 1.02}),
    *_slides("resnet200", {"adpsgd": 0.52, "prague-static": 0.96, "prague-smart": 0.98}),
    # The slides' Transformer row (News-Commentary) has only Smart GG's value.
    *_slides("transformer", {"prague-smart": 4.0}),
    *_slides("resnet18", {"allreduce": 0.24, "adpsgd": 0.28, "prague-smart": 0.45}, RANDOM_5X),
    # The abstracts name the smart group generator's speedup of whole training runs; "PS" is
    # compared with our synchronous parameter server.
    *[Published("Ripples abstract", "prague-smart", ref, "resnet18", slowdown, "speedup", value)
      for ref, slowdown, value in [("allreduce", HOMOGENEOUS, 1.1), ("ps-sync", HOMOGENEOUS, 5.1),
                                   ("adpsgd", HOMOGENEOUS, 4.3), ("allreduce", RANDOM_5X, 2.0),
                                   ("ps-sync", RANDOM_5X, 3.0)]],
    *[Published("Prague ASPLOS'20 abstract", "prague-smart", ref, "resnet18", slowdown, "speedup",
                value)
      for ref, slowdown, value in [("allreduce", HOMOGENEOUS, 1.2), ("ps-sync", HOMOGENEOUS, 5.3),
                                   ("adpsgd", HOMOGENEOUS, 3.7), ("allreduce", RANDOM_5X, 4.4)]],
]

#: `bench reproduce prague --convergence`: time to the target loss with real compute.
PRAGUE_CONVERGENCE: list[Published] = [
    Published("Prague slides, VGG-16 convergence", "prague-smart", ref, "vgg16", slowdown,
              "speedup", None)
    for ref, slowdown in [("allreduce", RANDOM_5X), ("adpsgd", HOMOGENEOUS), ("adpsgd", RANDOM_5X),
                          ("ps-sync", HOMOGENEOUS), ("ps-sync", RANDOM_5X)]
]

HOP: list[Published] = [
    Published("Hop ASPLOS'19", "hop", "dpsgd", workload, slowdown, "speedup", None)
    for workload in ("cnn-cifar10", "svm") for slowdown in (RANDOM_5X, DETERMINISTIC_5X)
]

PUBLISHED = {"prague": PRAGUE, "hop": HOP}
#: The figures `bench reproduce NAME --convergence` measures (Hop's speedups are the same
#: claims, there timed to a target with real compute).
PUBLISHED_CONVERGENCE = {"prague": PRAGUE_CONVERGENCE, "hop": HOP}


def measured_vs_published(figures: list[Published], throughput: pd.DataFrame,
                          time_to_target: pd.DataFrame) -> pd.DataFrame:
    """One row per published figure (and worker count measured): ours beside theirs.

    A speedup is measured as time-to-target speedup where both runs evaluated convergence, else
    as the throughput ratio (emulated compute measures no convergence); the `measured as` column
    says which. `shape` is whether ours falls on the same side of 1 as theirs (see _shape).
    """
    tp = throughput.set_index(["algorithm", "workload", "workers", "slowdown"])["throughput"]
    ttt = (time_to_target.set_index(["algorithm", "workload", "workers", "slowdown"])
           ["time_to_target_s"] if not time_to_target.empty else pd.Series(dtype=float))
    worker_counts = sorted(throughput["workers"].unique()) if not throughput.empty else []
    rows = []
    for fig in figures:
        for workers in worker_counts or [math.nan]:
            mine = (fig.algorithm, fig.workload, workers, fig.slowdown)
            ref = (fig.reference, fig.workload, workers, fig.ref_slowdown)
            value, how = math.nan, "not run"
            if fig.metric == "speedup" and mine in ttt.index and ref in ttt.index:
                value, how = ttt[ref] / ttt[mine], "time-to-target speedup"
            elif mine in tp.index and ref in tp.index:
                value, how = tp[mine] / tp[ref], "throughput ratio"
            published = "> 1 (significant)" if fig.value is None else format_number(fig.value)
            rows.append({
                "source": fig.source, "workload": fig.workload, "workers": workers,
                "algorithm": fig.algorithm, "slowdown": fig.slowdown,
                "vs": f"{fig.reference} ({fig.ref_slowdown})", "published": published,
                "measured": value, "measured as": how, "shape": _shape(fig.value, value),
            })
    return pd.DataFrame(rows)


#: Ratios within this of 1 count as "on par" when comparing shapes.
PAR = 0.05


def _side(value: float) -> int:
    return 0 if abs(value - 1) <= PAR else (1 if value > 1 else -1)


def _shape(published: float | None, measured: float) -> str:
    """"same" if ours is on the same side of 1 as theirs (above, below, or on par within 5%)."""
    if math.isnan(measured):
        return ""
    theirs = 1 if published is None else _side(published)
    return "same" if theirs == _side(measured) else "differs"
