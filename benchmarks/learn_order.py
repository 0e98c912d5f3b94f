"""Issue 37's "same events, same math" for the asynchronous protocols, at 8 workers, and what
the order of events alone does to a time to target.

    .venv/bin/python benchmarks/learn_order.py --out /tmp/learn-order

For every protocol whose record determines its real order (sim/recorded.py: ps-async,
allreduce-backup, prague-smart, prague-random), real runs (mlp-digits, 8 workers, 20 ms
pacing, 300 iterations, the workload's own SGD, models saved), none and prob:5, then two learned
simulations of each: one that follows the real run's recorded order (sim/recorded.py), one
in its own simulated order (the timeline of the default cost model). Per run: how far the
followed simulation's final models are from the real ones, and the mean iteration at which
each of the three first met 85% test accuracy and after which it stayed there.
Writes OUT/learn_order.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from hetbench.core.config import RunConfig
from hetbench.core.store import read_json, read_jsonl
from hetbench.harness.launch.local import LocalLauncher
from hetbench.sim.model import ComputeModel, NetworkModel, SimModels
from hetbench.sim.recorded import learn_along
from hetbench.sim.run import simulate

MODELS = SimModels(NetworkModel(alpha_s=20e-6, beta_bytes_per_s=1.25e9), ComputeModel())
TARGET = 0.85
ALGORITHMS = {"ps-async": {}, "allreduce-backup": {"backup_workers": 1},
              "prague-smart": {"group_size": 2}, "prague-random": {"group_size": 2}}


def crossings(run_dir: Path) -> tuple[float, float]:
    """(mean iteration at which the averaged model first met TARGET: the run's exact search,
    its "target" record; that of the first periodic evaluation after which every one did),
    from eval.jsonl; nan if none."""
    records = read_jsonl(run_dir / "eval.jsonl")[0]
    first = next((r["iteration"] for r in records if r.get("kind") == "target"), math.nan)
    evals = [r for r in records if "test_accuracy" in r and r.get("kind") != "target"]
    evals.sort(key=lambda r: r["wall_s"])
    stays = math.nan
    for i in range(len(evals)):
        if all(r["test_accuracy"] >= TARGET for r in evals[i:]):
            stays = evals[i]["iteration"]
            break
    return first, stays


def models(run_dir: Path, workers: int) -> np.ndarray:
    return np.stack([np.load(run_dir / f"model.rank{w}.npy") for w in range(workers)])


def one(out: Path, algorithm: str, slowdown: str, seed: int) -> dict:
    fields = dict(algorithm=algorithm, algorithm_options=ALGORITHMS[algorithm],
                  workload="mlp-digits", workers=8, iterations=300, pace_ms=20, seed=seed,
                  slowdown=slowdown, save_models=True, eval_interval_s=0.05,
                  target=f"accuracy:{TARGET}")
    config = RunConfig(**fields)
    real_dir = out / "real" / config.run_id
    if not (real_dir / "summary.json").exists() or \
            read_json(real_dir / "summary.json")["status"] != "ok":
        summary = LocalLauncher().run(config, real_dir)
        assert summary["status"] == "ok", summary["cause"]
    followed = learn_along(real_dir, MODELS, out / "followed")
    free = simulate(RunConfig(learn=True, **fields), MODELS, out / "free")
    real_models = models(real_dir, 8)
    gap = float(np.abs(models(followed.run_dir, 8) - real_models).max())
    row = {"algorithm": algorithm, "slowdown": slowdown, "seed": seed,
           "max_abs_model_difference": gap, "max_abs_parameter": float(np.abs(real_models).max()),
           "final_accuracy": {"real": read_json(real_dir / "summary.json")["final_test_accuracy"],
                              "followed": followed.summary["final_test_accuracy"],
                              "free": free.summary["final_test_accuracy"]}}
    for name, run_dir in (("real", real_dir), ("followed", followed.run_dir),
                          ("free", free.run_dir)):
        row[name] = dict(zip(("first", "stays"), crossings(run_dir), strict=True))
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, default=4, help="ps-async's seeds (others: 1)")
    args = parser.parse_args()
    rows = []
    for algorithm in ALGORITHMS:
        for slowdown in ("none", "prob:5"):
            for seed in range(1, (args.seeds if algorithm == "ps-async" else 1) + 1):
                rows.append(one(args.out, algorithm, slowdown, seed))
    (args.out / "learn_order.json").write_text(json.dumps(rows, indent=1))
    print("\n| algorithm | slowdown | seed | max model diff (max param) | first 85%: real / "
          "followed / free | stays >= 85%: real / followed / free |")
    print("|---|---|---:|---|---|---|")
    for r in rows:
        first = " / ".join(f"{r[k]['first']:.1f}" for k in ("real", "followed", "free"))
        stays = " / ".join(f"{r[k]['stays']:.1f}" for k in ("real", "followed", "free"))
        print(f"| {r['algorithm']} | {r['slowdown']} | {r['seed']} | "
              f"{r['max_abs_model_difference']:.1e} ({r['max_abs_parameter']:.2f}) | {first} | "
              f"{stays} |")


if __name__ == "__main__":
    main()
