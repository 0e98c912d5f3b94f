"""Slowdown injectors: how a worker is made slower than its peers.

A spec string names the injector and its parameters; it is parsed before any process starts and
recorded in the run's config so a run can be replayed:

    none               no injected slowdown
    prob:K             each worker, each iteration, slowed by factor K with probability 1/workers
    prob:K@P           ... with probability P
    det:K@R1,R2        workers R1 and R2 are always K times slower
    trace:PATH         time-varying factors from a CSV file of worker,t_from,t_to,factor
"""

from hetbench.slowdown.base import Injector, parse_slowdown, slowdown_kinds

__all__ = ["Injector", "parse_slowdown", "slowdown_kinds"]
