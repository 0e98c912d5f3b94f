"""Tolerance curves: how each algorithm holds up as one slowdown grows more severe.

A matrix sweeps a slowdown's severity when its slowdown specs differ in one number only
(prob:2, prob:5, prob:10; compose:persistent(frac=0.1;k=1.1) ... k=2; preset:osdi-p50,
osdi-p90, osdi-p99): that number is the severity. For every sweep (per workload and workers)
the report gets a table and tolerance.png: each algorithm's throughput and time to target
against severity, relative to its own run without slowdown (`none` in the same matrix) and to
the baseline (All-Reduce) at the same severity.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from hetbench.reports.plots import new_figure
from hetbench.reports.sections import Section
from hetbench.reports.tables import order_algorithms

_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")

TEXT = (
    "The matrix sweeps the severity of a slowdown (the one number in which its slowdown specs "
    "differ). Per algorithm and severity: throughput, and throughput relative to the same "
    "algorithm without slowdown (`vs_own_none`, 1 = unaffected; empty when the matrix has no "
    "`none` run) and to {baseline} at the same severity (`vs_{baseline}`, > 1 = faster); time "
    "to target likewise where the workload has a target (`ttt_vs_own_none` = the unslowed time "
    "/ this time, `ttt_speedup_vs_{baseline}` = {baseline}'s time / this time). Plotted in "
    "tolerance.png.")


@dataclass(frozen=True)
class Sweep:
    """Slowdown specs that differ in one number: the template (that number as K) and each
    spec's severity."""

    template: str
    severity: dict[str, float]


def find_sweeps(slowdowns) -> list[Sweep]:
    """The severity sweeps among `slowdowns` (at least two specs of one template)."""
    groups: dict[str, dict[str, list[float]]] = {}
    for spec in sorted(set(slowdowns) - {"none"}):
        numbers = [float(n) for n in _NUMBER.findall(spec)]
        if numbers:
            groups.setdefault(_NUMBER.sub("#", spec), {})[spec] = numbers
    sweeps = []
    for template, specs in groups.items():
        if len(specs) < 2:
            continue
        columns = list(zip(*specs.values(), strict=True))
        varying = [i for i, values in enumerate(columns) if len(set(values)) > 1]
        if len(varying) != 1:
            continue
        position = varying[0]
        label = _nth_placeholder(template, position)
        sweeps.append(Sweep(label, {spec: numbers[position]
                                    for spec, numbers in specs.items()}))
    return sweeps


def _nth_placeholder(template: str, position: int) -> str:
    """The template with its varying number as K and the fixed ones back in place."""
    parts = template.split("#")
    return "".join(part + ("K" if i == position else "#") if i < len(parts) - 1 else part
                   for i, part in enumerate(parts))


def tolerance_table(throughput: pd.DataFrame, time_to_target: pd.DataFrame,
                    baseline: str = "allreduce") -> pd.DataFrame:
    """One row per (workload, workers, sweep, severity, algorithm)."""
    rows = []
    for (workload, workers), cell in throughput.groupby(["workload", "workers"], sort=True):
        own_none = cell[cell["slowdown"] == "none"].set_index("algorithm")["throughput"]
        ttt = time_to_target[(time_to_target["workload"] == workload)
                             & (time_to_target["workers"] == workers)]
        ttt_by = {(r.algorithm, r.slowdown): r.time_to_target_s for r in ttt.itertuples()}
        for sweep in find_sweeps(cell["slowdown"]):
            for spec, severity in sorted(sweep.severity.items(), key=lambda item: item[1]):
                at = cell[cell["slowdown"] == spec].set_index("algorithm")
                for algorithm in order_algorithms(at.index, baseline):
                    value = at.at[algorithm, "throughput"]
                    base = at["throughput"].get(baseline, math.nan)
                    t = ttt_by.get((algorithm, spec), math.nan)
                    rows.append({
                        "workload": workload, "workers": workers, "sweep": sweep.template,
                        "severity": severity, "algorithm": algorithm, "throughput": value,
                        "vs_own_none": value / own_none.get(algorithm, math.nan),
                        f"vs_{baseline}": value / base,
                        "time_to_target_s": t,
                        "ttt_vs_own_none": ttt_by.get((algorithm, "none"), math.nan) / t,
                        f"ttt_speedup_vs_{baseline}": ttt_by.get((baseline, spec), math.nan) / t,
                    })
    return pd.DataFrame(rows)


def tolerance_plot(table: pd.DataFrame, path: Path, baseline: str = "allreduce") -> Path:
    """tolerance.png: a row per sweep; throughput (and time to target, where there is one)
    relative to the algorithm's own unslowed run and to the baseline, against severity."""
    sweeps = list(table.groupby(["workload", "workers", "sweep"], sort=False))
    panels = [("vs_own_none", "throughput / own without slowdown"),
              (f"vs_{baseline}", f"throughput / {baseline}")]
    if table["time_to_target_s"].notna().any():
        panels += [("ttt_vs_own_none", "time to target: own unslowed / this"),
                   (f"ttt_speedup_vs_{baseline}", f"time to target: {baseline} / this")]
    fig = new_figure(4.2 * len(panels), 3.2 * len(sweeps))
    axes = fig.subplots(len(sweeps), len(panels), squeeze=False)
    for row, ((workload, workers, template), sweep) in enumerate(sweeps):
        for col, (column, title) in enumerate(panels):
            ax = axes[row][col]
            for algorithm in order_algorithms(sweep["algorithm"], baseline):
                line = sweep[sweep["algorithm"] == algorithm].sort_values("severity")
                if line[column].notna().any():
                    ax.plot(line["severity"], line[column], marker="o", label=algorithm)
            ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
            ax.set_xlabel(f"K in {template}")
            ax.set_title(f"{workload} w={workers}: {title}", fontsize=9)
            if row == 0 and col == 0:
                ax.legend(fontsize=7)
    fig.savefig(path)
    return path


def tolerance_sections(report, paths: dict[str, Path]) -> list[Section]:
    """The report's tolerance section (its table, tolerance.png beside it) and tolerance.png
    in `paths` (as a plot), when the matrix sweeps a slowdown's severity; nothing otherwise."""
    baseline = report.baseline
    table = tolerance_table(report.throughput, report.time_to_target, baseline)
    if table.empty:
        return []
    paths["plot_tolerance"] = tolerance_plot(table, report.results_dir / "tolerance.png",
                                             baseline)
    if table["time_to_target_s"].isna().all():
        table = table.drop(columns=["time_to_target_s", "ttt_vs_own_none",
                                    f"ttt_speedup_vs_{baseline}"])
    return [Section("Tolerance to stragglers", TEXT.format(baseline=baseline), table,
                    images=(paths["plot_tolerance"],))]
