"""What the harness costs: `bench run` of `allreduce` against a plain DDP loop (plain_ddp.py,
which imports nothing from hetbench), in order-balanced pairs of separate processes.

    .venv/bin/python benchmarks/harness_overhead.py --workers 4,8 --pairs 8
    python3 benchmarks/harness_overhead.py --device cuda --model resnet18 --impl ddp \
        --workers 2 --batch 128 --iterations 150 --pairs 5 [--also OLD_CHECKOUT]

Setting (issue 20): mlp-digits with hidden = 128, batch 32, gloo, one torch thread per worker,
400 iterations, no pacing, and everything `bench run` does by default left on (event logs,
snapshots, evaluation). Half the pairs run the plain loop first, half hetbench first, so drift
in the machine's load and whatever favours one position of a pair falls on both sides. Both are
scored with the same definition of throughput (plain_ddp.py writes it out on its own). Prints
each pair and writes the median and spread of the per-pair ratios to
results/benchmarks/harness_overhead.json (the --out directory).

On a GPU (issue 44): `--device cuda --model resnet18` runs hetbench's `resnet18` (synthetic
images) and plain_ddp.py's same model, ranks sharing the GPU over gloo as both then do.
`--also [NAME=]DIR` (repeatable) puts another side in each round, hetbench as imported from
another checkout (DIR holds its `hetbench` package: an older version, or one with a part taken
out, to measure what a change bought or a part costs in the same sitting); the rounds rotate
the sides' order. `--budget-s` starts no round that would not end within it (a round is
assumed to take as long as the longest so far), and the result file is rewritten after each
round, so a command cut off by its timeout keeps what it measured.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WARMUP = 5  # bench run's default warmup_iterations, and plain_ddp.py's

MATRIX = """name = "harness-overhead"
algorithms = ["allreduce"]
workloads = ["{workload}"]
workers = [{workers}]
slowdown = ["none"]
seeds = [1]
iterations = {iterations}
device = "{device}"
[algorithm.allreduce]
impl = "{impl}"
[workload.{workload}]
batch_size = {batch}
{workload_options}
"""


def run(command: list[str], env: dict | None = None, cwd: str | None = None) -> str:
    """The command's stdout; its stderr's end as the error if it fails."""
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command[:2])} failed: {done.stderr[-500:]}")
    return done.stdout


def host_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all the host's cores since boot (/proc/stat's first line)."""
    fields = [float(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def settled(args: argparse.Namespace) -> dict:
    """Before a run, with --settle-s: wait until no process holds the GPU (the previous run's
    ranks tear their CUDA contexts down after it returned) and then S seconds more. Returns
    what the host looked like: seconds waited, the load average, and the busiest processes."""
    waited = 0.0
    if args.settle_s:
        started = time.monotonic()
        while args.device == "cuda" and time.monotonic() - started < 30:
            apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid",
                                   "--format=csv,noheader"], capture_output=True, text=True)
            if apps.returncode != 0 or not apps.stdout.strip():
                break
            time.sleep(0.5)
        time.sleep(args.settle_s)
        waited = time.monotonic() - started
    busiest = subprocess.run(["ps", "-eo", "pcpu,comm", "--sort=-pcpu", "--no-headers"],
                             capture_output=True, text=True).stdout.splitlines()[:3]
    return {"settle_waited_s": round(waited, 2),
            "loadavg_1min": float(Path("/proc/loadavg").read_text().split()[0]),
            "busiest_before": [line.strip() for line in busiest]}


def measured(side, workers: int) -> dict:
    """One run of a side, with the host's busy cores over it (its own ranks included: a run
    beside something else shows more cores busy than its own ranks use)."""
    busy0, total0 = host_busy()
    started = time.monotonic()
    throughput, cpu_ms = side(workers)
    busy1, total1 = host_busy()
    cores = os.cpu_count() or 1
    return {"throughput": throughput, "cpu_ms": cpu_ms,
            "wall_s": round(time.monotonic() - started, 2),
            "host_busy_cores": round((busy1 - busy0) / max(total1 - total0, 1) * cores, 2)}


def plain(args: argparse.Namespace, workers: int,
          extra: tuple[str, ...] = ()) -> tuple[float, float]:
    """Throughput and CPU milliseconds per rank-iteration of the plain loop."""
    out = run([sys.executable, str(HERE / "plain_ddp.py"), "--workers", str(workers),
               "--iterations", str(args.iterations), "--hidden", str(args.hidden),
               "--batch", str(args.batch), "--model", args.model, "--device", args.device,
               *extra])
    result = json.loads(out.splitlines()[-1])
    return result["throughput"], result["cpu_ms_per_iteration"]


def hetbench(args: argparse.Namespace, workers: int,
             path: Path | None = None) -> tuple[float, float]:
    """Throughput and CPU milliseconds per rank-iteration (events' process_cpu_s after
    warm-up) of `bench run`; with `path`, of the hetbench package found there."""
    workload, options = (("resnet18", "synthetic = true") if args.model == "resnet18"
                         else ("mlp-digits", f"hidden = {args.hidden}"))
    env = None
    if path is not None:  # from elsewhere, or `python -m` finds this checkout's package first
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [str(path.resolve()), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory() as tmp:
        cwd = tmp if path is not None else None
        matrix = Path(tmp) / "matrix.toml"
        matrix.write_text(MATRIX.format(workers=workers, iterations=args.iterations,
                                        workload=workload, workload_options=options,
                                        batch=args.batch, device=args.device, impl=args.impl))
        run([sys.executable, "-m", "hetbench", "run", str(matrix), "--out", f"{tmp}/out"],
            env, cwd)
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
    parser.add_argument("--model", choices=["mlp", "resnet18"], default="mlp")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--impl", choices=["buckets", "ddp"], default="buckets",
                        help="hetbench allreduce's impl (plain_ddp.py is always DDP)")
    parser.add_argument("--also", action="append", default=[], metavar="[NAME=]DIR",
                        help="a directory holding another hetbench package: a side more "
                             "(repeatable; NAME defaults to 'also')")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="start no round that would not end within this many seconds")
    parser.add_argument("--plain-hook", action="store_true",
                        help="a side more: the plain loop with a Python communication hook")
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks"))
    parser.add_argument("--settle-s", type=float, default=0.0,
                        help="before each run, wait until no process holds the GPU, then this "
                             "many seconds (the runs' order effects; issue 44)")
    parser.add_argument("--name", default="harness_overhead",
                        help="the result file's name (without .json)")
    args = parser.parse_args()
    results = []
    sides = {"plain": lambda w: plain(args, w), "hetbench": lambda w: hetbench(args, w)}
    others = {}
    for spec in args.also:
        name, _, path = spec.rpartition("=")
        others[name or "also"] = Path(path)
    for name, path in others.items():
        if name in ("plain", "hetbench", "plain_hook") or not (path / "hetbench").is_dir():
            sys.exit(f"--also {name}={path}: a new side's name, and a directory holding a "
                     "hetbench package")
        sides[name] = lambda w, path=path: hetbench(args, w, path)
    started = time.monotonic()
    if args.plain_hook:
        sides["plain_hook"] = lambda w: plain(args, w, ("--hook",))
    for workers in [int(w) for w in args.workers.split(",")]:
        pairs = []
        longest_round_s = 0.0
        for i in range(args.pairs):
            spent = time.monotonic() - started
            if args.budget_s is not None and spent + longest_round_s > args.budget_s:
                print(f"w={workers}: budget: {spent:.0f} s spent, a round takes "
                      f"{longest_round_s:.0f} s; stopping after {i} rounds", flush=True)
                break
            round_started = time.monotonic()
            names = list(sides)
            order = names[i % len(names):] + names[:i % len(names)]
            runs = {}
            for name in order:
                host = settled(args)
                runs[name] = {**host, **measured(sides[name], workers)}
            measured_ = {name: (run["throughput"], run["cpu_ms"]) for name, run in runs.items()}
            (p, p_cpu), (h, h_cpu) = measured_["plain"], measured_["hetbench"]
            pair = {"plain": p, "hetbench": h, "ratio": h / p, "plain_cpu_ms": p_cpu,
                    "hetbench_cpu_ms": h_cpu, "first": order[0], "order": order, "runs": runs}
            line = (f"w={workers} round {i} ({', '.join(order)}): plain {p:8.1f}  hetbench "
                    f"{h:8.1f} samples/s  ratio {h / p:.3f}")
            if "plain_hook" in measured_:
                ph, ph_cpu = measured_["plain_hook"]
                pair.update(plain_hook=ph, plain_hook_ratio=ph / p, plain_hook_cpu_ms=ph_cpu)
                line += f"   plain+hook {ph:8.1f} ratio {ph / p:.3f}"
            for name in others:
                a, a_cpu = measured_[name]
                pair.update({name: a, f"{name}_ratio": a / p, f"{name}_cpu_ms": a_cpu})
                line += f"   {name} {a:8.1f} ratio {a / p:.3f}"
            pairs.append(pair)
            longest_round_s = max(longest_round_s, time.monotonic() - round_started)
            print(line + f"   CPU per rank-iteration: plain {p_cpu:.3f} ms, hetbench "
                  f"{h_cpu:.3f} ms; host cores busy " + ", ".join(
                      f"{name} {run['host_busy_cores']}" for name, run in runs.items()),
                  flush=True)
            write(args, [*results, summarized(args, workers, pairs, others)])
        if pairs:
            row = summarized(args, workers, pairs, others)
            results.append(row)
            print(f"w={workers}: median ratio {row['median_ratio']:.3f} "
                  f"(min {row['min_ratio']:.3f}, max {row['max_ratio']:.3f}, "
                  f"IQR {row['iqr'][0]:.3f}-{row['iqr'][1]:.3f})" + "".join(
                      f"; {name}: median ratio {row[f'{name}_median_ratio']:.3f}"
                      for name in [*others, *(["plain_hook"] if args.plain_hook else [])]),
                  flush=True)
    write(args, results)


def summarized(args: argparse.Namespace, workers: int, pairs: list[dict], others) -> dict:
    """The rounds of one worker count: median and spread of hetbench / plain, and the median
    ratio of each other side to plain."""
    ratios = sorted(pair["ratio"] for pair in pairs)
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    row = {"workers": workers, "pairs": pairs, "median_ratio": statistics.median(ratios),
           "min_ratio": ratios[0], "max_ratio": ratios[-1],
           "iqr": [quartiles[0], quartiles[2]],
           "median_cpu_ms": {side: statistics.median(pair[f"{side}_cpu_ms"] for pair in pairs)
                             for side in ("plain", "hetbench", *others)}}
    for name in [*others, *(["plain_hook"] if args.plain_hook else [])]:
        row[f"{name}_median_ratio"] = statistics.median(pair[f"{name}_ratio"] for pair in pairs)
    return row


def write(args: argparse.Namespace, results: list[dict]) -> None:
    """The result file, whole (rewritten atomically after each round)."""
    if str(HERE.parent) not in sys.path:  # this checkout's hetbench, installed or not
        sys.path.insert(0, str(HERE.parent))
    from hetbench.core.store import write_json_atomic

    write_json_atomic(args.out / f"{args.name}.json", {
        "benchmark": "harness_overhead", "iterations": args.iterations, "hidden": args.hidden,
        "batch": args.batch, "model": args.model, "device": args.device, "impl": args.impl,
        "settle_s": args.settle_s, "also": args.also,
        "results": results, "command": " ".join(sys.argv),
        "time": datetime.datetime.now().isoformat()})


if __name__ == "__main__":
    main()
