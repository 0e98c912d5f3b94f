"""What a per-collective arrival stamp would cost (issue 33's decision to infer a collective's
wait from the arrival stamps the harness logs, rather than have Comm exchange one per
operation): plain gloo all-reduces of an mlp-digits-sized tensor after a paced sleep, against
the same with a 1-element MAX all-reduce of the arrival time before each, alternating arms,
three runs each, median ms per iteration.

    .venv/bin/python benchmarks/stamp_cost.py 4 4810
    .venv/bin/python benchmarks/stamp_cost.py 8 4810
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ITERATIONS = 400
PACE_S = 0.010


def rank_main(rank: int, world: int, numel: int, stamped: bool, results, port: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    tensor = torch.ones(numel)
    stamp = torch.zeros(1, dtype=torch.float64)
    for _ in range(20):  # warm-up
        dist.all_reduce(tensor)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(ITERATIONS):
        time.sleep(PACE_S)
        if stamped:
            stamp[0] = time.time()
            dist.all_reduce(stamp, op=dist.ReduceOp.MAX)
        dist.all_reduce(tensor)
    if rank == 0:
        results.put((time.perf_counter() - start) / ITERATIONS * 1000)
    dist.destroy_process_group()


def main() -> None:
    world, numel = int(sys.argv[1]), int(sys.argv[2])
    port, found = 29700, {False: [], True: []}
    for _ in range(3):
        for stamped in (False, True):
            port += 1
            results = mp.get_context("spawn").SimpleQueue()
            mp.start_processes(rank_main, args=(world, numel, stamped, results, port),
                               nprocs=world, start_method="spawn")
            found[stamped].append(results.get())
    plain, stamped = statistics.median(found[False]), statistics.median(found[True])
    print(f"{world} ranks, {numel} floats, {PACE_S * 1000:g} ms paced: plain {plain:.2f} "
          f"ms/iter, with a stamp all-reduce {stamped:.2f} ms/iter: +{stamped - plain:.2f} ms "
          f"({(stamped / plain - 1) * 100:.1f}%)")


if __name__ == "__main__":
    main()
