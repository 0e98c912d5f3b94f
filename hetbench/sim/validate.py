"""Simulated vs measured: replay every finished real run of a results directory in the simulator."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from hetbench.core.config import RunConfig
from hetbench.core.rundir import RunDir
from hetbench.core.store import read_json
from hetbench.sim.model import SimModels
from hetbench.sim.run import simulate


def compare_with_real(real_dir: Path, models: SimModels, out_dir: Path,
                      own_cores: bool = True) -> list[dict[str, Any]]:
    """One row per ok real run under `real_dir`: its throughput, the simulated one, the error.

    own_cores: each run is played on as many shared cores as its env.json's cpu_count (the
    machine it was measured on), not the models' `cores`.
    """
    from hetbench.core.record import run_dirs
    from hetbench.sim.fit import run_cores

    rows = []
    for run_dir in run_dirs(Path(real_dir)):
        try:
            summary = read_json(RunDir(run_dir).summary)
            config = RunConfig.from_dict(read_json(RunDir(run_dir).config))
        except (OSError, ValueError):
            continue
        if summary.get("status") != "ok" or summary.get("simulated"):
            continue
        run_models = models
        if own_cores and models.network.cpu_s > 0:
            cores = run_cores(run_dir)
            run_models = replace(models, network=replace(models.network, cores=cores))
        simulated = simulate(config, run_models, out_dir).summary
        measured = summary["throughput"]
        rows.append({
            "algorithm": config.algorithm, "workers": config.workers,
            "slowdown": config.slowdown, "measured": measured,
            "simulated": simulated["throughput"],
            "error_pct": 100 * (simulated["throughput"] / measured - 1) if measured else None,
            # An emulated run's (its [network]): whether the host kept up with the model.
            "fidelity": summary.get("fidelity"),
            "late_share": (summary.get("network") or {}).get("late_share"),
            "host_idle": (summary.get("network") or {}).get("host_idle"),
        })
    rows.sort(key=lambda r: (r["workers"], r["algorithm"], r["slowdown"]))
    return rows


def compare_learning_with_real(real_dir: Path, models: SimModels,
                               out_dir: Path) -> list[dict[str, Any]]:
    """One row per ok real run under `real_dir` whose workload the learning simulator trains:
    its config learned in the simulator along the real run's order of events where its record
    determines it (sim/recorded.py; lockstep protocols: their iterations), else in the
    simulation's own order, and how the two runs' ends compare: final accuracy, and the largest
    difference of a parameter when the real run saved its models (save_models)."""
    import numpy as np

    from hetbench.core.record import run_dirs
    from hetbench.errors import UserError
    from hetbench.sim.engine import simulated_protocol
    from hetbench.sim.learn import LEARNABLE_WORKLOADS, check_learnable
    from hetbench.sim.recorded import recorded_order

    rows = []
    for run_dir in run_dirs(Path(real_dir)):
        try:
            summary = read_json(RunDir(run_dir).summary)
            config = RunConfig.from_dict({**read_json(RunDir(run_dir).config), "learn": True})
        except (OSError, ValueError):
            continue
        if (summary.get("status") != "ok" or summary.get("simulated")
                or config.workload not in LEARNABLE_WORKLOADS):
            continue
        try:
            check_learnable(config, simulated_protocol(config))
        except UserError:
            continue
        protocol = simulated_protocol(config)
        order, followed = None, "its iterations" if protocol.lockstep else "recorded"
        if not protocol.lockstep:
            try:
                order = recorded_order(run_dir, config)
            except UserError:
                followed = "simulated (not in its record)"
        learned = simulate(config, models, out_dir, recorded_order=order)
        difference = None
        saved = [run_dir / f"model.rank{w}.npy" for w in range(config.workers)]
        if all(path.exists() for path in saved):
            difference = max(
                float(np.abs(np.load(path) - np.load(learned.run_dir / path.name)).max())
                for path in saved)
        rows.append({"algorithm": config.algorithm, "workers": config.workers,
                     "slowdown": config.slowdown, "order": followed,
                     "real_accuracy": summary.get("final_test_accuracy"),
                     "learned_accuracy": learned.summary.get("final_test_accuracy"),
                     "max_parameter_difference": difference})
    rows.sort(key=lambda r: (r["workers"], r["algorithm"], r["slowdown"]))
    return rows


def learning_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| algorithm | workers | slowdown | order followed | real final accuracy | "
             "learned | largest parameter difference |", "|---|---:|---|---|---:|---:|---:|"]
    for r in rows:
        difference = r["max_parameter_difference"]
        lines.append(f"| {r['algorithm']} | {r['workers']} | {r['slowdown']} | {r['order']} | "
                     f"{_number(r['real_accuracy'])} | {_number(r['learned_accuracy'])} | "
                     f"{'(models not saved)' if difference is None else f'{difference:.1e}'} |")
    return "\n".join(lines)


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


def markdown(rows: list[dict[str, Any]]) -> str:
    """The rows as a markdown table, with the mean absolute error per slowdown below it; for
    emulated runs, each one's fidelity, late share and host idle time beside it."""
    emulated = any(r.get("fidelity") for r in rows)
    lines = ["| algorithm | workers | slowdown | measured (samples/s) | simulated | error |"
             + (" fidelity | late share | host idle |" if emulated else ""),
             "|---|---:|---|---:|---:|---:|" + ("---|---:|---:|" if emulated else "")]
    for r in rows:
        error = "" if r["error_pct"] is None else f"{r['error_pct']:+.1f}%"
        line = (f"| {r['algorithm']} | {r['workers']} | {r['slowdown']} | "
                f"{r['measured']:.0f} | {r['simulated']:.0f} | {error} |")
        if emulated:
            line += (f" {r.get('fidelity') or ''} | {_percent(r.get('late_share'))} | "
                     f"{_percent(r.get('host_idle'))} |")
        lines.append(line)
    by_slowdown: dict[str, list[float]] = {}
    for r in rows:
        if r["error_pct"] is not None:
            by_slowdown.setdefault(r["slowdown"], []).append(abs(r["error_pct"]))
    lines.append("")
    for slowdown, errors in sorted(by_slowdown.items()):
        within = sum(e <= 15 for e in errors)
        lines.append(f"- {slowdown}: mean |error| {sum(errors) / len(errors):.1f}%, "
                     f"{within}/{len(errors)} within 15%")
    return "\n".join(lines)


def _percent(share: float | None) -> str:
    return "" if share is None else f"{100 * share:.1f}%"
