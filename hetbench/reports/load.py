"""load_runs: every run directory under a path -> one DataFrame row per run.

scan_runs is what load_runs reads through: it sorts the run directories into readable ones,
unreadable ones (a summary, config or event log that does not parse: named, and skipped by every
reader instead of ending the report) and runs in progress (no summary while a writer holds the
results directory's lock: reported by count, not as failures).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from hetbench.core.config import SCHEMA_VERSION
from hetbench.core.lock import describe_holder, writer_of
from hetbench.core.record import read_events, read_run_json, run_dirs
from hetbench.core.rundir import RunDir
from hetbench.core.store import read_jsonl
from hetbench.core.variants import variant_names, with_network
from hetbench.errors import UserError

CONFIG_COLUMNS = ("algorithm", "workload", "workers", "slowdown", "seed", "iterations",
                  "seconds", "pace_ms", "warmup_iterations", "eval_interval_s", "matrix",
                  "algorithm_options", "workload_options", "hosts")


def upgrade(record: dict[str, Any]) -> dict[str, Any]:
    """Bring an older summary's fields up to the current schema (the one place that does)."""
    version = record.get("schema_version", 0)
    if version < 1:
        # Version 0 (pre-release) called throughput 'samples_per_s' and had no compute field.
        if "samples_per_s" in record:
            record["throughput"] = record.pop("samples_per_s")
        record.setdefault("compute", "real")
        record.setdefault("synthetic", False)
    record["schema_version"] = SCHEMA_VERSION
    return record


@dataclass
class Unreadable:
    """A run directory a reader skips, and why (one line)."""
    run_dir: Path
    why: str

    @property
    def run_id(self) -> str:
        return self.run_dir.name

    def line(self) -> str:
        return f"run {self.run_id} skipped: {self.why}"


@dataclass
class Scan:
    """The run directories under a path, sorted by what a reader can do with them."""
    #: (run_dir, config, summary or None when the run has none and no writer runs)
    readable: list[tuple[Path, dict[str, Any], dict[str, Any] | None]] = field(
        default_factory=list)
    unreadable: list[Unreadable] = field(default_factory=list)
    #: Runs without a summary while a writer holds the directory: still running or queued.
    in_progress: list[Path] = field(default_factory=list)
    #: Who holds the results directory's writer lock (None: nobody).
    writer: dict[str, Any] | None = None
    #: run_id -> event or evaluation lines skipped because they do not parse (torn, garbage).
    torn_lines: dict[str, int] = field(default_factory=dict)

    def warnings(self) -> list[str]:
        """One line per run a reader must know about: skipped, or read with lines skipped."""
        lines = [u.line() for u in self.unreadable]
        lines += [f"run {run_id}: {n} unreadable line(s) in its event logs skipped"
                  for run_id, n in self.torn_lines.items()]
        return lines

    def progress_note(self) -> str | None:
        if self.writer is None:
            return None
        return (f"{len(self.in_progress)} run(s) in progress, not reported: "
                f"{describe_holder(self.writer)} is writing to this directory.")


def _read_object(path: Path) -> dict[str, Any]:
    """A JSON file that must hold an object; ValueError (with the file's name) otherwise."""
    try:
        data = read_run_json(path)
    except OSError as exc:
        raise ValueError(f"{path.name} cannot be read ({exc.strerror or exc})") from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{path.name} does not parse ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path.name} holds a {type(data).__name__}, not an object")
    return data


def scan_runs(path: str | Path, events: bool = False) -> Scan:
    """Every run directory under `path`, sorted into readable, unreadable and in progress;
    with `events`, every event log of a finished run is read too (a log that cannot be read
    makes its run unreadable; lines that do not parse are counted in torn_lines)."""
    path = Path(path)
    results_dir = path if not RunDir(path).config.exists() else path.parent
    scan = Scan(writer=writer_of(results_dir))
    for run_dir in run_dirs(path):
        try:
            config = _read_object(RunDir(run_dir).config)
            summary_path = RunDir(run_dir).summary
            summary = _read_object(summary_path) if summary_path.exists() else None
            if summary is not None and "status" not in summary:
                raise ValueError("summary.json has no status")
            if summary is None and scan.writer is not None:
                scan.in_progress.append(run_dir)
                continue
            if events:
                torn = _torn_event_lines(run_dir)
                if torn:
                    scan.torn_lines[run_dir.name] = torn
        except ValueError as exc:
            scan.unreadable.append(Unreadable(run_dir, str(exc)))
            continue
        scan.readable.append((run_dir, config, summary))
    return scan


def _torn_event_lines(run_dir: Path) -> int:
    torn = 0
    for rank, log in RunDir(run_dir).event_logs():
        try:
            _, bad = read_events(run_dir, rank)  # within runs_read_once, read for the rest
        except OSError as exc:
            raise ValueError(f"{log.name} cannot be read ({exc.strerror or exc})") from exc
        torn += bad
    return torn


def load_runs(path: str | Path, scan: Scan | None = None) -> pd.DataFrame:
    """One row per run under `path`: its config, summary and status (incomplete if no summary
    and no writer runs). Unreadable runs and runs in progress are left out (scan_runs says
    which; pass its `scan` to read from it)."""
    rows = []
    scan = scan_runs(path) if scan is None else scan
    for run_dir, config, summary in scan.readable:
        row: dict[str, Any] = {k: config.get(k) for k in CONFIG_COLUMNS}
        row["network_config"] = config.get("network") or {}
        row["timing_config"] = config.get("timing") or {}
        summary = upgrade(summary) if summary is not None else {
            "status": "incomplete", "cause": "no summary.json (its launcher was killed)"}
        row.update(summary)
        row["run_id"] = run_dir.name
        row["run_dir"] = str(run_dir)
        rows.append(row)
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    frame["workers"] = frame["workers"].astype(int)
    # Runs of one algorithm that differ in options (a sweep, tuning trials) are rows of their
    # own everywhere: `algorithm` is the variant name, `algorithm_name` the registered one.
    frame["algorithm_name"] = frame["algorithm"]
    frame["algorithm"] = variant_names(
        zip(frame["algorithm"], frame["workload"], frame["algorithm_options"],
            [with_network(o, n, t) for o, n, t in zip(frame["workload_options"],
                                                      frame["network_config"],
                                                      frame["timing_config"], strict=True)],
            strict=True))
    # `bench sim` marks its runs; real runs carry no flag.
    simulated = frame["simulated"] if "simulated" in frame else pd.Series(False, frame.index)
    frame["simulated"] = simulated.fillna(False).astype(bool)
    return frame


RUN_KEYS = ["run_id", "algorithm", "workload", "workers", "slowdown", "seed"]
EVAL_COLUMNS = ["kind", "wall_s", "iteration", "test_loss", "test_accuracy",
                "consensus_distance", "target", "resolution_iterations", "test_perplexity"]


def load_evals(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per evaluation (eval.jsonl) of every ok run in `runs`, with the run's keys.

    Emulated-compute runs have no test evaluations (they measure throughput only; their
    eval.jsonl holds just the final consensus distance) and add no rows.
    """
    frames = []
    if runs.empty:
        return pd.DataFrame(columns=[*RUN_KEYS, *EVAL_COLUMNS])
    emulated = runs["compute"] == "emulated" if "compute" in runs else False
    for _, run in runs[(runs["status"] == "ok") & ~emulated].iterrows():
        records, _ = read_jsonl(RunDir(run["run_dir"]).evaluations)
        if not records:
            continue
        frame = pd.DataFrame(records).reindex(columns=EVAL_COLUMNS)
        for key in RUN_KEYS:
            frame[key] = run[key]
        frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=[*RUN_KEYS, *EVAL_COLUMNS])
    evals = pd.concat(frames, ignore_index=True)[[*RUN_KEYS, *EVAL_COLUMNS]]
    for column in EVAL_COLUMNS[1:]:
        if column != "target":
            evals[column] = pd.to_numeric(evals[column], errors="coerce")
    return evals


def load_events(run_dir: str | Path) -> pd.DataFrame:
    """Every worker's per-iteration events of one run (events.rank<r>.jsonl), in rank order."""
    run_dir = Path(run_dir)
    frames = []
    for rank, _ in RunDir(run_dir).event_logs():
        records, _ = read_events(run_dir, rank)
        if records:
            frames.append(pd.DataFrame(records))
    if not frames:
        return pd.DataFrame()
    return pd.concat(frames, ignore_index=True)


def load_env(run_dir: str | Path) -> dict[str, Any]:
    """The run's env.json (versions, machine, git), or {} if it has none."""
    path = RunDir(run_dir).env
    try:
        return read_run_json(path)
    except (OSError, ValueError):
        return {}


def select_run_dirs(results_dir: str | Path, wanted: tuple[str, ...] = (),
                    scan: Scan | None = None) -> list[Path]:
    """The run directories under `results_dir` (a results directory or one run's), or those
    whose id starts with one of `wanted`; UserError for a missing directory or an id that
    matches no run or several. With `scan` (scan_runs of the same path), only its readable
    finished runs."""
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise UserError(f"results directory {results_dir} does not exist; run `bench run` first")
    found = run_dirs(results_dir)
    if not found:
        raise UserError(f"no runs under {results_dir}; run `bench run --out {results_dir}` first")
    if scan is not None:  # only runs a reader can read, finished ones
        readable = {run_dir for run_dir, _, summary in scan.readable if summary is not None}
        found = [d for d in found if d in readable]
        if not found:
            raise UserError(f"no readable finished runs under {results_dir} (see the warnings)")
    if not wanted:
        return found
    chosen = []
    for prefix in wanted:
        match = [d for d in found if d.name.startswith(prefix)]
        if len(match) != 1:
            raise UserError(f"--run {prefix!r} matches {len(match)} runs under {results_dir}; "
                            "give one run id (a directory name there)")
        chosen.append(match[0])
    return chosen
