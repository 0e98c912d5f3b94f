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

from hetbench.core.config import LAUNCHERS
from hetbench.errors import UserError
from hetbench.harness.launch.external import MpiLauncher, TorchrunLauncher
from hetbench.harness.launch.local import LocalLauncher


def make_launcher(name: str, on_progress: Callable[[int, int], None] | None = None,
                  options: dict[str, Any] | None = None):
    """The launcher called `name` (RunConfig.launcher); UserError if it cannot run here.
    `options`: the matrix's table for that launcher (`[slurm]`), if it has one."""
    if name == "local":
        return LocalLauncher(on_progress=on_progress)
    if name == "slurm":
        from hetbench.harness.launch.slurm import SlurmLauncher

        return SlurmLauncher(on_progress=on_progress, options=options)
    launchers = {"torchrun": TorchrunLauncher, "mpi": MpiLauncher}
    if name not in launchers:
        raise UserError(f"launcher must be one of {', '.join(LAUNCHERS)}, got {name!r}")
    return launchers[name](on_progress=on_progress, options=options)
