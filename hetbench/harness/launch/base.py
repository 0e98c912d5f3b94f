"""What every launcher does around its ranks (record_run), and the progress it watches."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hetbench.core.config import RunConfig
from hetbench.core.identity import KEY as CODE_KEY
from hetbench.core.identity import code_identity
from hetbench.core.record import events_logged, size, write_summary
from hetbench.core.rundir import RunDir
from hetbench.core.signals import interrupted_cause
from hetbench.core.store import ResultsWriteError, environment, write_json_atomic
from hetbench.harness.launch.failures import results_write_failed

#: How often a launcher looks at its ranks and their files.
POLL_S = 0.1


def record_run(config: RunConfig, run_dir: Path, train: Callable[[dict[str, Any]], str | None],
               cleanup: Callable[[], None]) -> dict[str, Any]:
    """What every launcher does around its ranks: config.json and env.json first, the
    algorithm's services for the run's lifetime, `train(services)` (the failure cause, or None),
    `cleanup()` (kill what is left) and summary.json whatever happened; Ctrl-C marks the run
    interrupted and is re-raised.

    A run that failed writing its results (a full disk) raises ResultsWriteError once its
    summary is on record (or saying that it could not be), so the matrix stops there.
    """
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ResultsWriteError(run_dir, exc) from exc
    write_json_atomic(RunDir(run_dir).config, config.to_dict())
    # Which code the ranks run (core/identity.py), beside the machine: the runner reruns a
    # finished run whose code changed since.
    code = code_identity(config)
    write_json_atomic(RunDir(run_dir).env, {**environment(), CODE_KEY: code})
    started = time.time()
    try:
        with config.algorithm_class().services(config, run_dir) as services:
            write_json_atomic(run_dir / "services.json", services)
            try:
                cause = train(services)
            finally:
                cleanup()
        status = "ok" if cause is None else "failed"
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM / SIGHUP (core.signals)
        _record(config, run_dir, "interrupted", interrupted_cause(exc), started, cleanup, code)
        raise
    except Exception as exc:
        status, cause = "failed", f"launcher: {type(exc).__name__}: {exc}"
    summary = _record(config, run_dir, status, cause, started, cleanup, code)
    if status == "failed" and results_write_failed(cause):
        raise ResultsWriteError.because(
            f"{config.label()} failed writing its results: {cause} (on record in "
            f"{run_dir / 'summary.json'})", run_dir)
    return summary


def _record(config: RunConfig, run_dir: Path, status: str, cause: str | None, started: float,
            cleanup: Callable[[], None], code: dict[str, str]) -> dict[str, Any]:
    """cleanup(), then summary.json (with the run's code identity); a summary that cannot be
    written is a ResultsWriteError that says what it would have said."""
    cleanup()
    try:
        return with_code(run_dir, write_summary(config, run_dir, status, cause, started), code)
    except ResultsWriteError as exc:
        outcome = "ended ok" if status == "ok" else f"{status}: {cause}"
        raise ResultsWriteError.because(
            f"{config.label()} {outcome}; and its summary.json could not be written either, "
            f"so nothing is on record ({exc})", run_dir) from exc


def with_code(run_dir: Path, summary: dict[str, Any], code: dict[str, str]) -> dict[str, Any]:
    """summary.json again with the run's code identity (core.record.write_summary knows none)."""
    summary = {**summary, CODE_KEY: code}
    write_json_atomic(RunDir(run_dir).summary, summary)
    return summary


class Progress:
    """What a launcher watches while its ranks train: the bytes they have logged (event logs
    and worker logs). It says how long nothing was written (a stall, once past the limit) and
    reports the event lines so far to `on_progress` (at most twice a second)."""

    def __init__(self, config: RunConfig, run_dir: Path,
                 on_progress: Callable[[int, int], None] | None):
        self.config, self.run_dir, self.on_progress = config, run_dir, on_progress
        self.expected = (config.iterations or 0) * config.workers
        self.logged, self.changed, self.reported = -1, time.time(), 0.0

    @property
    def started(self) -> bool:
        """Has any rank written anything yet?"""
        return self.logged > 0

    def idle_s(self) -> float:
        """Seconds since the ranks last wrote anything (or since watching began)."""
        return time.time() - self.changed

    def poll(self) -> None:
        config, run_dir = self.config, self.run_dir
        logged = sum(size(RunDir(run_dir).events(r)) for r in range(config.workers))
        logged += sum(size(RunDir(run_dir).worker_log(r)) for r in range(config.world_size))
        if logged != self.logged:
            self.logged, self.changed = logged, time.time()
            if self.on_progress and time.time() - self.reported > 0.5:
                self.reported = time.time()
                self.on_progress(events_logged(run_dir, config.workers), self.expected)
