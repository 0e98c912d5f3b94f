"""Convergence plots (seaborn, PNG): test loss and accuracy against wall time and iterations.

One figure per (workload, workers, x axis); rows are the metrics, a panel per slowdown, a line
per algorithm (each seed its own line in the algorithm's colour: evaluation points of different
seeds fall at different iterations, so averaging them would draw a zigzag, not a mean). A third row,
the workers' spread around their average model, appears when some algorithm lets them differ.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from hetbench.reports.tables import order_algorithms
from hetbench.reports.targets import NOT_HELD

X_AXES = {"time": ("wall_s", "wall time (s)"), "iterations": ("iteration", "iteration")}
METRICS = [("test_loss", "test loss"), ("test_accuracy", "test accuracy")]
SPREAD = ("consensus_distance", "consensus distance")
DPI = 100


def new_figure(width: float, height: float):
    """A figure that needs no display or pyplot state (safe in workers and tests)."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def convergence_plots(evals: pd.DataFrame, out_dir: Path, baseline: str = "allreduce",
                      targets=None) -> list[Path]:
    """Write convergence-<workload>-w<N>-<time|iterations>.png; returns the paths written."""
    import seaborn as sns

    paths: list[Path] = []
    if evals.empty:
        return paths
    targets = targets or {}
    palette = dict(zip(order_algorithms(evals["algorithm"], baseline),
                       sns.color_palette("tab10", evals["algorithm"].nunique()), strict=True))
    for (workload, workers), cell in evals.groupby(["workload", "workers"], sort=True):
        slowdowns = sorted(cell["slowdown"].unique(), key=lambda s: (s != "none", s))
        algorithms = order_algorithms(cell["algorithm"], baseline)
        metrics = list(METRICS)
        # Judged on the final models: snapshots of the same tick come from slightly different
        # iterations, so even All-Reduce shows a spread there.
        finals = cell[cell["kind"] == "final"]["consensus_distance"]
        if finals.fillna(0).gt(0).any():
            metrics.append(SPREAD)
        for axis_name, (x, x_label) in X_AXES.items():
            fig = new_figure(3.6 * len(slowdowns) + 1.6, 3.0 * len(metrics))
            axes = fig.subplots(len(metrics), len(slowdowns), squeeze=False, sharex="col")
            for col, slowdown in enumerate(slowdowns):
                data = cell[cell["slowdown"] == slowdown]
                for row, (metric, label) in enumerate(metrics):
                    ax = axes[row][col]
                    sns.lineplot(data=data, x=x, y=metric, hue="algorithm", hue_order=algorithms,
                                 palette=palette, units="run_id", estimator=None,
                                 marker="o", markersize=3,
                                 ax=ax, legend=(row == 0 and col == len(slowdowns) - 1))
                    target = targets.get(workload)
                    if target is not None and target.column == metric:
                        ax.axhline(target.value, color="grey", linestyle=":", linewidth=1)
                    ax.set_xlabel(x_label if row == len(metrics) - 1 else "")
                    ax.set_ylabel(label if col == 0 else "")
                    if row == 0:
                        ax.set_title(f"slowdown: {slowdown}")
                    ax.grid(True, alpha=0.3)
            legend_ax = axes[0][len(slowdowns) - 1]
            if legend_ax.get_legend() is not None:
                sns.move_legend(legend_ax, "upper left", bbox_to_anchor=(1.02, 1), frameon=False)
            fig.suptitle(f"{workload}, {workers} workers: averaged model vs {x_label}")
            path = out_dir / f"convergence-{workload}-w{workers}-{axis_name}.png"
            fig.savefig(path)
            paths.append(path)
    return paths


#: Cells (workload, workers) the headline figure draws; the tables below it have every cell.
HEADLINE_CELLS = 3


def headline_plot(throughput: pd.DataFrame, time_to_target: pd.DataFrame, path: Path,
                  baseline: str = "allreduce") -> Path | None:
    """headline.png: each algorithm against the baseline in each cell, a bar per slowdown:
    throughput (left) and, where runs reached a target, time-to-target speedup (right). A
    hatched bar synchronized markedly less than its protocol intends (its throughput is not
    comparable); a cross-hatched speedup crossed the target without most seeds (its own or
    the baseline's) holding it, and says so above it (no result); None when there is nothing
    to draw."""
    column = f"throughput_vs_{baseline}"
    if throughput.empty or column not in throughput:
        return None
    speedup = f"speedup_vs_{baseline}"
    has_ttt = (not time_to_target.empty and speedup in time_to_target
               and time_to_target[speedup].notna().any())
    cells = list(throughput.groupby(["workload", "workers"], sort=True).groups)[:HEADLINE_CELLS]
    panels = [(column, f"throughput / {baseline}", throughput)]
    if has_ttt:
        panels.append((speedup, f"time-to-target speedup over {baseline}", time_to_target))
    fig = new_figure(5.2 * len(panels) + 1.6, 2.6 * len(cells) + 0.6)
    axes = fig.subplots(len(cells), len(panels), squeeze=False)
    slowdowns = sorted(throughput["slowdown"].unique(), key=lambda s: (s != "none", s))
    colours = [f"C{i}" for i in range(len(slowdowns))]
    labelled: set[str] = set()
    for row, (workload, workers) in enumerate(cells):
        for col, (value, label, frame) in enumerate(panels):
            ax = axes[row][col]
            cell = frame[(frame["workload"] == workload) & (frame["workers"] == workers)]
            algorithms = order_algorithms(cell["algorithm"].unique(), baseline)
            width = 0.8 / max(1, len(slowdowns))
            for i, slowdown in enumerate(slowdowns):
                for x, algorithm in enumerate(algorithms):
                    hit = cell[(cell["algorithm"] == algorithm) & (cell["slowdown"] == slowdown)]
                    if hit.empty or pd.isna(hit[value].iloc[0]):
                        continue
                    flagged = bool(hit.get("sync_flag", pd.Series([None])).fillna("").iloc[0])
                    lost = value == speedup and _not_held(frame, hit.iloc[0], baseline)
                    at = x + (i - (len(slowdowns) - 1) / 2) * width
                    ax.bar(at, hit[value].iloc[0], width, color=colours[i],
                           hatch="xx" if lost else "//" if flagged else None,
                           edgecolor="red" if lost else "black" if flagged else None,
                           linewidth=0.5, label=None if slowdown in labelled else slowdown)
                    if lost:
                        ax.annotate("crossed,\nnot held", (at, hit[value].iloc[0]), fontsize=6,
                                    color="red", ha="center", va="bottom")
                    labelled.add(slowdown)
            ax.axhline(1.0, color="grey", linewidth=0.8)
            ax.set_xticks(range(len(algorithms)), algorithms, rotation=30, ha="right",
                          fontsize=8)
            ax.set_ylabel(label, fontsize=8)
            ax.set_title(f"{workload}, {workers} workers", fontsize=9)
    if labelled:  # no bar at all (every value missing): no legend, and no matplotlib warning
        fig.legend(title="slowdown", loc="outside right upper", fontsize=8, frameon=False)
    fig.savefig(path)
    return path


def _not_held(ttt: pd.DataFrame, row, baseline: str) -> bool:
    """Whether a time-to-target row crossed without most seeds holding it, or its baseline
    did (tables.time_to_target_table's verdicts)."""
    if "verdict" not in ttt:
        return False
    base = ttt[(ttt["algorithm"] == baseline) & (ttt["workload"] == row["workload"])
               & (ttt["workers"] == row["workers"]) & (ttt["slowdown"] == row["slowdown"])]
    return row["verdict"] == NOT_HELD or (not base.empty and base["verdict"].iloc[0] == NOT_HELD)


#: Distinct world sizes of a workload from which the report draws time to target against them.
SCALING_SIZES = 3


def scaling_plots(time_to_target: pd.DataFrame, out_dir: Path,
                  baseline: str = "allreduce") -> list[Path]:
    """scaling-<workload>.png for each workload run at SCALING_SIZES or more world sizes:
    time-to-target speedup over the baseline against the number of workers (log scale), one
    line per algorithm, a panel per slowdown. A cell whose runs never reached the target is a
    cross on the panel's floor, so a line that stops has a reason drawn; one that crossed it
    without most seeds holding it is a hollow circle off the line (no result)."""
    from matplotlib import colormaps

    speedup = f"speedup_vs_{baseline}"
    if time_to_target.empty or speedup not in time_to_target:
        return []
    paths = []
    for workload, frame in time_to_target.groupby("workload", sort=True):
        sizes = sorted(frame["workers"].unique())
        if len(sizes) < SCALING_SIZES or frame[speedup].notna().sum() == 0:
            continue
        slowdowns = sorted(frame["slowdown"].unique(), key=lambda s: (s != "none", s))
        columns = min(len(slowdowns), 2)
        rows = -(-len(slowdowns) // columns)
        fig = new_figure(6.0 * columns + 1.8, 3.6 * rows)
        axes = fig.subplots(rows, columns, squeeze=False)
        algorithms = order_algorithms(frame["algorithm"].unique(), baseline)
        # A study has up to ~20 algorithms and variants: tab20 keeps them apart by colour.
        colours = colormaps["tab20"]
        floor = max(1e-3, float(frame[speedup].min(skipna=True)) / 1.5)
        for i, slowdown in enumerate(slowdowns):
            ax = axes[i // columns][i % columns]
            panel = frame[frame["slowdown"] == slowdown]
            crosses: dict[int, int] = {}  # crosses drawn so far at each world size
            for j, algorithm in enumerate(algorithms):
                line = panel[panel["algorithm"] == algorithm].sort_values("workers")
                style = dict(color=colours(j % 20), linestyle="-" if j < 10 else "--")
                lost = pd.Series([_not_held(frame, r, baseline) for _, r in line.iterrows()],
                                 index=line.index, dtype=bool)
                reached = line[line[speedup].notna() & ~lost]
                ax.plot(reached["workers"], reached[speedup], marker="o", markersize=3,
                        label=algorithm if i == 0 else None, **style)
                held_not = line[line[speedup].notna() & lost]
                if not held_not.empty:
                    ax.scatter(held_not["workers"], held_not[speedup], marker="o",
                               facecolors="none", edgecolors=style["color"])
                missed = line[line[speedup].isna()]
                if not missed.empty:  # stacked at the floor, so that each cross shows
                    heights = []
                    for workers in missed["workers"]:
                        heights.append(floor * 1.4 ** crosses.get(workers, 0))
                        crosses[workers] = crosses.get(workers, 0) + 1
                    ax.scatter(missed["workers"], heights, marker="x", color=style["color"])
            ax.axhline(1.0, color="grey", linewidth=0.8)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(sizes, [str(s) for s in sizes])
            ax.set_xlabel("workers", fontsize=8)
            ax.set_ylabel(f"time-to-target speedup\nover {baseline}", fontsize=7)
            ax.set_title(f"{workload}: {slowdown} (x: not reached; o hollow: crossed, "
                         "not held)", fontsize=9)
        for k in range(len(slowdowns), rows * columns):
            axes[k // columns][k % columns].set_visible(False)
        fig.legend(title="algorithm", loc="outside right upper", fontsize=7, frameon=False)
        path = out_dir / f"scaling-{workload}.png"
        fig.savefig(path)
        paths.append(path)
    return paths
