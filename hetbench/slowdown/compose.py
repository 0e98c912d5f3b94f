"""compose:BLOCK+BLOCK+...: straggler models built from blocks (slowdown/blocks.py).

    compose:persistent(frac=0.1;k=1.27)+jitter(sigma=0.094)+gc(every=50;pause=0.5)

A worker's factor at an iteration is the product of its blocks' factors (independent causes
stack: a slow GPU that also drew a long batch is slow twice over). Parameters are separated by
';' (',' too, in a matrix file: on the command line --slowdown splits at commas); a parameter
left out takes its default (`bench list` shows them). Every block draws from its own stream of
the run's seed, so a composition replays exactly.
"""

from __future__ import annotations

import re

import numpy as np

from hetbench.errors import UserError
from hetbench.slowdown.base import Injector
from hetbench.slowdown.blocks import Block
from hetbench.slowdown.failslow import FailSlowBlock
from hetbench.slowdown.faulty import FaultyBlock
from hetbench.slowdown.gcpause import GcPauseBlock
from hetbench.slowdown.gpuvar import GpuVarBlock
from hetbench.slowdown.jitter import JitterBlock
from hetbench.slowdown.persistent import PersistentBlock

#: Every block, by its name in a compose spec.
BLOCKS: dict[str, type[Block]] = {cls.name: cls for cls in (
    PersistentBlock, JitterBlock, FaultyBlock, FailSlowBlock, GpuVarBlock, GcPauseBlock)}

_BLOCK = re.compile(r"^\s*([a-z]+)\s*(?:\((.*)\))?\s*$")


def parse_blocks(spec: str, text: str, seed: int) -> list[Block]:
    """The blocks of `text` ("jitter(sigma=0.1)+gc"); UserError naming the bad one."""
    blocks: list[Block] = []
    counts: dict[str, int] = {}
    for part in text.split("+"):
        match = _BLOCK.match(part)
        cls = BLOCKS.get(match.group(1)) if match else None
        if cls is None:
            raise UserError(f"slowdown {spec!r}: unknown block {part.strip()!r}; blocks: "
                            f"{', '.join(b.signature() for b in BLOCKS.values())}")
        values: dict[str, str] = {}
        for item in re.split(r"[;,]", match.group(2) or ""):
            if not item.strip():
                continue
            key, eq, value = item.partition("=")
            if not eq or not key.strip() or not value.strip():
                raise UserError(f"slowdown {spec!r}: block {part.strip()!r}: write parameters "
                                f"as key=value, e.g. {cls.signature()}")
            if key.strip() in values:
                raise UserError(f"slowdown {spec!r}: block {part.strip()!r} sets "
                                f"{key.strip()} twice")
            values[key.strip()] = value.strip()
        instance = counts[cls.name] = counts.get(cls.name, -1) + 1
        blocks.append(cls.build(part.strip(), values, seed, instance))
    return blocks


class ComposedSlowdown(Injector):
    time_free = True
    kind = "compose"
    syntax = "compose:B(k=v;..)+B.."
    description = ("straggler model from building blocks, factors multiplied; blocks: "
                   + ", ".join(cls.signature() for cls in BLOCKS.values()))

    @classmethod
    def from_spec(cls, spec: str, args: str, seed: int) -> ComposedSlowdown:
        return cls(spec, parse_blocks(spec, args, seed))

    def __init__(self, spec: str, blocks: list[Block]):
        self.spec = spec
        self.blocks = blocks

    def validate(self, workers: int) -> None:
        for block in self.blocks:
            block.validate(workers)

    def factor(self, worker: int, iteration: int, elapsed_s: float) -> float:
        return float(self.factors_of(np.array([worker]), iteration)[0])

    def factors(self, iteration: int, elapsed_s: np.ndarray) -> np.ndarray:
        return self.factors_of(np.arange(len(elapsed_s)), iteration)

    def factors_of(self, workers: np.ndarray, iteration: int) -> np.ndarray:
        out = np.ones(len(workers))
        for block in self.blocks:
            out *= block.column(workers, iteration)
        return out
