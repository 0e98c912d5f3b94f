"""A plain DistributedDataParallel training loop, written as a user would, importing nothing
from hetbench: the yardstick for what the harness costs (benchmarks/harness_overhead.py).

    .venv/bin/python benchmarks/plain_ddp.py --workers 4 --iterations 400 --hidden 128
    python3 benchmarks/plain_ddp.py --device cuda --model resnet18 --workers 2 --batch 128

It trains the same model as hetbench's `mlp-digits` (an MLP 64-hidden-10, batch 32 per worker,
plain SGD) on scikit-learn's digits (all 1797 of them: mlp-digits holds a fifth out for testing,
which changes nothing per iteration), on `--workers` gloo processes with one torch thread each;
or, with `--model resnet18`, the same model as hetbench's `resnet18` (torchvision's ResNet-18,
10 classes, on 32x32 images: 2048 seeded random ones, as its `synthetic = true`; SGD lr 0.05),
on the CPU or on CUDA (`--device cuda`: rank r on GPU r mod the GPU count, so ranks share a GPU
when there are more ranks than GPUs, and DDP runs over gloo, as hetbench then does). Each
iteration indexes a batch on the host and copies it to the device, as a DataLoader loop does;
the loop waits for the device only at the scored window's two ends. It prints one JSON line:
throughput in samples/s, scored as hetbench scores a run (the window from the last worker's
end of warm-up to the first worker's last iteration end; an iteration counts in proportion to
its overlap with it), and CPU time per rank-iteration. The scoring is
written out here again rather than imported, so that no hetbench code path is on either side
of the comparison.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import socket
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


def load_digits() -> tuple[torch.Tensor, torch.Tensor]:
    import sklearn  # the digits file ships with scikit-learn

    path = Path(sklearn.__file__).parent / "datasets" / "data" / "digits.csv.gz"
    with gzip.open(path, "rt") as f:
        data = np.loadtxt(f, delimiter=",", dtype=np.float32)
    return torch.from_numpy(data[:, :-1] / 16.0), torch.from_numpy(data[:, -1].astype(np.int64))


def synthetic_images(samples: int = 2048) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    return torch.randn(samples, 3, 32, 32, generator=g), torch.randint(0, 10, (samples,),
                                                                         generator=g)


def train(rank: int, args: argparse.Namespace, port: int, results) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group("gloo", rank=rank, world_size=args.workers)
    torch.manual_seed(1)
    if args.model == "resnet18":
        from torchvision import models

        x, y = synthetic_images()
        net, lr = models.resnet18(num_classes=10), 0.05
    else:
        x, y = load_digits()
        net, lr = nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(),
                                nn.Linear(args.hidden, 10)), 0.1
    shard = np.random.default_rng(rank).permutation(len(x))[rank::args.workers]
    model = nn.parallel.DistributedDataParallel(
        net.to(device), device_ids=[device] if device.type == "cuda" else None)
    if args.hook:  # DDP's all-reduce through a Python communication hook, as hetbench's is
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        def hook(state, bucket):
            return default_hooks.allreduce_hook(state, bucket)

        model.register_comm_hook(None, hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    spans = []
    position = len(shard)
    # The window's two ends (warm-up's last iteration, the last) are the only places the loop
    # waits for the device: a host clock read there is then the device's too.
    timed_ends = {args.warmup - 1, args.iterations - 1} if device.type == "cuda" else set()
    profile = None
    for i in range(args.iterations):
        if args.profile and rank == 0:  # as hetbench's HETBENCH_PROFILE=START:COUNT does
            profile = profiled(profile, i, args, device)
        t_start = time.time_ns()
        if position + args.batch > len(shard):
            np.random.shuffle(shard)
            position = 0
        index = torch.from_numpy(shard[position:position + args.batch])
        position += args.batch
        optimizer.zero_grad()
        inputs, labels = x[index].to(device), y[index].to(device)
        nn.functional.cross_entropy(model(inputs), labels).backward()
        optimizer.step()
        if i in timed_ends:
            torch.cuda.synchronize(device)
        spans.append((t_start, time.time_ns(), time.process_time()))
    if profile is not None:
        profiled(profile, args.iterations, args, device, stop=True)
    dist.destroy_process_group()
    results[rank] = spans


def profiled(profile, iteration: int, args: argparse.Namespace, device, stop: bool = False):
    """torch.profiler over iterations START..START+COUNT-1 of rank 0 (`--profile START:COUNT`),
    its table written to --profile-dir/profile.plain.rank0.txt: the same view of the plain
    loop that HETBENCH_PROFILE gives of hetbench's, to set them side by side."""
    start, count = (int(v) for v in args.profile.split(":"))
    if profile is None and iteration == start and not stop:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        activities = [ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        profile = torch_profile(activities=activities)
        profile.__enter__()
        return profile
    if profile is not None and (iteration == start + count or stop):
        profile.__exit__(None, None, None)
        sort = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
        out = Path(args.profile_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "profile.plain.rank0.txt").write_text(
            f"plain loop, rank 0, iterations {start}..{start + count - 1}, {device}\n"
            + profile.key_averages().table(sort_by=sort, row_limit=60))
        return None
    return profile


def throughput(spans_by_rank: list[list[tuple[int, int, float]]], batch: int,
               warmup: int) -> float:
    """Samples per second in the window in which every worker was past warm-up and running."""
    t0 = max(spans[warmup - 1][1] for spans in spans_by_rank)
    t1 = min(spans[-1][1] for spans in spans_by_rank)
    samples = 0.0
    for spans in spans_by_rank:
        for start, end, _ in spans:
            overlap = min(end, t1) - max(start, t0)
            if overlap > 0:
                samples += batch * overlap / (end - start)
    return samples / ((t1 - t0) / 1e9)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=400)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--model", choices=["mlp", "resnet18"], default="mlp")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--hook", action="store_true",
                        help="all-reduce through a Python communication hook (torch's "
                             "allreduce_hook), as hetbench's impl = ddp does")
    parser.add_argument("--profile", metavar="START:COUNT",
                        help="torch.profiler over these iterations of rank 0 (not a timing run)")
    parser.add_argument("--profile-dir", default=".", help="where --profile writes its table")
    args = parser.parse_args()
    results = mp.Manager().dict()
    mp.spawn(train, args=(args, free_port(), results), nprocs=args.workers)
    spans = [results[r] for r in range(args.workers)]
    # CPU time of a rank per iteration after warm-up (all its threads), the mean over ranks:
    # on a shared machine less noisy than throughput, and what the ranks compete for.
    cpu_ms = sum((s[-1][2] - s[args.warmup - 1][2]) / (len(s) - args.warmup)
                 for s in spans) / len(spans) * 1e3
    print(json.dumps({"throughput": throughput(spans, args.batch, args.warmup),
                      "cpu_ms_per_iteration": cpu_ms,
                      "workers": args.workers, "iterations": args.iterations,
                      "hidden": args.hidden, "batch": args.batch, "model": args.model,
                      "device": args.device}))


if __name__ == "__main__":
    main()
