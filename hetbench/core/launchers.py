"""The launchers, each registered once: who starts a run's ranks, where, how the ranks find each
other, what the matrix and the command line hand it, and how a user starts a prepared run by
hand.

The config checks names and --hosts against this table; the runner builds each launcher from
`starts`; the worker joins its world through `joins`; the capacity check, the report's notes
and `bench run --prepare` read the rest. A launcher's code stays in hetbench.harness.launch and
its rendezvous in hetbench.comm.rendezvous; entries name them by dotted path, so this module
(below both) imports neither.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from hetbench.errors import UserError


@dataclass(frozen=True)
class LauncherKind:
    name: str
    #: "module:Class" of the launcher that starts the ranks and watches them.
    starts: str
    #: "module:function" a rank joins its world with (comm.rendezvous: one JoinRequest in).
    joins: str
    #: Starts every rank on this machine unless given --hosts: the capacity check applies.
    on_this_machine: bool
    #: Starts ranks on other hosts (--hosts, through the rsh agent).
    across_hosts: bool
    #: The launcher collects each rank's output into its log itself (else the rank writes its
    #: own worker.rank<r>.log, since the launcher's output interleaves every rank's).
    collects_rank_output: bool
    #: No process of bench's runs on a rank's host: the rank answers the host probes itself.
    rank_answers_probes: bool
    #: The matrix table handed to the launcher as its options (`[slurm]`), if any.
    options_table: str | None
    #: How to start a run that `bench run --prepare` wrote, on each machine ({plugins},
    #: {plugins_x}, {world}, {run_id}, {run_dir} filled in); None: why --prepare is refused.
    prepare_hint: str | None
    no_prepare: str = ""
    #: "module:function" `bench run` calls before anything else when this launcher runs the
    #: matrix (the local launcher's forkserver, started while the matrix is read), or None.
    warm_up: str | None = None

    def load(self, target: str) -> Any:
        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)


_TORCHRUN_HINT = ("on every machine: {plugins}torchrun --nnodes N --nproc-per-node {world}/N "
                  "--rdzv-backend c10d --rdzv-endpoint HOST0:29500 --rdzv-id {run_id} "
                  "--max-restarts 0 -m hetbench.harness.worker --run-dir {run_dir}")
_MPI_HINT = ("on one machine: {plugins}mpirun -n {world} --hostfile HOSTS {plugins_x}"
             "python -m hetbench.harness.worker --run-dir {run_dir}")

KINDS: dict[str, LauncherKind] = {kind.name: kind for kind in (
    LauncherKind("local", "hetbench.harness.launch.local:LocalLauncher",
                 "hetbench.comm.rendezvous:join_local", on_this_machine=True,
                 across_hosts=False, collects_rank_output=True, rank_answers_probes=False,
                 options_table=None, prepare_hint=None,
                 no_prepare="--prepare is for runs that torchrun or mpirun start on several "
                            "machines; add --launcher torchrun or --launcher mpi",
                 warm_up="hetbench.harness.launch.local:start_forkserver_early"),
    LauncherKind("torchrun", "hetbench.harness.launch.external:TorchrunLauncher",
                 "hetbench.comm.rendezvous:join_torchrun", on_this_machine=True,
                 across_hosts=True, collects_rank_output=False, rank_answers_probes=False,
                 options_table=None, prepare_hint=_TORCHRUN_HINT),
    LauncherKind("mpi", "hetbench.harness.launch.external:MpiLauncher",
                 "hetbench.comm.rendezvous:join_mpi", on_this_machine=True,
                 across_hosts=True, collects_rank_output=False, rank_answers_probes=True,
                 options_table=None, prepare_hint=_MPI_HINT),
    LauncherKind("slurm", "hetbench.harness.launch.slurm:SlurmLauncher",
                 "hetbench.comm.rendezvous:join_slurm", on_this_machine=False,
                 across_hosts=False, collects_rank_output=False, rank_answers_probes=True,
                 options_table="slurm", prepare_hint=None,
                 no_prepare="--prepare is for torchrun and mpirun; launcher slurm submits "
                            "each run as a job and watches it itself: drop --prepare"),
)}

LAUNCHERS = tuple(KINDS)
#: What RunConfig.launcher is when a matrix names none.
DEFAULT_LAUNCHER = "local"


def launcher_kind(name: str) -> LauncherKind:
    """The launcher registered as `name`; UserError (one line) naming the others."""
    try:
        return KINDS[name]
    except (KeyError, TypeError):
        raise UserError(f"launcher must be one of {', '.join(LAUNCHERS)}, got {name!r}") from None
