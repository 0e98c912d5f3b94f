"""Why a run failed, in one line, from what its ranks left (error.rank<r>.json, exit codes,
their event logs): shared by every launcher and by `bench summarize`."""

from __future__ import annotations

import contextlib
import multiprocessing
import shutil
import signal
from pathlib import Path

from hetbench.core.record import last_iteration
from hetbench.core.rundir import RunDir
from hetbench.core.store import ResultsWriteError, read_json


def failure_cause(run_dir: Path, codes: dict[int, int | None]) -> str:
    """One line naming the rank, what happened to it and its last iteration.

    `codes` maps every rank to its exit code: None while it runs or when its launcher did not
    say, negative for a signal.
    """
    reports = {}
    for rank in codes:
        path = RunDir(run_dir).error(rank)
        # None, or one cut short (a full disk): as if the rank had not reported.
        with contextlib.suppress(OSError, ValueError):
            reports[rank] = read_json(path)
    # A rank killed by a signal could not report; its peers' reports are symptoms of it.
    # SIGTERM last: it is how torchrun stops the healthy ranks after one failed.
    killed = sorted((r for r, c in codes.items() if c is not None and c < 0 and r not in reports),
                    key=lambda r: (codes[r] == -signal.SIGTERM, r))
    if killed:
        rank = killed[0]
        name = signal.Signals(-codes[rank]).name
        return f"rank {rank} was killed by {name} (last iteration {last_iteration(run_dir, rank)})"
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
            last = {r: last_iteration(run_dir, r) for r in silent}
            hung = min(silent, key=lambda r: -1 if last[r] is None else last[r])
            cause = f"rank {hung} hung (no progress, no error) at iteration {last[hung]}; {cause}"
        return cause[:500]
    failed = [(r, c) for r, c in codes.items() if c not in (None, 0)]
    full = disk_full_note(run_dir)
    if failed:
        rank, code = failed[0]
        # A rank that could not write its results could not write why either.
        return f"rank {rank} exited with code {code} (see worker.rank{rank}.log){full}"
    return f"no rank reported an error; see the launcher's log and worker.rank<r>.log{full}"


#: Below this many free bytes on the results' filesystem, a rank that died without a report is
#: taken to have died of the full disk (its report could not be written).
NEARLY_FULL_BYTES = 1 << 20


def disk_full_note(run_dir: Path) -> str:
    """'; the disk holding the results is full (N bytes free)', or '' when it is not."""
    try:
        free = shutil.disk_usage(run_dir).free
    except OSError:
        return ""
    if free >= NEARLY_FULL_BYTES:
        return ""
    return f"; {DISK_FULL} ({run_dir}: {free} bytes free)"


DISK_FULL = "the disk holding the results is full"


def results_write_failed(cause: str | None) -> bool:
    """Did the run fail because its results could not be written (its cause says so)?"""
    return cause is not None and (ResultsWriteError.__name__ in cause or DISK_FULL in cause)


def _is_comm_symptom(report: dict) -> bool:
    """True for errors a rank gets because a peer failed: resets, timeouts, store waits."""
    message = report.get("message", "").lower()
    kind = report.get("exception", "")
    return kind in ("TimeoutError", "DistStoreError", "DistNetworkError") or any(
        s in message for s in ("connection reset", "connection closed", "timed out", "timeout",
                               "waited", "broken pipe", "gloo", "nccl"))


def hang_cause(run_dir: Path, procs: list[multiprocessing.Process], workers: int,
                limit_s: float) -> str:
    last = {r: last_iteration(run_dir, r) for r in range(workers)}
    running = [r for r, p in enumerate(procs) if p.exitcode is None]
    behind = min(running, key=lambda r: last.get(r) or -1) if running else None
    return (f"no rank made progress for {limit_s:.0f} s; rank {behind} is furthest behind "
            f"(last iteration {last.get(behind)}); ranks still running: {running}")
