"""load_runs: every run directory under a path -> one DataFrame row per run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from hetbench.harness.config import SCHEMA_VERSION
from hetbench.harness.store import read_json

CONFIG_COLUMNS = ("algorithm", "workload", "workers", "slowdown", "seed", "iterations",
                  "seconds", "pace_ms", "matrix", "algorithm_options", "workload_options")


def run_dirs(path: Path) -> list[Path]:
    """Run directories (holding config.json) under `path`, skipping set-aside attempts."""
    path = Path(path)
    if (path / "config.json").exists():
        return [path]
    return sorted(p.parent for p in path.rglob("config.json")
                  if not any(part.startswith(".") for part in p.relative_to(path).parts))


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
    return frame
