"""The injector interface; each kind parses its own spec (`from_spec`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np

from hetbench.errors import UserError


class Injector(ABC):
    """Decides the extra seconds a worker sleeps after an iteration's compute."""

    #: The spec this injector was parsed from, e.g. "prob:5".
    spec: str
    #: The spec's prefix ("prob" in prob:5), its syntax and what it does, for `bench list`.
    kind: ClassVar[str]
    syntax: ClassVar[str]
    description: ClassVar[str]
    #: Whether the kind slows NICs (it needs a network model) rather than compute.
    network_kind: ClassVar[bool] = False
    #: Whether factor() ignores elapsed_s (a worker's factor at an iteration is fixed
    #: beforehand): bench sim then reads every worker's factor of an iteration from one
    #: factors() column instead of calling factor() per worker-iteration.
    time_free: ClassVar[bool] = False
    #: nic_factor(rank, t_s): the divisor of a rank's NIC bandwidth at cluster time t_s, for
    #: the network kinds (slowdown/network.py); None: every NIC at full speed.
    nic_factor = None

    @classmethod
    @abstractmethod
    def from_spec(cls, spec: str, args: str, seed: int) -> Injector:
        """The injector of `spec` ("kind:args"; args "" for a bare kind); UserError, naming the
        syntax, when args do not fit."""

    @abstractmethod
    def factor(self, worker: int, iteration: int, elapsed_s: float) -> float:
        """Slowdown factor (>= 1) of `worker` at `iteration`, `elapsed_s` after training began."""

    def factors(self, iteration: int, elapsed_s: np.ndarray) -> np.ndarray:
        """factor() of every worker 0..n-1 at one iteration (elapsed_s[w]: worker w's time),
        as float64: what bench sim's lockstep (an iteration of every worker at a time) draws.
        Kinds with a cheaper vector form override it; it must equal factor() element by
        element (tests/unit/test_slowdown.py holds every kind to that)."""
        return np.array([self.factor(w, iteration, t) for w, t in enumerate(elapsed_s.tolist())],
                        dtype=np.float64)

    def delay_s(self, worker: int, iteration: int, elapsed_s: float, compute_s: float) -> float:
        """Seconds to sleep: a factor k turns compute time c into k * c."""
        return (self.factor(worker, iteration, elapsed_s) - 1.0) * compute_s

    def validate(self, workers: int) -> None:
        """Raise UserError if this injector cannot apply to `workers` workers."""


def parse_factor(text: str, spec: str) -> float:
    try:
        k = float(text)
    except ValueError:
        raise UserError(
            f"slowdown {spec!r}: factor {text!r} is not a number; write e.g. prob:5 or det:5@0"
        ) from None
    if k < 1:
        raise UserError(f"slowdown {spec!r}: factor must be >= 1 (1 = no slowdown), got {k:g}")
    return k
