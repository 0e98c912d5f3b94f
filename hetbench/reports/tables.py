"""Throughput tables: per (algorithm, workload, workers, slowdown), normalised to All-Reduce."""

from __future__ import annotations

import pandas as pd

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
    for column in ("final_test_accuracy", "compute", "synthetic", "pace_ms"):
        if column in ok:
            agg = "mean" if column == "final_test_accuracy" else "first"
            values = ok.groupby(KEYS)[column].agg(agg).reset_index()
            table = table.merge(values, on=KEYS, how="left")
    return table


def to_markdown(table: pd.DataFrame, floatfmt: str = ".3g") -> str:
    """A GitHub-flavoured markdown table (no tabulate dependency)."""
    columns = list(table.columns)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for _, row in table.iterrows():
        cells = []
        for column in columns:
            value = row[column]
            if isinstance(value, float):
                cells.append("" if pd.isna(value) else format(value, floatfmt))
            else:
                cells.append(str(value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
