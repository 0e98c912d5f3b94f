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
