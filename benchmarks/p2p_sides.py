"""Issue 44's shared-GPU matrix under several versions of hetbench, in one sitting: what a
change to point to point bought, per algorithm, with the machine's drift spread over the sides.

    PYTHONPATH=. python3 benchmarks/p2p_sides.py --out DIR --side base=.base --side new= \
        --algorithms allreduce,dpsgd,hop,adpsgd --rounds 2 [--budget-s 240]

A side is NAME=DIR, DIR holding a `hetbench` package (empty: this checkout's). Each round runs
the matrix once per side (ResNet-18's CIFAR form on the digits images, batch 32, 4 ranks
sharing the GPU, no slowdown: benchmarks/gpu_check.py's `shared` step), the sides' order
rotating from round to round. Writes DIR/sides.json: per side, round and algorithm the
throughput, its ratio to the same run's All-Reduce, the step's median time and its MB/s (the
rows of gpu_check.shared_table), and prints the medians. `--device cpu --quick` checks the
script on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_check import finish, run_logged_in, shared_table  # noqa: E402


def matrix(device: str, algorithms: list[str], iterations: int, quick: bool) -> str:
    return "\n".join([
        'name = "p2p-sides"', f"algorithms = {json.dumps(algorithms)}",
        'workloads = ["resnet18"]', "workers = [4]", 'slowdown = ["none"]', "seeds = [1]",
        f"iterations = {iterations}", "warmup_iterations = 3", f'device = "{device}"',
        "comm_timeout_s = 60", "[workload.resnet18]", 'dataset = "digits"',
        f"batch_size = {4 if quick else 32}"]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--side", action="append", required=True,
                        help="NAME=DIR: a hetbench package's directory (empty: this checkout)")
    parser.add_argument("--algorithms", default="allreduce,dpsgd,hop,adpsgd")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny batches (a CPU check)")
    parser.add_argument("--budget-s", type=float, default=240,
                        help="start no round that would end after this many seconds")
    args = parser.parse_args(argv)
    algorithms = args.algorithms.split(",")
    if "allreduce" not in algorithms:
        algorithms.insert(0, "allreduce")  # the ratios' denominator
    sides = []
    for spec in args.side:
        name, _, path = spec.partition("=")
        if path and not (Path(path) / "hetbench").is_dir():
            sys.exit(f"--side {spec}: no hetbench package in {path}")
        sides.append((name, Path(path).resolve() if path else None))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "matrix.toml").write_text(matrix(args.device, algorithms, args.iterations,
                                                 args.quick))
    started, round_s = time.monotonic(), None
    rows = []
    for round_index in range(args.rounds):
        left = args.budget_s - (time.monotonic() - started)
        if round_s is not None and round_s > left:
            print(f"round {round_index + 1} skipped: {left:.0f} s left, a round took "
                  f"{round_s:.0f} s", flush=True)
            break
        t0 = time.monotonic()
        order = sides[round_index % len(sides):] + sides[:round_index % len(sides)]
        for name, path in order:
            where = args.out / f"{name}-{round_index + 1}"
            env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(
                filter(None, [str(path) if path else str(ROOT), os.environ.get("PYTHONPATH")]))}
            # From --out, not the checkout: `python -m` would find this checkout's package.
            code = finish(run_logged_in(args.out, [sys.executable, "-m", "hetbench", "run",
                                                   str(args.out / "matrix.toml"), "--out",
                                                   str(where)],
                                        args.out / f"{name}-{round_index + 1}.log", 300, env))
            table = shared_table(where) if code == 0 else []
            for row in table:
                rows.append({"side": name, "round": round_index + 1, **row})
            print(f"{name} round {round_index + 1}: exit {code}; " + ", ".join(
                f"{r['algorithm']} {r['ratio_to_allreduce']:.3f} ({r['median_step_ms']:.1f} ms "
                f"step)" for r in table if r["ratio_to_allreduce"]), flush=True)
        round_s = time.monotonic() - t0
    summary = {}
    for name, _ in sides:
        for algorithm in algorithms:
            mine = [r for r in rows if r["side"] == name and r["algorithm"] == algorithm]
            if mine:
                summary[f"{name} {algorithm}"] = {
                    key: statistics.median(r[key] for r in mine)
                    for key in ("throughput", "ratio_to_allreduce", "median_step_ms",
                                "mb_per_s_in_step") if all(r[key] is not None for r in mine)}
    (args.out / "sides.json").write_text(json.dumps({"rows": rows, "medians": summary},
                                                    indent=1, default=str))
    for key, medians in summary.items():
        print(key, {k: round(v, 3) for k, v in medians.items()})
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
