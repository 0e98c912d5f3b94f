"""Point to point through host memory, at the speed the host allows? Two ranks sharing one GPU
over gloo (as hetbench runs them), one message of a model's size, every way it can travel.

    python3 benchmarks/staged_bandwidth.py --out staged_bandwidth.json         # on the GPU
    .venv/bin/python benchmarks/staged_bandwidth.py --device cpu --mb 4         # its own check

Each figure is the median over --reps after two warm-ups, as MB/s (1e6 bytes) of one message
(one way; round trips halved):

- host_p2p: gloo send/recv of a host tensor (no GPU): the loopback transport's ceiling;
- d2h_pinned, h2d_pinned, d2h_pageable: one copy alone, GPU <-> host;
- staged_pingpong: Comm.send/recv of the CUDA tensor (comm/staging.py: pinned, reused buffers,
  the outgoing copy on a side stream), round trip halved;
- staged_pipelined: 8 isends back to back from 8 tensors, the receiver's 8 irecvs (each copy
  to the host overlaps the previous message's send), first post to last delivery;
- pageable_pingpong: the way before issue 44 (a new pageable host copy per message, received
  into a new pageable tensor, then copied), round trip halved;
- allreduce: gloo's own all-reduce of the CUDA tensor (its CUDA path), MB of the buffer per
  second of one all-reduce (algorithm bandwidth).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _timed(fn, reps: int, sync) -> list[float]:
    times = []
    for i in range(reps + 2):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return times


def rank_main(rank: int, args, port: int, results) -> None:
    from hetbench.comm.comm import Comm

    torch.set_num_threads(1)
    device = torch.device(args.device if args.device == "cpu" else "cuda:0")
    comm = Comm.connect(rank, 2, "127.0.0.1", port, device, timeout_s=120)
    comm.stages_through_host = True  # as on CUDA over gloo; a CPU check forces it
    numel = int(args.mb * 1e6 / 4)
    nbytes = numel * 4
    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    tensor = torch.randn(numel, device=device)
    host = torch.randn(numel)
    peer = 1 - rank
    out: dict[str, float] = {}

    def pingpong(send, recv):
        def once():
            if rank == 0:
                send()
                recv()
            else:
                recv()
                send()
        return [t / 2 for t in _timed(once, args.reps, sync)]

    out["host_p2p"] = pingpong(lambda: dist.send(host, peer), lambda: dist.recv(host, peer))
    if cuda:
        pinned = torch.empty(numel, pin_memory=True)
        out["d2h_pinned"] = _timed(lambda: pinned.copy_(tensor, non_blocking=True),
                                   args.reps, sync)
        out["h2d_pinned"] = _timed(lambda: tensor.copy_(pinned, non_blocking=True),
                                   args.reps, sync)
        out["d2h_pageable"] = _timed(lambda: tensor.to("cpu"), args.reps, sync)
    comm.barrier()
    out["staged_pingpong"] = pingpong(lambda: comm.send(tensor, peer),
                                      lambda: comm.recv(tensor, peer))

    def pageable_send():
        dist.send(tensor.detach().to("cpu", copy=True), peer)

    def pageable_recv():
        into = torch.empty(tensor.shape, dtype=tensor.dtype)
        dist.recv(into, peer)
        tensor.copy_(into)

    comm.barrier()
    out["pageable_pingpong"] = pingpong(pageable_send, pageable_recv)

    messages = [torch.randn(numel, device=device) for _ in range(8)]
    ack = torch.zeros(1, device=device)

    def pipelined():
        if rank == 0:
            works = [comm.isend(m, 1, tag=k) for k, m in enumerate(messages)]
            for work in works:
                work.wait()
            comm.recv(ack, 1, tag=99)
        else:
            works = [comm.irecv(m, 0, tag=k) for k, m in enumerate(messages)]
            for work in works:
                work.wait()
            sync()
            comm.send(ack, 0, tag=99)

    comm.barrier()
    out["staged_pipelined"] = [t / len(messages) for t in _timed(pipelined, args.reps, sync)]
    comm.barrier()
    out["allreduce"] = _timed(lambda: dist.all_reduce(tensor), args.reps, sync)
    comm.close()
    if rank == 0:
        results["rows"] = {name: {"median_ms": statistics.median(t) * 1e3,
                                  "mb_per_s": nbytes / 1e6 / statistics.median(t)}
                           for name, t in out.items()}
        results["nbytes"] = nbytes
        results["staging_buffers_allocated"] = comm.staging.allocated


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--mb", type=float, default=44.7,
                        help="message size in MB (default: ResNet-18's CIFAR form, 11.17M "
                             "float32 parameters)")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=120),
                          wait_for_workers=False)
    port = store.port
    results = mp.Manager().dict()
    mp.spawn(rank_main, args=(args, port, results), nprocs=2)
    del store
    record = {"benchmark": "staged_bandwidth", "device": args.device, "mb": args.mb,
              "nbytes": results["nbytes"], "reps": args.reps, "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
              "staging_buffers_allocated": results["staging_buffers_allocated"],
              "rows": dict(results["rows"])}
    for name, row in record["rows"].items():
        print(f"{name:18s} {row['median_ms']:9.2f} ms  {row['mb_per_s']:9.0f} MB/s")
    if args.out:
        args.out.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
