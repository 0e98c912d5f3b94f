"""The local launcher: one subprocess per rank on this machine, watched until the run ends.

The launcher holds the rendezvous store (so there is no free-port race), starts every rank (the
worker of hetbench.harness.worker, forked from a server that holds torch) in its own process
group, and ends the run as soon as any rank fails: the others are killed, so no orphan is left,
and summary.json says which rank failed and why.
"""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hetbench.core.config import RunConfig
from hetbench.core.plugins import PLUGINS_ENV
from hetbench.core.signals import exit_with
from hetbench.harness.launch.base import POLL_S, Progress, record_run
from hetbench.harness.launch.failures import failure_cause, hang_cause

#: After the first rank fails, how long to wait for peers' own error reports before killing them.
GRACE_S = 2.0


class LocalLauncher:
    """Runs one RunConfig on local subprocesses and writes its summary.json."""

    def __init__(self, on_progress: Callable[[int, int], None] | None = None,
                 options: dict[str, Any] | None = None):
        #: Called with (iterations logged so far, iterations expected) while the run trains.
        self.on_progress = on_progress
        del options  # the local launcher takes none (core/launchers.py)

    def run(self, config: RunConfig, run_dir: Path) -> dict[str, Any]:
        import torch.distributed as dist

        run_dir.mkdir(parents=True, exist_ok=True)
        # The store listens on a socket we bind, so it is reachable on bind_host only
        # (TCPStore on its own listens on every interface).
        listener = socket.create_server((config.bind_host, 0))
        port = listener.getsockname()[1]
        store = dist.TCPStore(config.bind_host, port, None, True,
                              timeout=datetime.timedelta(seconds=config.host_timeout_s),
                              wait_for_workers=False, master_listen_fd=listener.detach())
        procs: list[multiprocessing.Process] = []

        def train(services: dict[str, Any]) -> str | None:
            procs.extend(self._spawn(config, run_dir, rank, port)
                         for rank in range(config.world_size))
            return self._watch(config, run_dir, procs)

        try:
            return record_run(config, run_dir, train, cleanup=lambda: _kill_all(procs))
        finally:
            del store  # the store owns (and closes) the listening socket

    def _spawn(self, config: RunConfig, run_dir: Path, rank: int,
               port: int) -> multiprocessing.Process:
        # The plugins by argument: a rank's environment is the forkserver's, which may have
        # started before --plugin set HETBENCH_PLUGINS in this process.
        proc = _forkserver().Process(
            target=_rank_main,
            args=(run_dir, rank, port, os.getpid(), os.environ.get(PLUGINS_ENV, "")),
            name=f"hetbench-rank{rank}")
        proc.start()
        return proc

    def _watch(self, config: RunConfig, run_dir: Path,
               procs: list[multiprocessing.Process]) -> str | None:
        """Wait for all ranks; the failure cause as one line, or None if every rank succeeded."""
        # A backstop for hangs the comm timeout cannot see (a rank stuck outside any
        # collective): the run fails when no rank has logged anything for this long.
        stall_limit_s = config.host_timeout_s + 15
        progress = Progress(config, run_dir, self.on_progress)
        while True:
            codes = [p.exitcode for p in procs]
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                time.sleep(GRACE_S)  # let peers write their own reports before the kill
                return failure_cause(run_dir, {r: p.exitcode for r, p in enumerate(procs)})
            if progress.idle_s() > stall_limit_s:
                return hang_cause(run_dir, procs, config.workers, stall_limit_s)
            if all(c == 0 for c in codes):
                return None
            progress.poll()
            time.sleep(POLL_S)


def _forkserver():
    """A multiprocessing context whose server has imported torch and hetbench once.

    Importing torch costs seconds per process on a small machine; forking each rank from a
    server that already holds it makes start-up nearly free. Nothing in the server touches
    threads, CUDA or torch.distributed, so forking from it is safe.
    """
    ctx = multiprocessing.get_context("forkserver")
    # torch.optim pulls in torch._dynamo on first use: seconds, so the server pays it once.
    ctx.set_forkserver_preload(["torch", "torch._dynamo", "hetbench.harness.worker"])
    return ctx


def start_forkserver_early() -> None:
    """Start the rank server now, in the background: its imports (torch, torch._dynamo: seconds
    of CPU) then overlap the command's own work (expanding and checking the matrix imports
    torch too) instead of following it. The server exits with this process."""
    import atexit
    import multiprocessing.forkserver

    _forkserver()  # its preload list
    multiprocessing.forkserver.ensure_running()
    # A command that stops early (bad input: one line, exit 2) would otherwise leave the server
    # importing for seconds after it: the server reads that its parent is gone only once its
    # imports are done.
    atexit.register(_stop_forkserver, multiprocessing.forkserver._forkserver._forkserver_pid)


def _stop_forkserver(pid: int | None) -> None:
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _rank_main(run_dir: Path, rank: int, port: int, launcher_pid: int,
               plugins: str = "") -> None:
    """Body of a rank's process: its own process group, its own log file, then the worker."""
    # Own process group: Ctrl-C at the terminal reaches only the launcher, which then kills
    # each rank's whole group, so nothing is left behind. Not its own session (setsid): Linux
    # schedules each session as a separate autogroup, and ranks in separate autogroups run
    # slower than ranks sharing one (benchmarks/allreduce_vs_ddp.py shows it).
    os.setpgid(0, 0)
    # A launcher killed outright (SIGKILL, OOM) takes the rank with it instead of leaving it
    # training with half its peers (core.signals says why not PR_SET_PDEATHSIG here).
    exit_with(launcher_pid)
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if plugins:  # the worker loads them (core/plugins.py)
        os.environ[PLUGINS_ENV] = plugins
    else:
        os.environ.pop(PLUGINS_ENV, None)
    from hetbench.harness.worker import log_to_run_dir, main

    log_to_run_dir(run_dir, rank)

    main(["--run-dir", str(run_dir), "--rank", str(rank), "--store-port", str(port)])


def _kill_all(procs: list[multiprocessing.Process]) -> None:
    for p in procs:
        if p.pid is None:
            continue
        for kill in (os.killpg, os.kill):  # the group, or the process if setpgid had not run
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(p.pid, signal.SIGKILL)
    for p in procs:
        p.join(timeout=10)
