"""The tuned comparison: each algorithm scored by its best `bench tune` trial's time to target,
and the hyperparameter convention every report states.

A trial's time is the mean over its seeds, and counts only if every seed reached the target
(a point that converges on one seed of three is not a setting anyone would pick). The best
trial is the fastest; the table shows its values beside it, and how many trials reached the
target at all, so a comparison that only one lucky point wins is visible as such.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from hetbench.core.store import read_json
from hetbench.errors import UserError
from hetbench.harness.tune import TUNE_FILE
from hetbench.reports.tables import CELL, format_number, order_algorithms
from hetbench.reports.targets import Target, reach


def load_tuning(results_dir: Path) -> dict[str, Any] | None:
    """tune.json of a `bench tune` directory, or None for any other results directory."""
    path = Path(results_dir) / TUNE_FILE
    if not path.exists():
        return None
    try:
        return read_json(path)
    except ValueError as exc:
        # Not None: the report would then call a tuned comparison "shared hyperparameters".
        raise UserError(f"{path} is not valid JSON ({exc}); rerun `bench tune` with the same "
                        "matrix into this directory to write it again") from None


def tuned_table(runs: pd.DataFrame, evals: pd.DataFrame, targets: dict[str, Target],
                tuning: dict[str, Any], baseline: str = "allreduce") -> pd.DataFrame:
    """One row per algorithm and cell: trials run, trials that reached the target, the best
    trial's time and values, and its speedup over `baseline`'s best trial in the same cell."""
    columns = ["algorithm", *CELL, "target", "trials", "reached", "best_time_to_target_s",
               f"speedup_vs_{baseline}", "best_values", "best_trial"]
    trial_of = tuning.get("runs", {})
    rows = []
    for run_id, run in runs.set_index("run_id").iterrows():
        if run_id not in trial_of:
            continue
        target = targets.get(run["workload"])
        seconds = math.nan
        if run["status"] == "ok" and target is not None:
            # A seed that crossed and fell back has not reached it (targets.reach).
            found = reach(evals[evals["run_id"] == run_id], target)
            seconds = found.seconds if found.held else math.nan
        info = trial_of[run_id]
        rows.append({"algorithm": info["algorithm"],
                     **{k: run[k] for k in CELL}, "target": str(target) if target else "",
                     "trial": info["trial"], "values": _values(info["values"]),
                     "seconds": seconds})
    if not rows:
        return pd.DataFrame(columns=columns)
    per_run = pd.DataFrame(rows)
    keys = ["algorithm", *CELL, "target", "trial", "values"]
    # A trial reached the target only if every one of its seeds did (mean then over them).
    per_trial = per_run.groupby(keys, sort=False)["seconds"].agg(
        lambda s: s.mean() if s.notna().all() else math.nan).reset_index()
    out = []
    for key, group in per_trial.groupby(["algorithm", *CELL, "target"], sort=False):
        reached = group[group["seconds"].notna()]
        best = reached.loc[reached["seconds"].idxmin()] if not reached.empty else None
        out.append({**dict(zip(["algorithm", *CELL, "target"], key, strict=True)),
                    "trials": len(group), "reached": len(reached),
                    "best_time_to_target_s": best["seconds"] if best is not None else math.nan,
                    "best_values": best["values"] if best is not None else "",
                    "best_trial": int(best["trial"]) if best is not None else None})
    table = pd.DataFrame(out)
    base = (table[table["algorithm"] == baseline][[*CELL, "best_time_to_target_s"]]
            .rename(columns={"best_time_to_target_s": "_base"}))
    table = table.merge(base, on=CELL, how="left")
    table[f"speedup_vs_{baseline}"] = table["_base"] / table["best_time_to_target_s"]
    order = {name: i for i, name in enumerate(order_algorithms(table["algorithm"], baseline))}
    table = table.sort_values([*CELL, "algorithm"], key=lambda s: s.map(order).fillna(0)
                              if s.name == "algorithm" else s, kind="stable")
    return table.drop(columns="_base").reset_index(drop=True)[columns]


def _values(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={format_number(v) if isinstance(v, float) else v}"
                     for k, v in sorted(values.items()))


def convention(runs: pd.DataFrame, tuning: dict[str, Any] | None) -> str:
    """The hyperparameter convention of the comparison, for the report's notes."""
    if tuning is not None:
        return (f"Hyperparameters tuned: {tuning.get('space', '')}; each algorithm is scored by "
                "its best trial's time to target (the Tuned comparison table; AlgoPerf's "
                "external tuning ruleset). The other tables list every trial as its own row.")
    if runs.empty or "workload_options" not in runs:
        return ""
    differing = []
    for cell, group in runs.groupby(CELL, sort=True):
        seen = {}
        for _, run in group.iterrows():
            seen.setdefault(_values(run["workload_options"] or {}), []).append(run["algorithm"])
        if len(seen) > 1:
            differing.append(f"{cell[0]}, {cell[1]} workers, {cell[2]}")
    if differing:
        return ("Hyperparameters differ between algorithms (per-algorithm workload options or a "
                f"sweep) in: {'; '.join(differing)}; not tuned with equal trials (`bench tune` "
                "does that).")
    return ("Shared hyperparameters: every algorithm in a cell ran the same workload options "
            "(learning rate included), tuned for none of them; `bench tune` gives each "
            "algorithm equal tuning trials.")
