"""Injected faults, for testing that failures end a run cleanly (never for benchmarking).

A spec names what happens to which worker at which iteration:
    crash@R:I   worker R raises an exception before its step at iteration I (or the first after)
    kill@R:I    worker R sends itself SIGKILL at iteration I (no chance to report)
    hang@R:I    worker R sleeps forever at iteration I (peers must time out)
"""

from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass

from hetbench.errors import UserError

_SPEC = re.compile(r"^(crash|kill|hang)@(\d+):(\d+)$")


class InjectedFault(RuntimeError):
    """The exception a `crash` fault raises."""


@dataclass(frozen=True)
class Fault:
    kind: str
    worker: int
    iteration: int

    def maybe_fire(self, worker: int, iteration: int) -> None:
        # >= rather than ==: an algorithm that skips iterations (Hop) may jump past I.
        if worker != self.worker or iteration < self.iteration:
            return
        if self.kind == "crash":
            raise InjectedFault(f"injected crash of worker {worker} at iteration {iteration}")
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        while True:  # hang
            time.sleep(3600)


def parse_fault(spec: str, workers: int) -> Fault | None:
    """Parse a fault spec ('' = none); UserError names the syntax on a bad one."""
    if not spec:
        return None
    match = _SPEC.match(spec.strip())
    if not match:
        raise UserError(f"fault {spec!r}: expected crash@R:I, kill@R:I or hang@R:I "
                        "(worker R at iteration I)")
    fault = Fault(match[1], int(match[2]), int(match[3]))
    if fault.worker >= workers:
        raise UserError(f"fault {spec!r}: worker {fault.worker} does not exist with "
                        f"{workers} workers")
    return fault
