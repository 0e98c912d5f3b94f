"""Worlds that cannot fit on this machine are refused before they start.

A real run started by `bench run` on this machine (launcher local, torchrun or mpi) puts every
rank here. Two bounds, either of which refuses the matrix in one line (UserError) unless the user
passes --allow-oversubscribe:

- memory: every rank's estimated private memory plus the launcher's, plus HEADROOM_MB, must fit
  in what the host (or its cgroup) has available. A rank shares torch's pages with the forkserver
  it was forked from, so what each more rank costs is its private memory, not its RSS.
- cores: at most RANKS_PER_CORE ranks per core. Past that, ranks time-slice so finely that what
  is measured is the scheduler, not the algorithm (and the gloo timeouts fire).

docs/matrices.md ("Worlds that cannot fit") gives the measurements behind the constants.
"""

from __future__ import annotations

import os
from pathlib import Path

from hetbench.core.config import RunConfig
from hetbench.core.launchers import launcher_kind
from hetbench.errors import UserError

#: Private memory (MB) of one rank at the workload's default options with real compute,
#: measured (Private_Clean + Private_Dirty of /proc/PID/smaps_rollup, mid-run, allreduce).
MEASURED_RANK_MB = {"mlp-digits": 33, "resnet18": 1160}

#: What any rank holds beside its workload: the interpreter's own pages after the fork, gloo's
#: buffers (mlp-digits' rank, whose model is 0.1 MB).
BASE_RANK_MB = 33

#: Parameters (millions) of workloads not measured: their real-compute footprint is estimated
#: from resnet18's per parameter (activations scale with the model, roughly), an emulated one
#: (no activations) as params, gradients, momentum and one copy, 4 bytes each.
PARAMS_M = {"resnet18": 11.7, "resnet50": 23.5, "resnet200": 62.6, "vgg16": 134.0}

#: The launcher (`bench`) and the forkserver that holds torch: private memory, measured.
LAUNCHER_MB = 430

#: Memory left free beside the estimate (page cache, the estimate's error, other processes).
HEADROOM_MB = 1024

#: More ranks than this per core on one machine are refused (see the module docstring).
RANKS_PER_CORE = 32


def rank_mb(config: RunConfig) -> float:
    """Estimated private memory of one rank of `config` (MB)."""
    workload = config.workload
    if config.compute == "emulated":
        params_m = PARAMS_M.get(workload, 0.0)
        return BASE_RANK_MB + params_m * 4 * 4
    if workload in MEASURED_RANK_MB:
        return MEASURED_RANK_MB[workload]
    if workload in PARAMS_M:
        return BASE_RANK_MB + PARAMS_M[workload] * (
            (MEASURED_RANK_MB["resnet18"] - BASE_RANK_MB) / PARAMS_M["resnet18"])
    return BASE_RANK_MB  # a plugin or small workload: at least what every rank holds


def available_mb() -> float | None:
    """Memory this process may still use (MB): MemAvailable, or less under a cgroup limit."""
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) / 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = Path("/sys/fs/cgroup/memory.current").read_text().strip()
        if limit != "max":
            found.append((int(limit) - int(used)) / 2**20)
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def world_problem(config: RunConfig, cores: int, memory_mb: float | None) -> str | None:
    """Why `config`'s world cannot run on this machine (None when it fits)."""
    if not launcher_kind(config.launcher).on_this_machine or config.hosts:
        return None
    ranks = config.world_size
    problems = []
    if ranks > RANKS_PER_CORE * cores:
        problems.append(f"{ranks} ranks on {cores} core(s) exceed {RANKS_PER_CORE} ranks per "
                        "core")
    need_mb = LAUNCHER_MB + ranks * rank_mb(config) + HEADROOM_MB
    if memory_mb is not None and need_mb > memory_mb:
        problems.append(f"{ranks} ranks of {config.workload} need about {_size(need_mb)} of "
                        f"memory ({rank_mb(config):.0f} MB each, with {HEADROOM_MB} MB "
                        f"headroom) and {_size(memory_mb)} is available")
    if not problems:
        return None
    return (f"{config.label()} cannot run on this machine: {' and '.join(problems)}; "
            "simulate it (`bench sim` with the same flags), emulate its compute on a network "
            "preset (workload option compute = \"emulated\" with --network, docs/network.md), "
            "or run it on several machines (--launcher slurm or torchrun, "
            "docs/multi-node.md); --allow-oversubscribe starts it anyway")


def check_worlds_fit(configs: list[RunConfig], allow_oversubscribe: bool = False) -> None:
    """UserError (one line, the first run that does not fit) unless every world fits here."""
    if allow_oversubscribe:
        return
    cores, memory_mb = os.cpu_count() or 1, available_mb()
    for config in configs:
        problem = world_problem(config, cores, memory_mb)
        if problem:
            raise UserError(problem)


def _size(mb: float) -> str:
    return f"{mb / 1024:.1f} GB" if mb >= 1024 else f"{mb:.0f} MB"
