"""`bench compare`: each algorithm against a baseline, with the spread over seeds.

A difference is *supported* only when both sides have at least two seeds and their 95%
t-intervals of the mean do not overlap; otherwise it is marked, so a one-seed 10% gain is not
read as a result.
"""

from __future__ import annotations

import math

import pandas as pd

from hetbench.reports.intervals import CONFIDENCE, Interval
from hetbench.reports.tables import CELL, format_number, order_algorithms
from hetbench.reports.targets import Target, reach

__all__ = ["CONFIDENCE", "Interval", "compare_frame", "compare_markdown", "ratio"]


def ratio(a: Interval, b: Interval) -> tuple[float, float, float, str]:
    """(a/b, low, high, note): note is "" when the seeds support a != b, else why not."""
    if a.n == 0 or b.n == 0 or not b.mean:
        return math.nan, math.nan, math.nan, "no data"
    value = a.mean / b.mean
    if a.n < 2 or b.n < 2:
        return value, math.nan, math.nan, f"unsupported: {min(a.n, b.n)} seed"
    low = a.low / b.high if b.high > 0 else math.nan
    high = a.high / b.low if b.low > 0 else math.inf
    overlap = a.low <= b.high and b.low <= a.high
    return value, low, high, "unsupported: intervals overlap" if overlap else ""


def compare_frame(runs: pd.DataFrame, evals: pd.DataFrame, baseline: str,
                  targets: dict[str, Target]) -> pd.DataFrame:
    """Per (algorithm != baseline, workload, workers, slowdown): throughput and time ratios."""
    ok = runs[runs["status"] == "ok"]
    # A run's time counts only where it held the target: one that crossed and fell back has
    # not reached it, and its early crossing would make the fastest-looking time of all.
    times, not_held = {}, set()
    for run_id, run_evals in evals.groupby("run_id"):
        target = targets.get(run_evals["workload"].iloc[0])
        if target is not None:
            found = reach(run_evals, target)
            times[run_id] = found.seconds if found.held else math.nan
            if found.crossed and not found.held:
                not_held.add(run_id)
    rows = []
    for cell, group in ok.groupby(CELL, sort=True):
        base = group[group["algorithm"] == baseline]
        if base.empty:
            continue
        base_tp = Interval.of(base["throughput"])
        base_t = Interval.of(base["run_id"].map(times))
        for algorithm in order_algorithms(group["algorithm"], baseline):
            if algorithm == baseline:
                continue
            mine = group[group["algorithm"] == algorithm]
            tp = ratio(Interval.of(mine["throughput"]), base_tp)
            mine_t = Interval.of(mine["run_id"].map(times))
            tt = ratio(mine_t, base_t)
            missed = [f"{name} {i.n} of {len(rows)} seeds" for name, i, rows in
                      ((algorithm, mine_t, mine), (baseline, base_t, base))
                      if 0 < i.n < len(rows)]
            if missed:
                # The mean is over the seeds that reached it: say so, it flatters the laggard.
                note = f"reached by {', '.join(missed)}"
                tt = (*tt[:3], f"{tt[3]}; {note}" if tt[3] else note)
            if mine_t.n == 0 or base_t.n == 0:
                who = [name for name, i in ((algorithm, mine_t), (baseline, base_t)) if i.n == 0]
                tt = (*tt[:3], f"target not reached by {' and '.join(who)}"
                      if times else "no target (no evaluations)")
            fell_back = [f"{name} {n} of {len(rows)} seeds" for name, rows in
                         ((algorithm, mine), (baseline, base))
                         if (n := int(rows["run_id"].isin(not_held).sum()))]
            if fell_back:
                mark = f"crossed, not held by {', '.join(fell_back)}"
                tt = (*tt[:3], f"{tt[3]}; {mark}" if tt[3] else mark)
            rows.append({
                "algorithm": algorithm, **dict(zip(CELL, cell, strict=True)),
                "seeds": len(mine), "baseline_seeds": len(base),
                "throughput_ratio": tp[0], "throughput_low": tp[1], "throughput_high": tp[2],
                "throughput_note": tp[3],
                "time_to_target_ratio": tt[0], "time_to_target_low": tt[1],
                "time_to_target_high": tt[2], "time_to_target_note": tt[3],
            })
    return pd.DataFrame(rows)


def compare_markdown(frame: pd.DataFrame, baseline: str) -> str:
    """The comparison as a markdown table with the spread and the marks inline."""
    from hetbench.reports.tables import to_markdown

    def cell(row, prefix: str) -> str:
        value = row[f"{prefix}_ratio"]
        if pd.isna(value):
            return row[f"{prefix}_note"] or "n/a"
        text = format_number(value)
        low, high = row[f"{prefix}_low"], row[f"{prefix}_high"]
        if not pd.isna(low):
            text += f" [{format_number(low)}, {format_number(high)}]"
        note = row[f"{prefix}_note"]
        return f"{text} ({note})" if note else f"{text} *"

    table = pd.DataFrame({
        "algorithm": frame["algorithm"], "workload": frame["workload"],
        "workers": frame["workers"], "slowdown": frame["slowdown"],
        "seeds": frame["seeds"].astype(str) + " vs " + frame["baseline_seeds"].astype(str),
        f"throughput / {baseline}": frame.apply(cell, axis=1, prefix="throughput"),
        f"time to target / {baseline}": frame.apply(cell, axis=1, prefix="time_to_target"),
    })
    return to_markdown(table)
