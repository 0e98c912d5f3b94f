"""Running a matrix: resume finished runs, keep failed attempts, move on after a failure.

A finished run is resumed (skipped) only when its code is the current one (core/identity.py):
one whose algorithm's or workload's code changed since it ran is set aside like an unfinished
attempt and run again, so results follow the code while the run id stays the config's hash.

Every run happens under the results directory's writer lock (core.lock), so a run directory
without a summary found here was left by a launcher that is gone: no other process can be
writing it, and setting it aside is safe.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetbench.core.config import RunConfig
from hetbench.core.identity import code_change, code_identity, recorded_identity
from hetbench.core.launchers import launcher_kind
from hetbench.core.lock import results_lock
from hetbench.core.rundir import RunDir
from hetbench.core.store import ResultsWriteError, read_json
from hetbench.errors import UserError
from hetbench.harness.launch import make_launcher
from hetbench.harness.launch.capacity import check_worlds_fit


@dataclass
class RunOutcome:
    config: RunConfig
    run_dir: Path
    summary: dict[str, Any]
    skipped: bool


def finished_summary(run_dir: Path) -> dict[str, Any] | None:
    """The summary of a run that finished successfully, or None."""
    path = RunDir(run_dir).summary
    if not path.exists():
        return None
    try:
        summary = read_json(path)
    except ValueError:
        return None
    return summary if summary.get("status") == "ok" else None


def stale_code(run_dir: Path, summary: dict[str, Any], config: RunConfig) -> str | None:
    """Why the finished run in `run_dir` no longer stands for `config`'s current code (one
    phrase, core.identity.code_change), or None when it does."""
    env = None
    if not isinstance(summary.get("code"), dict):
        try:
            env = read_json(RunDir(run_dir).env)
        except (OSError, ValueError):
            env = None
    return code_change(recorded_identity(summary, env), code_identity(config))


def finished_current(run_dir: Path, config: RunConfig,
                     force: bool) -> tuple[dict[str, Any] | None, str | None]:
    """(the summary of a finished run to skip, None) or (None, why the directory is run again:
    None when there is nothing there, or nothing finished)."""
    summary = finished_summary(run_dir)
    if summary is None:
        return None, None
    if force:
        return None, "--force"
    why = stale_code(run_dir, summary, config)
    return (None, why) if why else (summary, None)


def set_aside(run_dir: Path, out_dir: Path, why: str | None = None) -> str:
    """Move an earlier attempt to out/.attempts/ so a rerun starts clean and nothing is lost;
    returns why it is run again (`why` for a finished one: --force, its code changed) and
    where it went, for the user."""
    try:
        summary = read_json(RunDir(run_dir).summary)
        what = f"{summary.get('status')}: {summary.get('cause')}"
    except (OSError, ValueError):
        what = "no summary.json: its launcher was killed (or died) while it ran"
    if why == "--force":
        what = "--force reruns a finished run"
    elif why is None:
        what = f"an earlier attempt did not finish ({what})"
    else:
        what = why
    attempts = out_dir / ".attempts"
    where = attempts / f"{run_dir.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        attempts.mkdir(parents=True, exist_ok=True)
        shutil.move(str(run_dir), where)
    except OSError as exc:
        raise ResultsWriteError(where, exc) from exc
    return f"{what}; the earlier one kept as {where}"


def check_real_runs(configs: list[RunConfig]) -> None:
    """What only `bench sim` plays, refused for real runs in one line before anything starts
    (bench run, tune and reproduce all come through here or run_matrix)."""
    if any(config.learn for config in configs):
        raise UserError("learn = true asks `bench sim` to train its simulated workers; real "
                        "runs always train: drop it from the matrix for bench run")


def check_runnable(configs: list[RunConfig], allow_oversubscribe: bool = False,
                   fit: bool = True) -> None:
    """Every refusal of a matrix before anything starts, one line each: what only bench sim
    plays, and (`fit`; not for runs prepared to start elsewhere) a world that cannot fit on
    this machine (launch.capacity). The commands call it before a dry run too, then tell
    run_matrix it is done (`checked`)."""
    check_real_runs(configs)
    if fit:
        check_worlds_fit(configs, allow_oversubscribe)


def run_matrix(configs: list[RunConfig], out_dir: Path, force: bool = False,
               on_start: Callable[[RunConfig], None] | None = None,
               on_done: Callable[[RunOutcome], None] | None = None,
               on_progress: Callable[[int, int], None] | None = None,
               on_set_aside: Callable[[RunConfig, str], None] | None = None,
               launcher_options: dict[str, dict] | None = None,
               allow_oversubscribe: bool = False, checked: bool = False,
               ) -> list[RunOutcome]:
    """Run each config not finished yet; `launcher_options`: each launcher's options by name
    (harness.launch.launcher_options). Holds `out_dir`'s writer lock throughout (the caller's,
    if it holds it already; else ResultsDirBusy when another process does). A world that
    cannot fit on this machine, or asks for what only bench sim plays, is refused before
    anything starts (check_runnable), unless the caller has `checked` already."""
    if not checked:
        check_runnable(configs, allow_oversubscribe)
    with results_lock(out_dir, "bench run"):
        return _run_locked(configs, out_dir, force, on_start, on_done, on_progress,
                           on_set_aside, launcher_options)


def _run_locked(configs, out_dir, force, on_start, on_done, on_progress, on_set_aside,
                launcher_options) -> list[RunOutcome]:
    outcomes = []
    # Made before the first run: a launcher that cannot work here (no mpirun) is bad input.
    launchers = {name: make_launcher(name, on_progress=on_progress,
                                     options=(launcher_options or {}).get(name))
                 for name in dict.fromkeys(c.launcher for c in configs)}
    for config in configs:
        launcher = launchers[config.launcher]
        run_dir = out_dir / config.run_id
        summary, why = finished_current(run_dir, config, force)
        if summary is not None:
            outcome = RunOutcome(config, run_dir, summary, skipped=True)
        else:
            if run_dir.exists():
                what = set_aside(run_dir, out_dir, why)
                if on_set_aside:
                    on_set_aside(config, what)
            if on_start:
                on_start(config)
            try:
                summary = launcher.run(config, run_dir)
            except ResultsWriteError as exc:
                # The disk is full (or gone): every later run would fail the same way.
                left = len(configs) - len(outcomes) - 1
                raise ResultsWriteError.because(
                    f"{exc}; the matrix stops here ({left} run(s) not started)",
                    exc.path) from exc
            outcome = RunOutcome(config, run_dir, summary, skipped=False)
        outcomes.append(outcome)
        if on_done:
            on_done(outcome)
    return outcomes


def prepare_matrix(configs: list[RunConfig], out_dir: Path, force: bool = False,
                   checked: bool = False) -> list[tuple[RunConfig, Path, bool]]:
    """Run directories for torchrun / mpirun to start on several machines (multi-node):
    (config, run_dir, already finished) per run; earlier unfinished attempts are set aside.
    What only bench sim plays is refused first, unless the caller has `checked` already (as
    run_matrix)."""
    from hetbench.harness.launch.external import prepare

    if not checked:
        check_real_runs(configs)
    refused = [c for c in configs if launcher_kind(c.launcher).prepare_hint is None]
    if refused:
        prepare(refused[0], out_dir / refused[0].run_id)  # its one line, before any change
    with results_lock(out_dir, "bench run --prepare"):
        return _prepare_locked(configs, out_dir, force, prepare)


def _prepare_locked(configs, out_dir, force, prepare) -> list[tuple[RunConfig, Path, bool]]:
    prepared = []
    for config in configs:
        run_dir = out_dir / config.run_id
        summary, why = finished_current(run_dir, config, force)
        if summary is not None:
            prepared.append((config, run_dir, True))
            continue
        if run_dir.exists():
            set_aside(run_dir, out_dir, why)
        prepare(config, run_dir)
        prepared.append((config, run_dir, False))
    return prepared
