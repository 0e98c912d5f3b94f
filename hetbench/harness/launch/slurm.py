"""`bench run --launcher slurm`: each run is one SLURM job, submitted and watched through
submitit (an optional extra: pip install 'hetbench[slurm]').

The job has `nodes` nodes and world_size / nodes tasks per node; each task starts one rank
(hetbench.harness.worker, in a process of its own) with RANK / WORLD_SIZE / LOCAL_RANK from
submitit's JobEnvironment, and the ranks meet through a store whose address rank 0 writes into
the run directory (hetbench.comm.rendezvous.join_slurm). So the results directory must be on a
filesystem every node sees, as SLURM clusters have. `bench run` stays on the submitting machine
for the run's lifetime: it holds the algorithm's services (the Group Generator: use
`bind_host = "0.0.0.0"` so the nodes can reach it), shows progress from the run directory, and
writes summary.json; Ctrl-C cancels the job.

A matrix's `[slurm]` table sets the job (none of it is part of the run's id):

    [slurm]
    nodes = 2                 # at most; ranks fill nodes in order (5 on nodes = 3: 2, 2, 1)
    partition = "gpu"
    timeout_min = 60
    cpus_per_task = 4
    gpus_per_node = 0
    account = "my-account"
    exclude = "node7,node9"   # nodes the job must not use (sbatch --exclude)
    setup = ["module load cuda"]   # shell lines before each task
    cluster = "slurm"         # "local": submitit's local executor, the same job on this machine

`cluster = "local"` is how the tests run it, and a way to try a matrix before queueing it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hetbench.core.config import RunConfig
from hetbench.core.plugins import PLUGINS_ENV
from hetbench.core.record import rank_hosts
from hetbench.errors import UserError
from hetbench.harness.launch.base import POLL_S, Progress, record_run
from hetbench.harness.launch.external import STARTUP_S, finished_ranks, reported_ranks
from hetbench.harness.launch.failures import failure_cause
from hetbench.harness.launch.hostwatch import HostWatch, rank_probe_ports

#: The `[slurm]` table's keys, their types and defaults.
OPTIONS: dict[str, tuple[type, Any]] = {
    "cluster": (str, "slurm"), "nodes": (int, 1), "partition": (str, ""),
    "timeout_min": (int, 60), "cpus_per_task": (int, 1), "gpus_per_node": (int, 0),
    "account": (str, ""), "exclude": (str, ""), "setup": (list, []),
}
CLUSTERS = ("slurm", "local")
#: Why a pending job will never start (squeue's reason): its request exceeds what the
#: partition or the account allows. A job pending for resources or priority just waits.
NEVER_STARTS = {"PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "BadConstraints",
                "AccountNotAllowed", "QOSMaxCpuPerJobLimit", "QOSMaxNodePerJobLimit",
                "InvalidAccount", "InvalidQOS"}
#: How often a pending job's reason is asked (squeue).
PENDING_CHECK_S = 5.0


def pending_reason(job_id: str) -> str | None:
    """squeue's reason for a pending job, or None when squeue does not say."""
    try:
        done = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%r"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def job_shape(config: RunConfig, options: dict[str, Any]) -> str:
    world, nodes = config.world_size, options["nodes"]
    per_node = -(-world // nodes)
    return (f"{-(-world // per_node)} node(s), up to {per_node} task(s) each, "
            f"{options['cpus_per_task']} CPU(s) a task, {world} tasks in all")


def parse_options(table: dict[str, Any] | None) -> dict[str, Any]:
    """The `[slurm]` table with defaults filled in; UserError, one line, for what is wrong."""
    table = dict(table or {})
    unknown = sorted(set(table) - set(OPTIONS))
    if unknown:
        raise UserError(f"[slurm]: unknown key(s) {', '.join(unknown)}; keys are: "
                        f"{', '.join(sorted(OPTIONS))}")
    options = {}
    for key, (kind, default) in OPTIONS.items():
        value = table.get(key, default)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise UserError(f"[slurm]: {key} must be {kind.__name__}, got {value!r}")
        options[key] = value
    if options["cluster"] not in CLUSTERS:
        raise UserError(f"[slurm]: cluster must be one of {', '.join(CLUSTERS)}, got "
                        f"{options['cluster']!r}")
    if options["nodes"] < 1:
        raise UserError(f"[slurm]: nodes must be >= 1, got {options['nodes']}")
    return options


def rank_task(run_dir: str, plugins: str = "") -> int:
    """One task of the job: start this task's rank and return its exit code (what submitit
    calls on the node; a module-level function, so that it pickles by name). `plugins`:
    HETBENCH_PLUGINS of the submitting bench, passed as an argument because a job's
    environment is what sbatch exports, which a cluster may restrict."""
    import submitit

    job = submitit.JobEnvironment()
    env = {**os.environ, "RANK": str(job.global_rank), "WORLD_SIZE": str(job.num_tasks),
           "LOCAL_RANK": str(job.local_rank), "HETBENCH_JOB_ID": str(job.job_id),
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    if plugins:
        env[PLUGINS_ENV] = plugins
    # A process of its own: the worker redirects its output into the run directory and ends
    # with os._exit, which must not take submitit's task (and its result file) with it.
    return subprocess.run([sys.executable, "-m", "hetbench.harness.worker",
                           "--run-dir", run_dir], env=env, check=False).returncode


class SlurmLauncher:
    """Runs one RunConfig as one SLURM job (see the module docstring)."""

    name = "slurm"

    def __init__(self, on_progress: Callable[[int, int], None] | None = None,
                 options: dict[str, Any] | None = None):
        try:
            import submitit  # noqa: F401
        except ImportError:
            raise UserError("launcher slurm needs submitit: pip install 'hetbench[slurm]'"
                            ) from None
        self.on_progress = on_progress
        self.options = parse_options(options)
        if self.options["cluster"] == "slurm" and not shutil.which("sbatch"):
            raise UserError("launcher slurm: no sbatch here (not a SLURM login node); set "
                            "[slurm] cluster = \"local\" to run the same jobs on this machine")

    def run(self, config: RunConfig, run_dir: Path) -> dict[str, Any]:
        jobs: list[Any] = []

        def train(services: dict[str, Any]) -> str | None:
            world, nodes = config.world_size, self.options["nodes"]
            # Filled in order, as --hosts fills hosts: 5 ranks on nodes = 3 run as 2, 2, 1.
            per_node = -(-world // nodes)
            used = -(-world // per_node)
            if used * per_node != world and self.options["cluster"] == "local":
                return (f"launcher slurm: {world} ranks (workers + server ranks) fill {used} "
                        f"nodes of {per_node} unevenly, and submitit's local executor starts "
                        f"as many tasks on every node; set nodes to a divisor of {world}")
            jobs.append(self._submit(config, run_dir, per_node, used))
            return self._watch(config, run_dir, jobs[0])

        def cleanup() -> None:
            for job in jobs:
                if not job.done():
                    job.cancel(check=False)

        return record_run(config, run_dir, train, cleanup)

    def _submit(self, config: RunConfig, run_dir: Path, tasks_per_node: int, nodes: int):
        import submitit

        o = self.options
        executor = submitit.AutoExecutor(folder=run_dir / "slurm", cluster=o["cluster"])
        parameters: dict[str, Any] = {
            "name": f"hetbench-{config.run_id}", "nodes": nodes,
            "tasks_per_node": tasks_per_node, "timeout_min": o["timeout_min"]}
        if o["cluster"] == "slurm":
            parameters.update(cpus_per_task=o["cpus_per_task"])
            if nodes * tasks_per_node != config.world_size:  # the last node takes fewer
                parameters["slurm_additional_parameters"] = {"ntasks": config.world_size}
            if o["gpus_per_node"]:
                parameters["gpus_per_node"] = o["gpus_per_node"]
            for key in ("partition", "account", "exclude"):
                if o[key]:
                    parameters[f"slurm_{key}"] = o[key]
            if o["setup"]:
                parameters["slurm_setup"] = o["setup"]
        executor.update_parameters(**parameters)
        return executor.submit(rank_task, str(run_dir), os.environ.get(PLUGINS_ENV, ""))

    def _watch(self, config: RunConfig, run_dir: Path, job) -> str | None:
        """Wait for the job; the failure cause, or None when every rank finished."""
        # The nodes' ranks answer probes (hostwatch.py): a node lost fails the run at once,
        # named, instead of after SLURM's own SlurmdTimeout (300 s by default).
        watch = (HostWatch(rank_probe_ports(run_dir, config.world_size), gone="its ranks")
                 if self.options["cluster"] == "slurm" else None)
        try:
            if watch is not None:
                watch.start()
            return self._wait(config, run_dir, job, watch)
        finally:
            if watch is not None:
                watch.stop()

    def _wait(self, config: RunConfig, run_dir: Path, job, watch) -> str | None:
        stall_limit_s = config.host_timeout_s + 15
        progress = Progress(config, run_dir, self.on_progress)
        running_since, asked = None, 0.0
        while not job.done():
            if watch is not None and watch.lost:
                job.cancel(check=False)
                return (watch.cause(rank_hosts(run_dir, config.world_size),
                                    reported_ranks(run_dir, config.world_size))
                        + f" (SLURM job {job.job_id} cancelled)")
            # A queued job is not stalled: the backstop counts from the job's start.
            if running_since is None and job.state not in ("PENDING", "UNKNOWN", "REQUEUED"):
                running_since = time.time()
            if (running_since is None and self.options["cluster"] == "slurm"
                    and time.time() - asked > PENDING_CHECK_S):
                asked = time.time()
                if (reason := pending_reason(job.job_id)) in NEVER_STARTS:
                    return (f"SLURM job {job.job_id} can never start: it is pending with reason "
                            f"{reason} (it asks for {job_shape(config, self.options)}; "
                            f"`scontrol show job {job.job_id}` says more)")
            if running_since is not None:
                limit_s = stall_limit_s + (0 if progress.started else STARTUP_S)
                idle_s = min(progress.idle_s(), time.time() - running_since)
                if idle_s > limit_s:
                    return (f"no rank made progress for {limit_s:.0f} s (SLURM job "
                            f"{job.job_id}, state {job.state}); submitit's logs are in "
                            f"{run_dir / 'slurm'}")
            progress.poll()
            time.sleep(POLL_S)
        done = finished_ranks(run_dir, config.world_size)
        if len(done) == config.world_size:
            return None
        try:
            codes = dict(enumerate(job.results()))
        except Exception as exc:  # a task that died, timed out or was cancelled
            codes = {}
            if not reported_ranks(run_dir, config.world_size):
                last = str(exc).strip().splitlines()[-1:] or [""]
                return (f"SLURM job {job.job_id} ended {job.state} before every rank finished: "
                        f"{type(exc).__name__}: {last[0]}"[:500])
        return failure_cause(run_dir, {r: codes.get(r, 0 if r in done else None)
                                       for r in range(config.world_size)})
