"""Launchers: who starts a run's ranks and watches them until the run ends.

base.py      record_run: config.json, services, the ranks, summary.json whatever happens
local.py     one subprocess per rank on this machine (forked from a server holding torch)
external.py  torchrun and mpirun, on one machine or prepared for several
slurm.py     one SLURM job per run through submitit (an optional extra)
failures.py  the one-line cause of a failed run, from what its ranks left
hostwatch.py whether each host of a run across hosts is still there (probed once a second)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hetbench.core.launchers import KINDS, launcher_kind


def make_launcher(name: str, on_progress: Callable[[int, int], None] | None = None,
                  options: dict[str, Any] | None = None):
    """The launcher called `name` (RunConfig.launcher); UserError if it cannot run here.
    `options`: what the matrix and the command line hand it (launcher_options)."""
    kind = launcher_kind(name)
    return kind.load(kind.starts)(on_progress=on_progress, options=options)


def launcher_options(spec: dict[str, Any], rsh_agent: str | None = None) -> dict[str, dict]:
    """Each launcher's options for make_launcher: its matrix table (`[slurm]`), and the agent
    that starts processes on other hosts for those that start ranks there."""
    options: dict[str, dict] = {}
    for kind in KINDS.values():
        if kind.options_table is not None:
            options[kind.name] = spec.get(kind.options_table)
        elif kind.across_hosts:
            options[kind.name] = {"rsh_agent": rsh_agent}
    return options
