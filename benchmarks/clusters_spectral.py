"""Issue 46's theory check on the nonlinear workload: D-PSGD on a ring, the exponential graph and
the one-peer exponential graph against All-Reduce, 16 to 1,024 workers, mlp-clusters.

    .venv/bin/python benchmarks/clusters_spectral.py --out results/benchmarks/clusters-spectral

`bench sim --learn` plays the four (lockstep: no timing enters the math) for 1,000 iterations at
16, 64, 256 and 1,024 workers, the workload's defaults (MLP 32-64-10, batch 16, SGD lr 0.1, no
momentum), target 80% test accuracy (docs/results/2026-11-26-clusters-target.md), evaluated
every 50 iterations (consensus distance: the workers' mean squared distance from their
average). For each graph and size it reads the consensus distance during training, the
iteration at which the averaged model met the target (exact to the iteration) and the final
accuracy, and sets them beside the graph's spectral gap, 1 - |lambda_2| of its mixing matrix
W (uniform weights over the closed neighbourhood), and two spectral sums of W's non-consensus
eigenvalues (as benchmarks/learn_spectral.py derives them): after K steps, gradient noise
independent across steps leaves N(n, K) = (1/n) sum_j (1 - l_j^2K) / (1 - l_j^2) of consensus
distance per unit of it, a disagreement that persists (the shards' own gradients) leaves
H(n, K) = (1/n) sum_j ((1 - l_j^K) / (1 - l_j))^2. The one-peer exponential graph's W changes
every iteration; for n a power of two, log2(n) consecutive rounds average exactly, so its
consensus error does not build up across rounds (no single spectral gap describes it; the
row says so). Writes OUT/spectral.json and prints markdown tables.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hetbench.algorithms import topologies  # noqa: E402

BENCH = Path(sys.executable).parent / "bench"
SIZES = (16, 64, 256, 1024)
GRAPHS = ("ring", "exponential", "one-peer-exponential")
TARGET = 0.80


def eigenvalues(graph: str, n: int) -> np.ndarray | None:
    """W's eigenvalues but the consensus one, for a static circulant graph with uniform weights
    over the closed neighbourhood (None: time-varying)."""
    if graph in topologies.TIME_VARYING:
        return None
    peers = topologies.build(graph, n)[0]
    row = np.zeros(n)
    row[0] = 1.0
    row[list(peers)] = 1.0
    row /= len(peers) + 1
    values = np.sort(np.real(np.fft.fft(row)))  # symmetric row: real eigenvalues
    return values[:-1]  # the largest is the consensus eigenvalue, 1


def noise_term(values: np.ndarray, k: int) -> float:
    v = values[np.abs(values) < 1 - 1e-12]
    return float(np.sum((1 - v ** (2 * k)) / (1 - v * v)) / (len(values) + 1))


def persistent_term(values: np.ndarray, k: int) -> float:
    v = values[np.abs(values) < 1 - 1e-12]
    return float(np.sum(((1 - v ** k) / (1 - v)) ** 2) / (len(values) + 1))


def read_run(run_dir: Path) -> dict:
    records = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    snapshots = [r for r in records if r["kind"] == "snapshot"]
    target = next((r for r in records if r["kind"] == "target"), None)
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"target_iteration": target and target["iteration"],
            "final_accuracy": summary["final_test_accuracy"],
            "final_consensus": summary["final_consensus_distance"],
            "mean_consensus": summary["mean_consensus_distance"],
            "curve": [(r["iteration"], r["consensus_distance"], r["test_accuracy"])
                      for r in snapshots]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path,
                        default=ROOT / "results/benchmarks/clusters-spectral")
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    matrix = args.out / "spectral.toml"
    # pace 10 ms and evaluations every 0.5 simulated s: one every 50 iterations.
    matrix.write_text(
        'name = "clusters-spectral"\nalgorithms = ["allreduce", "dpsgd"]\n'
        f'workloads = ["mlp-clusters"]\nworkers = {sizes}\niterations = {args.iterations}\n'
        f'pace_ms = 10\neval_interval_s = 0.5\nlearn = true\ntarget = "accuracy:{TARGET}"\n'
        f'[algorithm.dpsgd]\ntopology = {list(GRAPHS)}\nweights = "uniform"\n'.replace("'", '"'))
    subprocess.run([str(BENCH), "sim", str(matrix), "--out", str(args.out / "sim")], check=True)
    runs = {}
    for run in sorted((args.out / "sim").iterdir()):
        if run.is_dir() and (run / "summary.json").is_file():
            config = json.loads((run / "config.json").read_text())
            graph = (config["algorithm_options"].get("topology")
                     if config["algorithm"] == "dpsgd" else "all-reduce")
            runs[(graph, config["workers"])] = read_run(run)
    k = args.iterations
    rows = []
    for graph in (*GRAPHS, "all-reduce"):
        for n in sizes:
            run = runs[(graph, n)]
            base = runs[("all-reduce", n)]["target_iteration"]
            values = eigenvalues(graph, n) if graph != "all-reduce" else None
            row = {"graph": graph, "workers": n, **run,
                   "iterations_vs_allreduce": (run["target_iteration"] / base
                                               if run["target_iteration"] and base else None)}
            if values is not None:
                row.update(spectral_gap=1 - float(np.max(np.abs(values))),
                           noise_term=noise_term(values, k),
                           persistent_term=persistent_term(values, k))
            rows.append(row)
    (args.out / "spectral.json").write_text(json.dumps(rows, indent=1))
    print(markdown(rows, sizes))


def markdown(rows: list[dict], sizes: list[int]) -> str:
    def num(value, fmt):
        return "-" if value is None or (isinstance(value, float) and math.isnan(value)) \
            else format(value, fmt)

    lines = ["| graph | workers | spectral gap | N(n, K) | H(n, K) | iteration at 80% | "
             "vs All-Reduce | final accuracy | mean consensus | final consensus |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['graph']} | {r['workers']} | {num(r.get('spectral_gap'), '.2e')} | "
            f"{num(r.get('noise_term'), '.3g')} | {num(r.get('persistent_term'), '.3g')} | "
            f"{num(r['target_iteration'], '.0f') if r['target_iteration'] else 'not met'} | "
            f"{num(r['iterations_vs_allreduce'], '.2f')} | {r['final_accuracy']:.3f} | "
            f"{num(r['mean_consensus'], '.3e')} | {num(r['final_consensus'], '.3e')} |")
    lines += ["", "Consensus distance during training (iteration: distance):", ""]
    for r in rows:
        if r["graph"] == "all-reduce":
            continue
        curve = ", ".join(f"{it:.0f}: {c:.2e}" for it, c, _ in r["curve"][::4])
        lines.append(f"- {r['graph']} at {r['workers']}: {curve}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
