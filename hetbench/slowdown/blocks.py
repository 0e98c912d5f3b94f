"""Building blocks of straggler models: `name(key=value;key=value)` inside a compose: spec.

Each block is an Injector whose factor depends only on (seed, worker, iteration), never on time
(so bench sim reads a whole iteration's factors at once). A block declares its parameters with
their defaults, bounds and the source of the default; `compose:` (slowdown/compose.py) parses
a '+'-joined list of them and multiplies their factors. One module per block:
persistent.py, jitter.py, faulty.py, failslow.py, gpuvar.py, gcpause.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from hetbench.errors import UserError
from hetbench.slowdown.base import Injector
from hetbench.slowdown.draws import first_uniform


@dataclass(frozen=True)
class Param:
    """One parameter of a block: default, inclusive bounds, and what it means."""

    default: float
    low: float
    high: float
    doc: str
    integer: bool = False


def check_params(text: str, name: str, params: dict[str, Param],
                 values: dict[str, str]) -> dict[str, float]:
    """`values` (key -> text) parsed against `params`, defaults filled in; UserError naming
    the parameter, its bounds and meaning otherwise (`text`: the spec, for the message)."""
    unknown = sorted(set(values) - set(params))
    if unknown:
        signature = ";".join(f"{k}={p.default:g}" for k, p in params.items())
        raise UserError(f"slowdown {text!r}: unknown parameter(s) {', '.join(unknown)}; "
                        f"{name} takes {name}({signature})")
    parsed = {}
    for key, param in params.items():
        raw = values.get(key)
        if raw is None:
            parsed[key] = param.default
            continue
        try:
            value = float(raw)
        except ValueError:
            raise UserError(f"slowdown {text!r}: {key}={raw!r} is not a number") from None
        if not (math.isfinite(value) and param.low <= value <= param.high) or (
                param.integer and not value.is_integer()):
            kind = "an integer" if param.integer else "a number"
            raise UserError(f"slowdown {text!r}: {key} must be {kind} in "
                            f"[{param.low:g}, {param.high:g}] ({param.doc}), got {raw}")
        parsed[key] = value
    return parsed


class Block(Injector):
    """A building block; subclasses set `name`, `params`, `salt` and implement `column`."""

    time_free = True
    kind = "block"
    syntax = "block(...)"
    description = "a building block of compose:"
    #: The block's name in a compose spec, and its parameters by name.
    name: ClassVar[str]
    params: ClassVar[dict[str, Param]]
    #: This block's own stream of draws (apart from every other block's of the same seed).
    salt: ClassVar[int]

    @classmethod
    def from_spec(cls, spec: str, args: str, seed: int) -> Block:
        raise UserError(f"slowdown {spec!r}: {cls.name}(...) is a building block; write "
                        f"compose:{cls.name}(...)")

    def __init__(self, spec: str, values: dict[str, float], seed: int, instance: int = 0):
        self.spec = spec
        self.values = values
        self.seed = seed
        #: Two blocks of one kind in one composition draw apart.
        self.stream = self.salt * 16 + instance
        self.workers = 0

    @classmethod
    def build(cls, text: str, values: dict[str, str], seed: int, instance: int) -> Block:
        """The block of `text` (e.g. "jitter(sigma=0.1)") with its parameters parsed and
        checked; UserError naming the parameter otherwise."""
        return cls(text, check_params(text, cls.name, cls.params, values), seed, instance)

    @classmethod
    def signature(cls) -> str:
        return f"{cls.name}({';'.join(f'{k}={p.default:g}' for k, p in cls.params.items())})"

    def validate(self, workers: int) -> None:
        self.workers = workers

    def uniforms(self, workers: np.ndarray, iteration: int) -> np.ndarray:
        """A uniform draw in [0, 1) per worker at `iteration`, keyed by (seed, worker,
        iteration, this block's stream): stateless and replayable."""
        return first_uniform(self.seed, workers, iteration, self.stream)

    def normals(self, workers: np.ndarray, iteration: int) -> np.ndarray:
        """A standard normal draw per worker at `iteration` (inverse CDF of uniforms)."""
        from scipy.special import ndtri  # a fifth of a second to import: only when drawn

        return ndtri(np.clip(self.uniforms(workers, iteration), 1e-300, None))

    def static_uniforms(self, count: int, word: int = 0) -> np.ndarray:
        """Uniform draws fixed for the whole run (one per worker), keyed apart from the
        per-iteration ones by iteration 2**32 - 1 - word."""
        return first_uniform(self.seed, np.arange(count), 0xFFFFFFFF - word, self.stream)

    def factor(self, worker: int, iteration: int, elapsed_s: float) -> float:
        return float(self.column(np.array([worker]), iteration)[0])

    def factors(self, iteration: int, elapsed_s: np.ndarray) -> np.ndarray:
        return self.column(np.arange(len(elapsed_s)), iteration)

    def column(self, workers: np.ndarray, iteration: int) -> np.ndarray:
        """The factors (float64, >= 1) of `workers` at `iteration`."""
        raise NotImplementedError


def chosen_workers(block: Block, count: int) -> np.ndarray:
    """`count` distinct workers of block.workers, drawn once per run from the seed."""
    order = np.argsort(block.static_uniforms(block.workers, word=1), kind="stable")
    return np.sort(order[:count])
