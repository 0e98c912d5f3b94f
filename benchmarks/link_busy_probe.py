"""How busy one host's link is while an algorithm runs across a shaped test bed (issue 58): is
a shaped run slower than the model because its links idle, and when?

    python benchmarks/link_busy_probe.py hop [--hosts 5] [--rate 50mbit] [--queue host-fair]

Runs testbed.measure's link-bound matrix (mlp-digits, 20 ms of emulated compute, 307 KB
messages) for the algorithm with tcpdump on h1's NIC, which sees an outgoing packet as the
host's queue lets it out and an incoming one as it arrives. Over the steady state (rank 0's
iterations after WARMUP, from its event log, on rank 0's clock: h1's), per direction: the share
of the link's rate the data used, and the time the link carried no data in gaps longer than
IDLE_S (what a link-bound model would have filled); per peer, the share of the pair's busy
time in which both directions moved at once. Then the run's throughput. Prints and
writes nothing else. `--acks-first` (an experiment, not the bed's setting) gives packets of
under 128 bytes (pure ACKs, gloo's control messages) a class of their own on both sides of
every host's link (bed_probe.small_packets_first). Needs root, network
namespaces and tcpdump.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bed_probe import small_packets_first, workers_on_bed  # noqa: E402
from control_queue_probe import CONTROL_BYTES, captured_run, packets  # noqa: E402

from hetbench import testbed  # noqa: E402
from hetbench.testbed.measure import (  # noqa: E402
    link_bound_matrix,
    measure_link,
)

WARMUP = 10
#: A silence in a direction's data longer than this counts as the link idle (a 64 KB segment
#: takes 5.7 ms at 92 Mbit/s, so shorter silences are the queue serving other packets).
IDLE_S = 0.015


def busy(times_bytes: list[tuple[float, int]], t0: float, t1: float, rate: float) -> dict:
    """Share of [t0, t1] the data would fill at `rate`, and the idle gaps over IDLE_S."""
    inside = [(t, n) for t, n in times_bytes if t0 <= t <= t1]
    moved = sum(n for _, n in inside)
    gaps, previous = [], t0
    for t, n in inside:
        if t - previous > IDLE_S:
            gaps.append(t - previous)
        # A packet of n bytes holds the link for n / rate after it leaves the queue.
        previous = max(previous, t + n / rate)
    if t1 - previous > IDLE_S:
        gaps.append(t1 - previous)
    span = t1 - t0
    return {"data_share_of_rate": round(moved / rate / span, 3),
            "idle_gaps": len(gaps), "idle_share": round(sum(gaps) / span, 3),
            "median_gap_ms": round(sorted(gaps)[len(gaps) // 2] * 1e3, 1) if gaps else 0.0}


def both_ways(found, me: str, peer: str, t0: float, t1: float, rate: float) -> float:
    """Of the time data moved between h1 and `peer` (each packet holding its direction for
    its bytes' time at the link's rate), the share in which both directions moved."""
    busy: dict[int, set[str]] = {}
    for t, src, dst, n in found:
        if not t0 <= t <= t1 or peer not in (src, dst):
            continue
        direction = "out" if src == me else "in"
        for tick in range(int((t - t0) * 1e4), int((t - t0 + n / rate) * 1e4) + 1):  # 0.1 ms
            busy.setdefault(tick, set()).add(direction)
    return round(sum(len(v) == 2 for v in busy.values()) / max(len(busy), 1), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("algorithm")
    parser.add_argument("--hosts", type=int, default=5)
    parser.add_argument("--rate", default="50mbit")
    parser.add_argument("--queue", default=testbed.DEFAULT_QUEUE, choices=testbed.QUEUES)
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--acks-first", action="store_true")
    args = parser.parse_args()
    workers = workers_on_bed(args.algorithm, args.hosts)
    work = Path(tempfile.mkdtemp(prefix="link-busy-"))
    matrix = work / "probe.toml"
    matrix.write_text(link_bound_matrix("link-busy", [args.algorithm], workers,
                                        args.iterations))
    name = "lbp"
    testbed.down(name)
    bed = testbed.up(name, hosts=args.hosts, subnet="10.77.13", queue=args.queue)
    try:
        for host in bed.hosts:
            testbed.shape_link(bed, host, args.rate, queue=args.queue)
            if args.acks_first:
                small_packets_first(bed, host, args.rate)
        link = measure_link(bed)
        pcap = captured_run(bed, "h1", args.hosts, matrix, work, timeout=1200)
        h1 = bed.hosts["h1"]
        found = [p for p in packets(pcap, h1) if p[3] > CONTROL_BYTES]
    finally:
        testbed.down(name)
    run = next((work / "out").glob("*/summary.json")).parent
    steps = [json.loads(line) for line in (run / "events.rank0.jsonl").read_text().splitlines()]
    # Event times are ns on rank 0's clock (h1's, the capture's), since the epoch.
    t0, t1 = steps[WARMUP]["t_start"] / 1e9, steps[-1]["t_end"] / 1e9
    rate = link["payload_gbps"] * 1e9 / 8
    out = busy([(t, n) for t, src, _, n in found if src == h1], t0, t1, rate)
    into = busy([(t, n) for t, src, _, n in found if src != h1], t0, t1, rate)
    peers = sorted({dst for _, src, dst, _ in found if src == h1})
    pairs = {peer: both_ways(found, h1, peer, t0, t1, rate) for peer in peers}
    summary = json.loads((run / "summary.json").read_text())
    acks = ", acks first" if args.acks_first else ""
    print(f"{args.algorithm}, {workers} workers, {args.rate} {args.queue}{acks} (link "
          f"{link['payload_gbps'] * 1e3:.1f} Mbit/s), h1 over {t1 - t0:.1f} s: out {out}, "
          f"in {into}, both ways at once by peer {pairs}; {summary['throughput']:.1f} "
          f"samples/s; capture in {work}")


if __name__ == "__main__":
    main()
