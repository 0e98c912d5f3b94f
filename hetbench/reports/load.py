"""load_runs: every run directory under a path -> one DataFrame row per run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from hetbench.core.config import SCHEMA_VERSION
from hetbench.core.record import run_dirs
from hetbench.core.store import read_json, read_jsonl
from hetbench.core.variants import variant_names, with_network
from hetbench.errors import UserError

CONFIG_COLUMNS = ("algorithm", "workload", "workers", "slowdown", "seed", "iterations",
                  "seconds", "pace_ms", "warmup_iterations", "eval_interval_s", "matrix",
                  "algorithm_options", "workload_options")


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


def load_runs(path: str | Path) -> pd.DataFrame:
    """One row per run under `path`: its config, summary and status (incomplete if no summary)."""
    rows = []
    for run_dir in run_dirs(Path(path)):
        try:
            config = read_json(run_dir / "config.json")
        except ValueError:
            continue
        row: dict[str, Any] = {k: config.get(k) for k in CONFIG_COLUMNS}
        row["network_config"] = config.get("network") or {}
        summary_path = run_dir / "summary.json"
        summary = upgrade(read_json(summary_path)) if summary_path.exists() else {
            "status": "incomplete", "cause": "no summary.json (run still going, or killed)"}
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
            [with_network(o, n) for o, n in zip(frame["workload_options"],
                                                frame["network_config"], strict=True)],
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
        records, _ = read_jsonl(Path(run["run_dir"]) / "eval.jsonl")
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
    paths = sorted(run_dir.glob("events.rank*.jsonl"),
                   key=lambda p: int(p.name.removeprefix("events.rank").split(".")[0]))
    for path in paths:
        records, _ = read_jsonl(path)
        if records:
            frames.append(pd.DataFrame(records))
    if not frames:
        return pd.DataFrame()
    return pd.concat(frames, ignore_index=True)


def load_env(run_dir: str | Path) -> dict[str, Any]:
    """The run's env.json (versions, machine, git), or {} if it has none."""
    path = Path(run_dir) / "env.json"
    try:
        return read_json(path)
    except (OSError, ValueError):
        return {}


def select_run_dirs(results_dir: str | Path, wanted: tuple[str, ...] = ()) -> list[Path]:
    """The run directories under `results_dir` (a results directory or one run's), or those
    whose id starts with one of `wanted`; UserError for a missing directory or an id that
    matches no run or several."""
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise UserError(f"results directory {results_dir} does not exist; run `bench run` first")
    found = run_dirs(results_dir)
    if not found:
        raise UserError(f"no runs under {results_dir}; run `bench run --out {results_dir}` first")
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
