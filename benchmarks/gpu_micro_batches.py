"""An algorithm's own micro-batches on a GPU against the default one-batch path (issue 54):
what the compute hook (Algorithm.compute) costs there, and what reading its clock costs.

    python3 benchmarks/gpu_micro_batches.py --out DIR [--rounds 2] [--budget-s 150]

Setting: ResNet-18's CIFAR form on synthetic images, batch 128, 2 ranks sharing the GPU over
gloo, no slowdown, no pacing, settled runs (harness_overhead.py's `settled`), sides in rotating
order, each a `bench run`:

- `one-batch`: allreduce (impl = buckets), the harness's own forward and backward;
- `hook-1`: dropcompute with one micro-batch and no threshold (`threshold_ms = inf`: nothing
  reads the clock, so nothing waits; its step is a bucketed all-reduce weighted by samples);
- `hook-4`: the same in 4 micro-batches of 32 (queued without a wait: the cost of smaller
  kernels alone);
- `hook-4-timed`: 4 micro-batches whose clock is read after each (`threshold_ms = 1e9`, never
  met): each read waits for the stream, as DropCompute's live timer must.

Writes DIR/micro_batches.json (each run's throughput, per side the median and mean ratio to
`one-batch` of the same round) after every round. `--device cpu --quick` checks it on a CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness_overhead import settled  # noqa: E402

SIDES = {
    "one-batch": ("allreduce", 'impl = "buckets"'),
    "hook-1": ("dropcompute", "micro_batches = 1\nthreshold_ms = inf"),
    "hook-4": ("dropcompute", "micro_batches = 4\nthreshold_ms = inf"),
    "hook-4-timed": ("dropcompute", "micro_batches = 4\nthreshold_ms = 1e9"),
}


def matrix(side: str, args) -> str:
    algorithm, options = SIDES[side]
    model = "mlp-digits" if args.quick else "resnet18"
    workload_options = "" if args.quick else "synthetic = true\n"
    return (f'name = "micro-batches-{side}"\nalgorithms = ["{algorithm}"]\n'
            f'workloads = ["{model}"]\nworkers = [2]\nslowdown = ["none"]\nseeds = [1]\n'
            f"iterations = {args.iterations}\nwarmup_iterations = 5\n"
            f'device = "{args.device}"\n[algorithm.{algorithm}]\n{options}\n'
            f"[workload.{model}]\nbatch_size = {32 if args.quick else 128}\n"
            f"{workload_options}")


def one_run(side: str, name: str, args) -> dict:
    toml = args.out / f"{name}.toml"
    toml.write_text(matrix(side, args))
    host = settled(args)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "hetbench", "run", str(toml), "--out",
                           str(args.out / name)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed: {done.stdout[-300:]} {done.stderr[-800:]}")
    summary = json.loads(next((args.out / name).glob("*/summary.json")).read_text())
    return {"side": side, "throughput": summary["throughput"],
            "compute_ms": 1e3 * summary["compute_s"] / summary["iterations"],
            "wall_s": round(time.monotonic() - started, 1), **host}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--settle-s", type=float, default=2.0)
    parser.add_argument("--quick", action="store_true", help="the mlp (a CPU check)")
    parser.add_argument("--budget-s", type=float, default=150,
                        help="start no round that would end after this many seconds")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    sides, runs, longest = list(SIDES), [], 0.0
    began = time.monotonic()
    for r in range(args.rounds):
        if r and time.monotonic() - began + longest > args.budget_s:
            break
        round_began = time.monotonic()
        order = sides[r % len(sides):] + sides[:r % len(sides)]
        measured = {side: one_run(side, f"r{r}-{side}", args) for side in order}
        for side, run in measured.items():
            run.update(round=r, ratio=run["throughput"] / measured["one-batch"]["throughput"])
            runs.append(run)
            print(f"round {r} {side}: {run['throughput']:.1f} samples/s, "
                  f"x{run['ratio']:.3f}, compute {run['compute_ms']:.2f} ms", flush=True)
        longest = max(longest, time.monotonic() - round_began)
        summary = {side: {"runs": sum(1 for x in runs if x["side"] == side),
                          "ratio_median": statistics.median(
                              x["ratio"] for x in runs if x["side"] == side),
                          "ratio_of_means": statistics.fmean(
                              x["throughput"] for x in runs if x["side"] == side)
                          / statistics.fmean(x["throughput"] for x in runs
                                             if x["side"] == "one-batch"),
                          "compute_ms_median": statistics.median(
                              x["compute_ms"] for x in runs if x["side"] == side)}
                   for side in sides}
        (args.out / "micro_batches.json").write_text(
            json.dumps({"setting": vars(args) | {"out": str(args.out)}, "runs": runs,
                        "sides": summary}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
