"""Tables: throughput normalised to All-Reduce (flat and Prague-slides layout), time to target."""

from __future__ import annotations

import math

import pandas as pd

from hetbench.reports.targets import Target, time_to_target

KEYS = ["algorithm", "workload", "workers", "slowdown"]
CELL = ["workload", "workers", "slowdown"]


def throughput_table(runs: pd.DataFrame, baseline: str = "allreduce") -> pd.DataFrame:
    """Mean and spread of throughput over seeds, and the ratio to `baseline` in the same cell."""
    ok = runs[runs["status"] == "ok"]
    if ok.empty:
        return pd.DataFrame(columns=[*KEYS, "throughput", "throughput_std", "seeds",
                                     f"throughput_vs_{baseline}"])
    table = (ok.groupby(KEYS, sort=True)["throughput"]
             .agg(throughput="mean", throughput_std="std", seeds="count").reset_index())
    table["throughput_std"] = table["throughput_std"].fillna(0.0)
    base = (table[table["algorithm"] == baseline][[*CELL, "throughput"]]
            .rename(columns={"throughput": "_base"}))
    table = table.merge(base, on=CELL, how="left")
    table[f"throughput_vs_{baseline}"] = table["throughput"] / table["_base"]
    table = table.drop(columns="_base")
    # CPU every process of the run spent per worker iteration (empty for simulated runs and runs
    # of an older hetbench): what an algorithm costs the cores, beside its speed.
    cpu_s = pd.to_numeric(ok["train_cpu_s"], errors="coerce") if "train_cpu_s" in ok else math.nan
    cpu = ok[KEYS].assign(cpu_ms_per_iteration=cpu_s * 1e3 / ok["iterations"])
    table = table.merge(cpu.groupby(KEYS)["cpu_ms_per_iteration"].mean().reset_index(),
                        on=KEYS, how="left")
    for column in ("final_test_accuracy", "compute", "synthetic", "simulated", "pace_ms"):
        if column in ok:
            agg = "mean" if column == "final_test_accuracy" else "first"
            values = ok.groupby(KEYS)[column].agg(agg).reset_index()
            table = table.merge(values, on=KEYS, how="left")
    return table


#: Column order of the algorithms in tables and plot legends; others follow alphabetically.
ALGORITHM_ORDER = ["allreduce", "ps-sync", "ps-async", "dpsgd", "adpsgd", "hop",
                   "prague-static", "prague-smart", "prague-random"]


def order_algorithms(names, baseline: str = "allreduce") -> list[str]:
    """The baseline first, then the built-ins in the papers' order, then plugins by name."""
    names = set(names)
    rank = {name: i for i, name in enumerate(ALGORITHM_ORDER)}
    rest = sorted(names - {baseline}, key=lambda n: (rank.get(n, len(rank)), n))
    return ([baseline] if baseline in names else []) + rest


def prague_table(table: pd.DataFrame, baseline: str = "allreduce",
                 reference_slowdown: str = "none") -> dict[str, pd.DataFrame]:
    """Throughput per slowdown block, rows workloads, columns algorithms (the Prague slides).

    Each value is throughput / the baseline's throughput in the same workload and worker count
    under `reference_slowdown` (as the slides do, so a slowdown block shows what every algorithm,
    the baseline included, loses); where that cell was not run, under the block's own slowdown.
    """
    blocks: dict[str, pd.DataFrame] = {}
    if table.empty:
        return blocks
    table = table.copy()
    one_size = table["workers"].nunique() == 1
    table["row"] = (table["workload"] if one_size
                    else table["workload"] + " (" + table["workers"].astype(str) + " workers)")
    base = table[table["algorithm"] == baseline].set_index(["workload", "workers", "slowdown"])
    base = base["throughput"]

    def reference(row) -> float:
        for slowdown in (reference_slowdown, row["slowdown"]):
            key = (row["workload"], row["workers"], slowdown)
            if key in base.index:
                return float(base[key])
        return math.nan

    table["value"] = table["throughput"] / table.apply(reference, axis=1)
    columns = order_algorithms(table["algorithm"], baseline)
    slowdowns = sorted(table["slowdown"].unique(), key=lambda s: (s != reference_slowdown, s))
    for slowdown in slowdowns:
        block = table[table["slowdown"] == slowdown].pivot_table(
            index="row", columns="algorithm", values="value", aggfunc="first")
        block = block.reindex(columns=[c for c in columns if c in block.columns])
        block.index.name = "workload"
        block.columns.name = None
        blocks[slowdown] = block.reset_index()
    return blocks


def time_to_target_table(runs: pd.DataFrame, evals: pd.DataFrame, targets: dict[str, Target],
                         baseline: str = "allreduce") -> pd.DataFrame:
    """Seconds and iterations to each workload's target, mean over seeds, and speedup vs baseline.

    Speedup = the baseline's mean time / this algorithm's mean time in the same cell, so > 1 means
    faster to the target. Runs that never reach it count in `seeds` but not in `reached`.
    """
    columns = [*KEYS, "target", "seeds", "reached", "time_to_target_s", "time_to_target_std",
               "iterations_to_target", f"speedup_vs_{baseline}"]
    rows = []
    for run_id, run_evals in evals.groupby("run_id", sort=False):
        workload = run_evals["workload"].iloc[0]
        target = targets.get(workload)
        if target is None:
            continue
        seconds, iteration = time_to_target(run_evals, target)
        rows.append({**{k: run_evals[k].iloc[0] for k in KEYS}, "run_id": run_id,
                     "target": str(target), "seconds": seconds, "iteration": iteration})
    if not rows:
        return pd.DataFrame(columns=columns)
    per_run = pd.DataFrame(rows)
    table = (per_run.groupby([*KEYS, "target"], sort=True)
             .agg(seeds=("run_id", "count"), reached=("seconds", "count"),
                  time_to_target_s=("seconds", "mean"), time_to_target_std=("seconds", "std"),
                  iterations_to_target=("iteration", "mean"))
             .reset_index())
    # One seed that reached the target has no spread (0); none reaching has no time at all.
    table.loc[table["reached"] == 1, "time_to_target_std"] = 0.0
    base = (table[table["algorithm"] == baseline][[*CELL, "time_to_target_s"]]
            .rename(columns={"time_to_target_s": "_base"}))
    table = table.merge(base, on=CELL, how="left")
    table[f"speedup_vs_{baseline}"] = table["_base"] / table["time_to_target_s"]
    return table.drop(columns="_base")[columns]


def format_number(value: float) -> str:
    """3 significant digits, without exponents for the rates and times a report shows."""
    if pd.isna(value):
        return ""
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return format(value, ".3g")


def to_markdown(table: pd.DataFrame, floatfmt: str | None = None) -> str:
    """A GitHub-flavoured markdown table (no tabulate dependency)."""
    columns = list(table.columns)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for _, row in table.iterrows():
        cells = []
        for column in columns:
            value = row[column]
            if isinstance(value, float):
                cells.append(format_number(value) if floatfmt is None
                             else "" if pd.isna(value) else format(value, floatfmt))
            else:
                # A cause or path may hold a pipe or a newline; either would break the row.
                cells.append(str(value).replace("|", "\\|").replace("\n", " "))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
