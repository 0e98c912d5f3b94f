"""The local launcher: one subprocess per rank on this machine, watched until the run ends.

(torchrun and mpirun: hetbench.harness.launch_external; both share summary.json's writing and
the failure analysis here.)

The launcher holds the rendezvous store (so there is no free-port race), starts every rank as
`python -m hetbench.worker` in its own process group, and ends the run as soon as any rank fails:
the others are killed, so no orphan is left, and summary.json says which rank failed and why.
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

from hetbench.errors import UserError
from hetbench.harness.config import LAUNCHERS, SCHEMA_VERSION, RunConfig
from hetbench.harness.metrics import sync_health, throughput, time_breakdown
from hetbench.harness.signals import exit_with, interrupted_cause
from hetbench.harness.store import (
    SERVICE_CPU_FILE,
    environment,
    read_json,
    read_jsonl,
    write_json_atomic,
)

POLL_S = 0.1
#: After the first rank fails, how long to wait for peers' own error reports before killing them.
GRACE_S = 2.0


def summarize(config: RunConfig, run_dir: Path) -> dict[str, Any]:
    """Throughput, iterations and time breakdown of a finished run, from its files only."""
    events_by_rank, torn = {}, 0
    for rank in range(config.workers):
        events, bad = read_jsonl(run_dir / f"events.rank{rank}.jsonl")
        events_by_rank[rank] = events
        torn += bad
    evals, bad = read_jsonl(run_dir / "eval.jsonl")
    torn += bad
    final = next((e for e in reversed(evals) if e.get("kind") == "final"), {})
    done = done_records(config, run_dir)
    snapshots = [e["consensus_distance"] for e in evals
                 if e.get("kind") == "snapshot" and e.get("consensus_distance") is not None]
    all_events = [e for events in events_by_rank.values() for e in events]
    t_first = min((e["t_start"] for e in all_events), default=0)
    t_last = max((e["t_end"] for e in all_events), default=0)
    return {
        "throughput": throughput(events_by_rank, config.warmup_iterations),
        "samples": sum(e["samples"] for e in all_events),
        "iterations": sum(len(v) for v in events_by_rank.values()),
        "iterations_per_worker": [len(events_by_rank[r]) for r in range(config.workers)],
        "last_iteration_per_worker": [
            events_by_rank[r][-1]["iteration"] if events_by_rank[r] else None
            for r in range(config.workers)],
        "train_wall_s": (t_last - t_first) / 1e9,
        "final_test_loss": final.get("test_loss"),
        "final_test_accuracy": final.get("test_accuracy"),
        "final_consensus_distance": final.get("consensus_distance"),
        "mean_consensus_distance": sum(snapshots) / len(snapshots) if snapshots else None,
        **sync_health(all_events),
        "sync_intended": config.algorithm_class().intended_sync_share(
            config.algorithm_config(), config.workers),
        "averagings_after_training": averagings_after_training(done),
        "torn_lines": torn,
        **time_breakdown(all_events),
        "train_cpu_s": train_cpu_s(run_dir, done),
    }


def done_records(config: RunConfig, run_dir: Path) -> list[dict[str, Any] | None]:
    """Each rank's done.rank<r>.json (None for a rank that has none: it failed)."""
    records: list[dict[str, Any] | None] = []
    for rank in range(config.world_size):
        try:
            records.append(read_json(run_dir / f"done.rank{rank}.json"))
        except (OSError, ValueError):
            records.append(None)
    return records


def train_cpu_s(run_dir: Path, done: list[dict[str, Any] | None]) -> float | None:
    """CPU seconds the run's processes spent training: every rank's (its done record, common
    start to finish) plus its services' (SERVICE_CPU_FILE); None if a rank's is missing (it
    failed, or ran an older hetbench)."""
    total = 0.0
    for record in done:
        cpu = None if record is None else record.get("train_cpu_s")
        if not isinstance(cpu, int | float):
            return None
        total += cpu
    for path in sorted(run_dir.glob(SERVICE_CPU_FILE.format(name="*"))):
        try:
            total += float(read_json(path)["cpu_s"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
    return total


def averagings_after_training(done: list[dict[str, Any] | None]) -> int | None:
    """Averagings the ranks did after their last iteration (finish()), summed; None if no
    rank's algorithm recorded any."""
    values = [r["averagings_after_training"] for r in done
              if r is not None and isinstance(r.get("averagings_after_training"), int)]
    return sum(values) if values else None


def write_summary(config: RunConfig, run_dir: Path, status: str, cause: str | None,
                  started: float, ended: float | None = None) -> dict[str, Any]:
    """summary.json of a run (any launcher): its outcome beside what summarize() measures."""
    summary = {
        "schema_version": SCHEMA_VERSION, "run_id": config.run_id, "status": status,
        "cause": cause, "wall_s": (ended or time.time()) - started,
        "started_at": datetime.datetime.fromtimestamp(started).isoformat(),
        "algorithm": config.algorithm, "workload": config.workload,
        "workers": config.workers, "world_size": config.world_size,
        "slowdown": config.slowdown, "seed": config.seed, "pace_ms": config.pace_ms,
        "compute": config.compute, "synthetic": config.synthetic, "launcher": config.launcher,
        **summarize(config, run_dir),
    }
    write_json_atomic(run_dir / "summary.json", summary)
    return summary


def make_launcher(name: str, on_progress: Callable[[int, int], None] | None = None):
    """The launcher called `name` (RunConfig.launcher); UserError if it cannot run here."""
    if name == "local":
        return LocalLauncher(on_progress=on_progress)
    from hetbench.harness.launch_external import MpiLauncher, TorchrunLauncher

    launchers = {"torchrun": TorchrunLauncher, "mpi": MpiLauncher}
    if name not in launchers:
        raise UserError(f"launcher must be one of {', '.join(LAUNCHERS)}, got {name!r}")
    return launchers[name](on_progress=on_progress)


class LocalLauncher:
    """Runs one RunConfig on local subprocesses and writes its summary.json."""

    def __init__(self, on_progress: Callable[[int, int], None] | None = None):
        #: Called with (iterations logged so far, iterations expected) while the run trains.
        self.on_progress = on_progress

    def run(self, config: RunConfig, run_dir: Path) -> dict[str, Any]:
        import torch.distributed as dist

        run_dir.mkdir(parents=True, exist_ok=True)
        # The store listens on a socket we bind, so it is reachable on bind_host only
        # (TCPStore on its own listens on every interface).
        listener = socket.create_server((config.bind_host, 0))
        port = listener.getsockname()[1]
        store = dist.TCPStore(config.bind_host, port, None, True,
                              timeout=datetime.timedelta(seconds=config.comm_timeout_s),
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
        proc = _forkserver().Process(
            target=_rank_main, args=(run_dir, rank, port, os.getpid()),
            name=f"hetbench-rank{rank}")
        proc.start()
        return proc

    def _watch(self, config: RunConfig, run_dir: Path,
               procs: list[multiprocessing.Process]) -> str | None:
        """Wait for all ranks; the failure cause as one line, or None if every rank succeeded."""
        expected = (config.iterations or 0) * config.workers
        # A backstop for hangs the comm timeout cannot see (a rank stuck outside any
        # collective): the run fails when no rank has logged anything for this long.
        stall_limit_s = config.comm_timeout_s + 15
        last_size, last_change, last_report = -1, time.time(), 0.0
        while True:
            codes = [p.exitcode for p in procs]
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                time.sleep(GRACE_S)  # let peers write their own reports before the kill
                return failure_cause(run_dir, {r: p.exitcode for r, p in enumerate(procs)})
            if time.time() - last_change > stall_limit_s:
                return _hang_cause(run_dir, procs, config.workers, stall_limit_s)
            if all(c == 0 for c in codes):
                return None
            size = sum(_size(run_dir / f"events.rank{r}.jsonl") for r in range(config.workers))
            size += sum(_size(run_dir / f"worker.rank{r}.log") for r in range(len(procs)))
            if size != last_size:
                last_size, last_change = size, time.time()
                if self.on_progress and time.time() - last_report > 0.5:
                    last_report = time.time()
                    self.on_progress(_count_lines(run_dir, config.workers), expected)
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


def _rank_main(run_dir: Path, rank: int, port: int, launcher_pid: int) -> None:
    """Body of a rank's process: its own process group, its own log file, then the worker."""
    # Own process group: Ctrl-C at the terminal reaches only the launcher, which then kills
    # each rank's whole group, so nothing is left behind. Not its own session (setsid): Linux
    # schedules each session as a separate autogroup, and ranks in separate autogroups ran
    # about 10% slower than ranks sharing one (measured, benchmarks/allreduce_vs_ddp.py).
    os.setpgid(0, 0)
    # A launcher killed outright (SIGKILL, OOM) takes the rank with it instead of leaving it
    # training with half its peers (harness.signals says why not PR_SET_PDEATHSIG here).
    exit_with(launcher_pid)
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    from hetbench.harness.worker import log_to_run_dir, main

    log_to_run_dir(run_dir, rank)

    main(["--run-dir", str(run_dir), "--rank", str(rank), "--store-port", str(port)])


def record_run(config: RunConfig, run_dir: Path, train: Callable[[dict[str, Any]], str | None],
               cleanup: Callable[[], None]) -> dict[str, Any]:
    """What every launcher does around its ranks: config.json and env.json first, the
    algorithm's services for the run's lifetime, `train(services)` (the failure cause, or None),
    `cleanup()` (kill what is left) and summary.json whatever happened; Ctrl-C marks the run
    interrupted and is re-raised."""
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / "config.json", config.to_dict())
    write_json_atomic(run_dir / "env.json", environment())
    started = time.time()
    try:
        with config.algorithm_class().services(config.algorithm_config(), config.workers,
                                               run_dir) as services:
            write_json_atomic(run_dir / "services.json", services)
            try:
                cause = train(services)
            finally:
                cleanup()
        status = "ok" if cause is None else "failed"
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM / SIGHUP (harness.signals)
        status, cause = "interrupted", interrupted_cause(exc)
        raise
    except Exception as exc:
        status, cause = "failed", f"launcher: {type(exc).__name__}: {exc}"
    finally:
        cleanup()
        summary = write_summary(config, run_dir, status, cause, started)
    return summary


def failure_cause(run_dir: Path, codes: dict[int, int | None]) -> str:
    """One line naming the rank, what happened to it and its last iteration.

    `codes` maps every rank to its exit code: None while it runs or when its launcher did not
    say, negative for a signal.
    """
    reports = {}
    for rank in codes:
        path = run_dir / f"error.rank{rank}.json"
        if path.exists():
            reports[rank] = read_json(path)
    # A rank killed by a signal could not report; its peers' reports are symptoms of it.
    # SIGTERM last: it is how torchrun stops the healthy ranks after one failed.
    killed = sorted((r for r, c in codes.items() if c is not None and c < 0 and r not in reports),
                    key=lambda r: (codes[r] == -signal.SIGTERM, r))
    if killed:
        rank = killed[0]
        name = signal.Signals(-codes[rank]).name
        return f"rank {rank} was killed by {name} (last iteration {_last_iteration(run_dir, rank)})"
    if reports:
        # The root cause is the earliest report that is not a peer's symptom (a reset connection
        # or a timeout caused by the failed rank).
        rank, report = min(reports.items(),
                           key=lambda item: (_is_comm_symptom(item[1]), item[1]["time_ns"]))
        where = f"in {report['phase']}"
        if report.get("iteration") is not None:
            where += f" at iteration {report['iteration']}"
        message = report["message"].splitlines()[0] if report["message"] else ""
        cause = f"rank {rank} raised {report['exception']} {where}: {message}"
        silent = [r for r, c in codes.items() if c is None and r not in reports]
        if _is_comm_symptom(report) and silent:
            # Peers failing on communication while a rank neither failed nor finished: hung.
            # Of the silent ranks, the one furthest behind (a finished worker waiting for the
            # others is silent too).
            last = {r: _last_iteration(run_dir, r) for r in silent}
            hung = min(silent, key=lambda r: -1 if last[r] is None else last[r])
            cause = f"rank {hung} hung (no progress, no error) at iteration {last[hung]}; {cause}"
        return cause[:500]
    failed = [(r, c) for r, c in codes.items() if c not in (None, 0)]
    if failed:
        rank, code = failed[0]
        return f"rank {rank} exited with code {code} (see worker.rank{rank}.log)"
    return "no rank reported an error; see the launcher's log and worker.rank<r>.log"


def _is_comm_symptom(report: dict) -> bool:
    """True for errors a rank gets because a peer failed: resets, timeouts, store waits."""
    message = report.get("message", "").lower()
    kind = report.get("exception", "")
    return kind in ("TimeoutError", "DistStoreError", "DistNetworkError") or any(
        s in message for s in ("connection reset", "connection closed", "timed out", "timeout",
                               "waited", "broken pipe", "gloo", "nccl"))


def _hang_cause(run_dir: Path, procs: list[multiprocessing.Process], workers: int,
                limit_s: float) -> str:
    last = {r: _last_iteration(run_dir, r) for r in range(workers)}
    running = [r for r, p in enumerate(procs) if p.exitcode is None]
    behind = min(running, key=lambda r: last.get(r) or -1) if running else None
    return (f"no rank made progress for {limit_s:.0f} s; rank {behind} is furthest behind "
            f"(last iteration {last.get(behind)}); ranks still running: {running}")


def _last_iteration(run_dir: Path, rank: int) -> int | None:
    events, _ = read_jsonl(run_dir / f"events.rank{rank}.jsonl")
    return events[-1]["iteration"] if events else None


def _kill_all(procs: list[multiprocessing.Process]) -> None:
    for p in procs:
        if p.pid is None:
            continue
        for kill in (os.killpg, os.kill):  # the group, or the process if setpgid had not run
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(p.pid, signal.SIGKILL)
    for p in procs:
        p.join(timeout=10)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _count_lines(run_dir: Path, workers: int) -> int:
    total = 0
    for rank in range(workers):
        try:
            with (run_dir / f"events.rank{rank}.jsonl").open("rb") as f:
                total += sum(1 for _ in f)
        except FileNotFoundError:
            pass
    return total
