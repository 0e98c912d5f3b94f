"""hetbench's `allreduce` against a plain hand-written torch DDP loop, run side by side.

    .venv/bin/python benchmarks/allreduce_vs_ddp.py --workload mlp-digits --workers 4 \
        --iterations 300 --repeats 3

Both train the same workload (same model, data shards, batch size, optimizer) on the same number
of gloo workers for the same iterations, in pairs whose order alternates so machine noise hits
both alike. Both are scored with the same metric (hetbench.core.metrics.throughput over
per-iteration times). The ratio hetbench / plain is what the harness costs. `--impl ddp` runs
hetbench's allreduce on torch DDP, the plain loop's own all-reduce, so that the ratio is the
harness alone; the default (buckets) also includes the implementation's difference. Writes
results/benchmarks/allreduce_vs_ddp.json (the --out directory).
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hetbench.core.config import RunConfig
from hetbench.core.metrics import throughput
from hetbench.core.store import environment, write_json_atomic
from hetbench.harness.launch.local import LocalLauncher

WARMUP = 5


def _plain_rank(rank: int, workers: int, port: int, config_dict: dict, queue) -> None:
    """The loop a user would write by hand: DDP, forward, backward, step."""
    torch.set_num_threads(1)
    config = RunConfig.from_dict(config_dict)
    store = dist.TCPStore("127.0.0.1", port, None, False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=workers)
    workload = config.workload_class()(config.workload_config(), config.seed)
    torch.manual_seed(config.seed)
    model = torch.nn.parallel.DistributedDataParallel(workload.build_model())
    optimizer = workload.make_optimizer(model)
    batches = workload.train_batches(rank, workers)
    dist.barrier()
    events = []
    for _ in range(config.iterations):
        t_start = time.time_ns()
        x, y = next(batches)
        optimizer.zero_grad()
        workload.loss(model, (x, y)).backward()
        optimizer.step()
        events.append({"t_start": t_start, "t_end": time.time_ns(), "samples": len(x)})
    dist.destroy_process_group()
    queue.put((rank, events))


def plain_ddp(config: RunConfig) -> float:
    store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    ctx = mp.get_context("forkserver")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_plain_rank,
                         args=(r, config.workers, store.port, config.to_dict(), queue))
             for r in range(config.workers)]
    for p in procs:
        p.start()
    events = dict(queue.get(timeout=600) for _ in procs)
    for p in procs:
        p.join()
    return throughput(events, WARMUP)


def hetbench_allreduce(config: RunConfig) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        summary = LocalLauncher().run(config, Path(tmp) / config.run_id)
    if summary["status"] != "ok":
        sys.exit(f"hetbench run failed: {summary['cause']}")
    return summary["throughput"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="mlp-digits")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--impl", default="buckets", choices=["buckets", "ddp"],
                        help="hetbench allreduce implementation (option impl)")
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks"))
    args = parser.parse_args()
    config = RunConfig(algorithm="allreduce", workload=args.workload, workers=args.workers,
                       iterations=args.iterations, warmup_iterations=WARMUP,
                       algorithm_options={"impl": args.impl})
    rows = []
    for repeat in range(args.repeats):
        # The order alternates, so that whatever favours the first (or second) run of a pair
        # (drift in the machine's load, caches, the forkserver's start) falls on both sides.
        if repeat % 2 == 0:
            plain = plain_ddp(config)
            ours = hetbench_allreduce(config)
        else:
            ours = hetbench_allreduce(config)
            plain = plain_ddp(config)
        rows.append({"repeat": repeat, "plain_ddp": plain, "hetbench": ours,
                     "ratio": ours / plain, "first": "plain" if repeat % 2 == 0 else "hetbench"})
        print(f"repeat {repeat}: plain DDP {plain:9.1f} samples/s   hetbench {ours:9.1f} "
              f"samples/s   ratio {ours / plain:.3f}", flush=True)
    plain_mean = statistics.mean(r["plain_ddp"] for r in rows)
    ours_mean = statistics.mean(r["hetbench"] for r in rows)
    result = {
        "benchmark": "allreduce_vs_ddp", "workload": args.workload, "workers": args.workers,
        "iterations": args.iterations, "impl": args.impl, "repeats": rows,
        "plain_ddp_mean": plain_mean,
        "hetbench_mean": ours_mean, "ratio_of_means": ours_mean / plain_mean,
        # Each pair ran back to back; the median of the pairs' ratios shrugs off a burst of
        # outside load that hits one run of a pair (this 2-core machine shares its host).
        "median_ratio": statistics.median(r["ratio"] for r in rows),
        "command": " ".join(sys.argv), "env": environment(),
        "time": datetime.datetime.now().isoformat(),
    }
    write_json_atomic(args.out / "allreduce_vs_ddp.json", result)
    print(f"mean: plain DDP {plain_mean:.1f}, hetbench {ours_mean:.1f} samples/s, "
          f"ratio {ours_mean / plain_mean:.3f}; median of paired ratios "
          f"{result['median_ratio']:.3f}")


if __name__ == "__main__":
    main()
