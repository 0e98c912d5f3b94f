"""What the harness costs: `bench run` of `allreduce` against a plain DDP loop (plain_ddp.py,
which imports nothing from hetbench), in order-balanced pairs of separate processes.

    .venv/bin/python benchmarks/harness_overhead.py --workers 4,8 --pairs 8

Setting (issue 20): mlp-digits with hidden = 128, batch 32, gloo, one torch thread per worker,
400 iterations, no pacing, and everything `bench run` does by default left on (event logs,
snapshots, evaluation). Half the pairs run the plain loop first, half hetbench first, so drift
in the machine's load and whatever favours one position of a pair falls on both sides. Both are
scored with the same definition of throughput (plain_ddp.py writes it out on its own). Prints
each pair and writes the median and spread of the per-pair ratios to
results/benchmarks/harness_overhead.json (the --out directory).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
WARMUP = 5  # bench run's default warmup_iterations, and plain_ddp.py's

MATRIX = """name = "harness-overhead"
algorithms = ["allreduce"]
workloads = ["mlp-digits"]
workers = [{workers}]
slowdown = ["none"]
seeds = [1]
iterations = {iterations}
[workload.mlp-digits]
hidden = {hidden}
batch_size = {batch}
"""


def run(command: list[str]) -> str:
    """The command's stdout; its stderr's end as the error if it fails."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command[:2])} failed: {done.stderr[-500:]}")
    return done.stdout


def plain(args: argparse.Namespace, workers: int) -> tuple[float, float]:
    """Throughput and CPU milliseconds per rank-iteration of the plain loop."""
    out = run([sys.executable, str(HERE / "plain_ddp.py"), "--workers", str(workers),
               "--iterations", str(args.iterations), "--hidden", str(args.hidden),
               "--batch", str(args.batch)])
    result = json.loads(out.splitlines()[-1])
    return result["throughput"], result["cpu_ms_per_iteration"]


def hetbench(args: argparse.Namespace, workers: int) -> tuple[float, float]:
    """Throughput and CPU milliseconds per rank-iteration (events' process_cpu_s after
    warm-up) of `bench run`."""
    with tempfile.TemporaryDirectory() as tmp:
        matrix = Path(tmp) / "matrix.toml"
        matrix.write_text(MATRIX.format(workers=workers, iterations=args.iterations,
                                        hidden=args.hidden, batch=args.batch))
        run([str(BIN / "bench"), "run", str(matrix), "--out", f"{tmp}/out"])
        (summary,) = Path(tmp, "out").glob("*/summary.json")
        cpu = [json.loads(line)["process_cpu_s"]
               for events in summary.parent.glob("events.rank*.jsonl")
               for line in events.read_text().splitlines()[WARMUP:]]
        return json.loads(summary.read_text())["throughput"], statistics.mean(cpu) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="4,8", help="comma-separated worker counts")
    parser.add_argument("--pairs", type=int, default=8, help="pairs per worker count (even)")
    parser.add_argument("--iterations", type=int, default=400)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks"))
    args = parser.parse_args()
    results = []
    for workers in [int(w) for w in args.workers.split(",")]:
        pairs = []
        for i in range(args.pairs):
            if i % 2 == 0:
                (p, p_cpu), (h, h_cpu) = plain(args, workers), hetbench(args, workers)
            else:
                (h, h_cpu), (p, p_cpu) = hetbench(args, workers), plain(args, workers)
            pairs.append({"plain": p, "hetbench": h, "ratio": h / p,
                          "plain_cpu_ms": p_cpu, "hetbench_cpu_ms": h_cpu,
                          "first": "plain" if i % 2 == 0 else "hetbench"})
            print(f"w={workers} pair {i}: plain {p:8.1f}  hetbench {h:8.1f} samples/s  "
                  f"ratio {h / p:.3f}   CPU per rank-iteration: plain {p_cpu:.3f} ms, "
                  f"hetbench {h_cpu:.3f} ms", flush=True)
        ratios = sorted(pair["ratio"] for pair in pairs)
        quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        row = {"workers": workers, "pairs": pairs, "median_ratio": statistics.median(ratios),
               "min_ratio": ratios[0], "max_ratio": ratios[-1],
               "iqr": [quartiles[0], quartiles[2]],
               "median_cpu_ms": {side: statistics.median(pair[f"{side}_cpu_ms"] for pair in pairs)
                                 for side in ("plain", "hetbench")}}
        results.append(row)
        print(f"w={workers}: median ratio {row['median_ratio']:.3f} "
              f"(min {ratios[0]:.3f}, max {ratios[-1]:.3f}, "
              f"IQR {quartiles[0]:.3f}-{quartiles[2]:.3f})", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "harness_overhead.json").write_text(json.dumps({
        "benchmark": "harness_overhead", "iterations": args.iterations, "hidden": args.hidden,
        "batch": args.batch, "results": results, "command": " ".join(sys.argv),
        "time": datetime.datetime.now().isoformat()}, indent=1))


if __name__ == "__main__":
    main()
