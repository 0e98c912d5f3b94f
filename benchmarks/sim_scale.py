"""How fast `bench sim` plays large clusters: wall time, peak memory and worker-iterations per
second of one simulated run per algorithm, each in a process of its own.

    .venv/bin/python benchmarks/sim_scale.py --workers 1024 --iterations 1000
    .venv/bin/python benchmarks/sim_scale.py --workers 16384 --iterations 200 \
        --algorithms prague-smart,hop
    .venv/bin/python benchmarks/sim_scale.py --matrix matrices/learn-scale.toml \
        --workers 1024 --iterations 1000 --slowdown none    # learned: svm, evaluations

Setting (issue 20): matrices/sim-scale.toml's workload (ResNet-18's real messages, emulated
100 ms compute) under prob:5, seed 1. The wall time is the whole `bench sim` command (start-up,
building the model for its message sizes, simulating, writing the run directory); the peak
memory is that process's maximum resident set. Results go to
results/benchmarks/sim_scale-<workers>x<iterations>.json (the --out directory).

    .venv/bin/python benchmarks/sim_scale.py --workers 16384 --iterations 40 \
        --algorithms hop --compare /tmp/old --rounds 3    # /tmp/old: git worktree add /tmp/old REV
    .venv/bin/python benchmarks/sim_scale.py --matrix matrices/transport-speed.toml \
        --compare-transport fcfs --algorithms hop,ps-sync --rounds 4    # fair against fcfs
    .venv/bin/python benchmarks/sim_scale.py --matrix matrices/transport-speed.toml \
        --compare-transport fcfs --compare /tmp/old --rounds 2   # ... against fcfs at /tmp/old

Machines of the same kind differ (one took 1.5-2x as long as another for the same code, and one
drifted by half within minutes), so the JSON also records a reference: the seconds a fixed
pure-Python event loop takes on this machine (the best of three), measured before and after the
runs. Compare wall times across machines only with it; a sitting whose two references differ by
more than 15% drifted, and says so.
"""

from __future__ import annotations

import argparse
import datetime
import heapq
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(sys.executable).parent / "bench"
#: Every algorithm bench sim plays.
ALGORITHMS = ("allreduce", "allreduce-backup", "ps-sync", "ps-async", "dpsgd", "adpsgd", "sgp",
              "osgp", "local-sgd", "diloco", "hop", "prague-static", "prague-smart",
              "prague-random")


def simulate(algorithm: str, args: argparse.Namespace, out: str,
             tree: Path | None = None, matrix: Path | None = None) -> dict:
    """One `bench sim` process; `tree`: run that checkout's hetbench (PYTHONPATH) instead;
    `matrix`: that matrix instead of --matrix."""
    command = [str(BENCH), "sim", str(matrix or args.matrix),
               "--algorithms", algorithm, "--workers", str(args.workers),
               "--iterations", str(args.iterations), "--slowdown", args.slowdown,
               "--seeds", "1", "--out", out]
    errors = Path(out) / "stderr.txt"  # a file, not a pipe: nobody reads a pipe during wait4
    started = time.perf_counter()
    with errors.open("w") as stderr:
        env = None if tree is None else {**os.environ, "PYTHONPATH": str(tree)}
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env=env)
        # wait4, not wait: this child's own peak memory (ru_maxrss), not the largest of all.
        _, status, usage = os.wait4(process.pid, 0)
    wall_s = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{algorithm}: bench sim failed: {errors.read_text()[-500:]}")
    (summary,) = Path(out).glob(f"{algorithm}-*/summary.json")
    simulated = json.loads(summary.read_text())
    iterations = simulated["iterations"]
    return {"algorithm": algorithm, "wall_s": wall_s, "sim_s": simulated["sim_s"],
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "peak_rss_mb": usage.ru_maxrss / 1024, "worker_iterations": iterations,
            "worker_iterations_per_s": iterations / wall_s,
            "throughput": simulated["throughput"]}


def reference_s(events: int = 400_000) -> float:
    """Seconds (best of three) of a fixed event loop in pure Python, the simulator's kind of
    work: heap pushes and pops, list and dict updates, float arithmetic."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        heap = [(i * 0.001, i) for i in range(1024)]
        counts = [0] * 1024
        last: dict[int, float] = {}
        for _ in range(events):
            t, w = heapq.heappop(heap)
            counts[w] += 1
            last[w] = t
            heapq.heappush(heap, (t + 0.1 + (w * 7919 % 1000) * 1e-6, w))
        best = min(best, time.perf_counter() - started)
    return best


def with_transport(matrix: Path, transport: str, directory: str) -> Path:
    """A copy of `matrix` (in `directory`) whose [network] table sets `transport`."""
    text, count = re.subn(r'(?m)^transport\s*=\s*"[^"]*"', f'transport = "{transport}"',
                          matrix.read_text())
    if count != 1:
        sys.exit(f"{matrix}: --compare-transport needs one `transport = ...` line in its "
                 f"[network] table, found {count}")
    copy = Path(directory) / f"{matrix.stem}-{transport}.toml"
    copy.write_text(text)
    return copy


def compare(args: argparse.Namespace) -> dict:
    """--compare TREE: each algorithm in TREE's hetbench and in this one; --compare-transport
    NAME: under --matrix and under its copy with that transport (both: TREE's hetbench under
    the copy, e.g. fcfs before the fair transport's work). Alternating for --rounds rounds
    (the first of each pair swapped every round), CPU time (user + system) and wall time of
    each `bench sim` process: the machine's drift hits both alike, and each round's ratio of
    this to compared is taken within the round."""
    with tempfile.TemporaryDirectory() as matrices:
        tree = None if args.compare is None else args.compare.resolve()
        matrix = (None if args.compare_transport is None
                  else with_transport(args.matrix, args.compare_transport, matrices))
        variants = {"compared": (tree, matrix), "this": (ROOT, None)}
        compared = ", ".join(
            ([str(tree)] if tree else [])
            + ([f"transport = {args.compare_transport!r}"] if args.compare_transport else []))
        rows = [compare_one(algorithm, args, variants)
                for algorithm in args.algorithms.split(",")]
    return {"compare": compared, "rounds": args.rounds, "comparisons": rows}


def compare_one(algorithm: str, args: argparse.Namespace, variants: dict) -> dict:
    cpu = {name: [] for name in variants}
    wall = {name: [] for name in variants}
    throughput = {}
    for round_ in range(args.rounds):
        order = list(variants.items()) if round_ % 2 == 0 else list(variants.items())[::-1]
        for name, (tree, matrix) in order:
            with tempfile.TemporaryDirectory() as tmp:
                row = simulate(algorithm, args, tmp, tree, matrix)
            cpu[name].append(row["cpu_s"])
            wall[name].append(row["wall_s"])
            throughput[name] = row["throughput"]
    best = {name: min(times) for name, times in cpu.items()}
    ratios = sorted(t / c for t, c in zip(wall["this"], wall["compared"], strict=True))
    if args.compare_transport is None:  # one model in two trees: a speed change keeps it
        result = f"same throughput: {throughput['compared'] == throughput['this']}"
    else:  # two models, whose throughputs differ by design
        result = (f"throughput this {throughput['this']:.1f}, compared "
                  f"{throughput['compared']:.1f}")
    print(f"{algorithm:17s} CPU s, min / median of {args.rounds}: compared "
          f"{best['compared']:6.2f} / {statistics.median(cpu['compared']):6.2f}, this "
          f"{best['this']:6.2f} / {statistics.median(cpu['this']):6.2f}, "
          f"{best['compared'] / best['this']:.2f}x; wall, this / compared by round: median "
          f"{statistics.median(ratios):.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f}); {result}",
          flush=True)
    return {"algorithm": algorithm, "cpu_s": cpu, "wall_s": wall, "throughput": throughput,
            "wall_ratio_by_round": ratios}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1024)
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--slowdown", default="prob:5")
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks"))
    parser.add_argument("--matrix", type=Path, default=ROOT / "matrices" / "sim-scale.toml",
                        help="the matrix whose workload (and learn, target) every run plays; "
                             "matrices/learn-scale.toml: issue 37's learned speed goal")
    parser.add_argument("--compare", type=Path, metavar="TREE",
                        help="another checkout (e.g. a git worktree of an older commit): CPU "
                             "time of its bench sim against this one's, alternating")
    parser.add_argument("--compare-transport", metavar="NAME",
                        help="the same matrix with [network] transport = NAME: CPU and wall "
                             "time of --matrix's bench sim against it, alternating")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    reference_before = reference_s()
    print(f"reference (fixed pure-Python event loop): {reference_before:.3f} s", flush=True)
    rows, compared = [], {}
    if args.compare is not None or args.compare_transport is not None:
        compared = compare(args)
    else:
        for algorithm in args.algorithms.split(","):
            with tempfile.TemporaryDirectory() as tmp:
                row = simulate(algorithm, args, tmp)
            rows.append(row)
            print(f"{algorithm:17s} {row['wall_s']:7.1f} s  {row['peak_rss_mb']:6.0f} MB  "
                  f"{row['worker_iterations_per_s']:9.0f} worker-iterations/s", flush=True)
    reference_after = reference_s()
    drift = reference_after / reference_before - 1
    print(f"reference after the runs: {reference_after:.3f} s ({drift:+.0%})"
          + ("; the machine drifted during the sitting" if abs(drift) > 0.15 else ""), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    kind = "sim_scale" if not compared else "sim_compare"
    matrix = "" if args.matrix.stem == "sim-scale" else f"{args.matrix.stem}-"
    path = args.out / f"{kind}-{matrix}{args.workers}x{args.iterations}.json"
    path.write_text(json.dumps({
        "benchmark": kind, "workers": args.workers, "iterations": args.iterations,
        "slowdown": args.slowdown, "matrix": str(args.matrix), "runs": rows, **compared,
        "command": " ".join(sys.argv),
        "reference_s": {"before": reference_before, "after": reference_after},
        "time": datetime.datetime.now().isoformat()}, indent=1))
    print(f"-> {path}")


if __name__ == "__main__":
    main()
