"""Slowdown injectors: how a worker is made slower than its peers.

A spec string names the injector and its parameters; it is parsed before any process starts and
recorded in the run's config so a run can be replayed:

    none               no injected slowdown
    prob:K             each worker, each iteration, slowed by factor K with probability 1/workers
    prob:K@P           ... with probability P
    det:K@R1,R2        workers R1 and R2 are always K times slower
    trace:PATH         time-varying factors from a CSV file of worker,t_from,t_to,factor
    replay:PATH        a real job's stragglers from a compute table (slowdown/replay.py)
    compose:B(..)+B..  a straggler model from building blocks (slowdown/compose.py)
    preset:NAME        a straggler model from the literature (slowdown/presets.py)
    net:K@R1,R2        (and netprob, nettrace, netfailslow) slow NICs instead of compute,
                       under a network model: slowdown/network.py, slowdown/netfailslow.py
"""

from hetbench.errors import UserError
from hetbench.slowdown.base import Injector
from hetbench.slowdown.compose import ComposedSlowdown
from hetbench.slowdown.deterministic import DeterministicSlowdown
from hetbench.slowdown.netfailslow import NetFailSlowSlowdown
from hetbench.slowdown.network import NetProbSlowdown, NetSlowdown, NetTraceSlowdown
from hetbench.slowdown.none import NoSlowdown
from hetbench.slowdown.presets import PresetSlowdown, preset_lines
from hetbench.slowdown.probabilistic import ProbabilisticSlowdown
from hetbench.slowdown.replay import ReplaySlowdown
from hetbench.slowdown.trace import TraceSlowdown

#: Every kind, by its spec prefix; a new kind is a module with an Injector subclass, added here.
KINDS: dict[str, type[Injector]] = {cls.kind: cls for cls in (
    NoSlowdown, ProbabilisticSlowdown, DeterministicSlowdown, TraceSlowdown, NetSlowdown,
    NetProbSlowdown, NetTraceSlowdown, NetFailSlowSlowdown, ReplaySlowdown, ComposedSlowdown,
    PresetSlowdown)}

__all__ = ["KINDS", "Injector", "parse_slowdown", "slowdown_kinds"]


def parse_slowdown(spec: str, seed: int = 0) -> Injector:
    """The injector of a spec string (the one parser: RunConfig, bench sim's fits and bench list
    go through it); UserError naming every kind's syntax when the kind is unknown."""
    spec = spec.strip()
    kind, colon, args = spec.partition(":")
    cls = KINDS.get(kind)
    if cls is None or (colon and not args) or (not colon and kind != "none"):
        raise UserError(f"unknown slowdown {spec!r}; use one of: "
                        f"{', '.join(c.syntax for c in KINDS.values())}")
    return cls.from_spec(spec, args, seed)


def slowdown_kinds() -> list[tuple[str, str]]:
    """(syntax, description) of every slowdown kind, and of pacing, for `bench list`."""
    return [*((cls.syntax, cls.description) for cls in KINDS.values()), *preset_lines(),
            ("--pace-ms M", "pacing: a floor of M ms on every iteration's compute (equal workers)")]
