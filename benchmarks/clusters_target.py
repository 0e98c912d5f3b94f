"""Which target no single worker's shard of mlp-clusters reaches alone (issue 46): for each
world size, one worker trains alone on its own shard (its real minibatch stream, batch 16) for
the study's budget, and All-Reduce's math (one model, the union of every worker's batches at
that step) trains beside it; both are evaluated every EVERY iterations on the test set.

    python benchmarks/clusters_target.py --out docs/results/clusters-target.json

A target the lone workers never reach and All-Reduce does is one that only synchronization
can reach: the world-size study's time to target then measures what consensus buys.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hetbench.core.config import RunConfig  # noqa: E402

EVERY = 50


def curve(workload, model, batches, iterations: int) -> list[float]:
    optimizer = workload.make_optimizer(model)
    accuracies = []
    for k in range(1, iterations + 1):
        x, y = next(batches)
        optimizer.zero_grad()
        workload.loss(model, (x, y)).backward()
        optimizer.step()
        if k % EVERY == 0:
            accuracies.append(workload.evaluate(model)["test_accuracy"])
    return accuracies


class Union:
    """The batches of `workers` workers' streams at one step, as one batch (All-Reduce's mean
    gradient is the gradient of the mean loss over their union: equal batch sizes)."""

    def __init__(self, workload, workers: int):
        self.streams = [workload.train_batches(w, workers) for w in range(workers)]

    def __next__(self):
        parts = [next(s) for s in self.streams]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs/results/clusters-target.json")
    parser.add_argument("--workers", default="16,64,256,1024")
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for workers in map(int, args.workers.split(",")):
        config = RunConfig(algorithm="allreduce", workload="mlp-clusters", workers=workers,
                           iterations=args.iterations, seed=args.seed,
                           workload_options={"batch_size": 16})
        workload = config.workload_class()(config.workload_config(), config.seed)
        start = time.perf_counter()
        torch.manual_seed(args.seed)
        alone = curve(workload, workload.build_model(), workload.train_batches(0, workers),
                      args.iterations)
        torch.manual_seed(args.seed)
        together = curve(workload, workload.build_model(), Union(workload, workers),
                         args.iterations)
        row = {"workers": workers, "shard_samples": 65536 // workers,
               "alone_best": max(alone), "alone": alone,
               "allreduce_best": max(together), "allreduce": together,
               "seconds": time.perf_counter() - start}
        print(f"{workers} workers: one shard alone best {row['alone_best']:.3f}, all-reduce "
              f"best {row['allreduce_best']:.3f} ({row['seconds']:.0f} s)", flush=True)
        rows.append(row)
    args.out.write_text(json.dumps({"every": EVERY, "iterations": args.iterations,
                                    "seed": args.seed, "rows": rows}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
