"""`bench report DIR`: report.md and report.csv from the runs stored under DIR."""

from __future__ import annotations

from pathlib import Path

from hetbench.errors import UserError
from hetbench.reports.load import load_runs
from hetbench.reports.tables import throughput_table, to_markdown


def write_report(results_dir: Path, baseline: str = "allreduce") -> dict[str, Path]:
    """Write the report files into `results_dir`; returns their paths by kind."""
    if not results_dir.is_dir():
        raise UserError(f"results directory {results_dir} does not exist; run `bench run` first")
    runs = load_runs(results_dir)
    if runs.empty:
        raise UserError(f"no runs under {results_dir}; run `bench run --out {results_dir}` first")
    table = throughput_table(runs, baseline)
    paths = {"csv": results_dir / "report.csv", "md": results_dir / "report.md"}
    _write_atomic(paths["csv"], table.to_csv(index=False))
    _write_atomic(paths["md"], _markdown(results_dir, runs, table, baseline))
    return paths


def _markdown(results_dir: Path, runs, table, baseline: str) -> str:
    failed = runs[runs["status"] != "ok"]
    notes = []
    if "synthetic" in runs and runs["synthetic"].fillna(False).astype(bool).any():
        notes.append("- Some runs use **synthetic data** (marked in the `synthetic` column).")
    if "compute" in runs and (runs["compute"] == "emulated").any():
        notes.append("- Some runs use **emulated compute** (throughput only, no convergence).")
    paced = sorted({p for p in runs.get("pace_ms", []) if p})
    if paced:
        notes.append(f"- Pacing on: compute floor of {', '.join(f'{p:g}' for p in paced)} ms "
                     "per iteration.")
    parts = [
        f"# hetbench report: {results_dir}",
        "",
        f"{len(runs)} runs, {len(runs) - len(failed)} ok, {len(failed)} not ok. Throughput is "
        "samples/s of all workers in the steady-state window (after warm-up, while every worker "
        f"runs), mean over seeds; `throughput_vs_{baseline}` divides by {baseline} in the same "
        "workload/workers/slowdown.",
        *(["", *notes] if notes else []),
        "",
        "## Throughput",
        "",
        to_markdown(table),
    ]
    if not failed.empty:
        parts += ["", "## Runs not ok", "",
                  to_markdown(failed[["run_id", "status", "cause"]].fillna(""))]
    return "\n".join(parts) + "\n"


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
