"""The injector interface and the spec parser."""

from __future__ import annotations

from abc import ABC, abstractmethod

from hetbench.errors import UserError


class Injector(ABC):
    """Decides the extra seconds a worker sleeps after an iteration's compute."""

    #: The spec this injector was parsed from, e.g. "prob:5".
    spec: str

    @abstractmethod
    def factor(self, worker: int, iteration: int, elapsed_s: float) -> float:
        """Slowdown factor (>= 1) of `worker` at `iteration`, `elapsed_s` after training began."""

    def delay_s(self, worker: int, iteration: int, elapsed_s: float, compute_s: float) -> float:
        """Seconds to sleep: a factor k turns compute time c into k * c."""
        return (self.factor(worker, iteration, elapsed_s) - 1.0) * compute_s

    def validate(self, workers: int) -> None:
        """Raise UserError if this injector cannot apply to `workers` workers."""


def _parse_factor(text: str, spec: str) -> float:
    try:
        k = float(text)
    except ValueError:
        raise UserError(
            f"slowdown {spec!r}: factor {text!r} is not a number; write e.g. prob:5 or det:5@0"
        ) from None
    if k < 1:
        raise UserError(f"slowdown {spec!r}: factor must be >= 1 (1 = no slowdown), got {k:g}")
    return k


def parse_slowdown(spec: str, seed: int = 0) -> Injector:
    """Parse a slowdown spec string (see the package docstring) into an Injector."""
    from hetbench.slowdown.deterministic import DeterministicSlowdown
    from hetbench.slowdown.none import NoSlowdown
    from hetbench.slowdown.probabilistic import ProbabilisticSlowdown
    from hetbench.slowdown.trace import TraceSlowdown

    spec = spec.strip()
    kind, _, rest = spec.partition(":")
    if kind == "none" and not rest:
        return NoSlowdown()
    if kind == "prob" and rest:
        factor_text, _, prob_text = rest.partition("@")
        prob = None
        if prob_text:
            try:
                prob = float(prob_text)
            except ValueError:
                raise UserError(
                    f"slowdown {spec!r}: probability {prob_text!r} is not a number; "
                    "write e.g. prob:5@0.25"
                ) from None
            if not 0 <= prob <= 1:
                raise UserError(f"slowdown {spec!r}: probability must be in [0, 1], got {prob:g}")
        return ProbabilisticSlowdown(spec, _parse_factor(factor_text, spec), prob, seed)
    if kind == "det" and rest:
        factor_text, _, ranks_text = rest.partition("@")
        if not ranks_text:
            raise UserError(f"slowdown {spec!r}: name the slow workers, e.g. det:5@0,3")
        try:
            workers = tuple(sorted({int(r) for r in ranks_text.split(",")}))
        except ValueError:
            raise UserError(
                f"slowdown {spec!r}: workers must be integers separated by commas, e.g. det:5@0,3"
            ) from None
        return DeterministicSlowdown(spec, _parse_factor(factor_text, spec), workers)
    if kind == "trace" and rest:
        return TraceSlowdown.from_file(spec, rest)
    raise UserError(
        f"unknown slowdown {spec!r}; use one of: none, prob:K, prob:K@P, det:K@R1,R2, trace:PATH"
    )


def slowdown_kinds() -> list[tuple[str, str]]:
    """(syntax, description) of every slowdown kind, for `bench list`."""
    return [
        ("none", "no injected slowdown"),
        ("prob:K[@P]", "each worker each iteration slowed K times with probability P (1/workers)"),
        ("det:K@R1,R2", "workers R1, R2, ... always K times slower"),
        ("trace:PATH", "CSV worker,t_from,t_to,factor: time-varying slowdowns"),
        ("--pace-ms M", "pacing: a floor of M ms on every iteration's compute (equal workers)"),
    ]
