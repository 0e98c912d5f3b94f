"""Tables: throughput normalised to All-Reduce (flat and Prague-slides layout), time to target."""

from __future__ import annotations

import math

import pandas as pd

from hetbench.core.registry import ALGORITHMS
from hetbench.core.variants import base_name
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
    for column in ("final_test_accuracy", "final_test_perplexity", *HEALTH_COLUMNS, "compute",
                   "synthetic", "simulated", "pace_ms"):
        if column in ok:
            if column in ("compute", "synthetic", "simulated", "pace_ms"):
                values = ok.groupby(KEYS)[column].agg("first")
            else:
                values = pd.to_numeric(ok[column], errors="coerce").groupby(
                    [ok[k] for k in KEYS]).mean()
            table = table.merge(values.rename(column).reset_index(), on=KEYS, how="left")
    # An emulated network's fidelity (summary.json): a cell is as trustworthy as its worst
    # run ("low" if any seed's host fell behind the model; "" without a network model).
    if "fidelity" in ok:
        worst = ok.groupby(KEYS)["fidelity"].agg(_worst_fidelity)
        table = table.merge(worst.rename("fidelity").reset_index(), on=KEYS, how="left")
    table["sync_flag"] = [
        sync_flag(row.get("sync_share"), row.get("sync_intended"), bool(row.get("simulated")))
        for _, row in table.iterrows()]
    return table


#: Synchronization health, per run in summary.json and as means over seeds in report tables.
HEALTH_COLUMNS = ("sync_share", "sync_intended", "mean_group_size", "mean_staleness",
                  "final_consensus_distance", "mean_consensus_distance")
#: A run averaging with a peer this much (absolute share) below its protocol's intent is flagged.
SYNC_SHORTFALL = 0.10
#: A run averaging in fewer iterations than this is flagged even when its protocol means it to.
SYNC_RARE = 0.5


def _worst_fidelity(values) -> str:
    levels = {v for v in values if isinstance(v, str)}
    for level in ("low", "unknown", "high"):
        if level in levels:
            return level
    return ""


def sync_flag(share, intended, simulated: bool = False) -> str:
    """The warning a reader must see beside a cell's throughput, or "" when it synchronized as
    its protocol intends: a throughput win bought by averaging less is no win."""
    if share is None or pd.isna(share):
        # The simulator does not model peers yet; a real run without them has an algorithm
        # (a plugin, most likely) whose steps do not say whom they averaged with.
        return "" if simulated else "synchronization not recorded (StepInfo.peers)"
    if intended is not None and not pd.isna(intended) and share < intended - SYNC_SHORTFALL:
        return (f"LOW SYNC: averaged with a peer in {share:.0%} of iterations; its protocol "
                f"does in {intended:.0%} without stragglers")
    if share < SYNC_RARE:
        return f"RARE SYNC: averaged with a peer in only {share:.0%} of iterations (by design)"
    return ""


def order_algorithms(names, baseline: str = "allreduce") -> list[str]:
    """The baseline first, then the built-ins in the registry's order (the papers'), then
    plugins by name."""
    names = set(names)
    rank = {name: i for i, name in enumerate(ALGORITHMS.builtin_order)}
    # A variant (`hop[backup_workers=2]`) sits beside its algorithm, after the bare name.
    rest = sorted(names - {baseline}, key=lambda n: (rank.get(base_name(n), len(rank)),
                                                     base_name(n), n != base_name(n), n))
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
               "iterations_to_target", f"speedup_vs_{baseline}", "speedup_min", "speedup_max",
               "resolution"]
    rows = []
    for run_id, run_evals in evals.groupby("run_id", sort=False):
        workload = run_evals["workload"].iloc[0]
        target = targets.get(workload)
        if target is None:
            continue
        seconds, iteration, how = time_to_target(run_evals, target)
        rows.append({**{k: run_evals[k].iloc[0] for k in KEYS}, "seed": run_evals["seed"].iloc[0],
                     "run_id": run_id, "target": str(target), "seconds": seconds,
                     "iteration": iteration, "how": how})
    if not rows:
        return pd.DataFrame(columns=columns)
    per_run = pd.DataFrame(rows)
    # Per-seed speedups: each run against the baseline run of the same seed and cell.
    base_runs = (per_run[per_run["algorithm"] == baseline][[*CELL, "seed", "seconds"]]
                 .rename(columns={"seconds": "_base_s"}))
    per_run = per_run.merge(base_runs, on=[*CELL, "seed"], how="left")
    per_run["_speedup"] = per_run["_base_s"] / per_run["seconds"]
    table = (per_run.groupby([*KEYS, "target"], sort=True)
             .agg(seeds=("run_id", "count"), reached=("seconds", "count"),
                  time_to_target_s=("seconds", "mean"), time_to_target_std=("seconds", "std"),
                  iterations_to_target=("iteration", "mean"),
                  speedup_min=("_speedup", "min"), speedup_max=("_speedup", "max"),
                  resolution=("how", _resolution))
             .reset_index())
    # One seed that reached the target has no spread (0); none reaching has no time at all.
    table.loc[table["reached"] == 1, "time_to_target_std"] = 0.0
    base = (table[table["algorithm"] == baseline][[*CELL, "time_to_target_s"]]
            .rename(columns={"time_to_target_s": "_base"}))
    table = table.merge(base, on=CELL, how="left")
    table[f"speedup_vs_{baseline}"] = table["_base"] / table["time_to_target_s"]
    return table.drop(columns="_base")[columns]


def _resolution(hows: pd.Series) -> str:
    """How the cell's times were found: to one worker step, or interpolated (see targets)."""
    kinds = sorted({h for h in hows if h})
    if kinds == ["refined"]:
        return "1 step (refined)"
    return "interpolated" if kinds == ["interpolated"] else "+".join(kinds)


def speedup_table(ttt: pd.DataFrame, baseline: str = "allreduce") -> pd.DataFrame:
    """The headline convergence table: rows cells, columns algorithms, each value the
    time-to-target speedup over `baseline` (mean times' ratio) with the per-seed range."""
    if ttt.empty:
        return pd.DataFrame()
    frame = ttt.copy()
    frame["row"] = (frame["workload"] + ", " + frame["workers"].astype(str) + " workers, "
                    + frame["slowdown"])

    def cell(row) -> str:
        value = row[f"speedup_vs_{baseline}"]
        if pd.isna(value):
            return "not reached" if row["reached"] == 0 else ""
        spread = ""
        if row["reached"] > 1 and not pd.isna(row["speedup_min"]):
            spread = f" ({format_number(row['speedup_min'])}-{format_number(row['speedup_max'])})"
        return format_number(value) + spread

    frame["value"] = frame.apply(cell, axis=1)
    block = frame.pivot_table(index="row", columns="algorithm", values="value", aggfunc="first")
    block = block.reindex(columns=order_algorithms(block.columns, baseline))
    block.index.name = "cell"
    block.columns.name = None
    return block.reset_index().fillna("")


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
