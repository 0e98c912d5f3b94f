"""How a parameter server's concurrent replies share its link on a shaped test bed (issue 58):
a packet capture of ps-sync's server NIC during a link-bound run.

    python benchmarks/reply_spread_probe.py [--hosts 5] [--rate 100mbit] [--queue host-fair]

ps-sync's server sends its parameters to every worker at once (an isend to each, then waits
for them all). `transport = "fair"` has those replies share the server's link evenly, so they
all end together; fcfs sends them one after another. The shaped run lies between the two, and
this says why: per round (a burst of the server's outgoing data, rounds apart by more than
a silence), when each reply's first and last data packet left the server's host
(tcpdump on its eth0 sees a packet as the qdisc lets it out), how far apart the replies began
and ended, and the largest packet the queue served at once. Prints the medians over the rounds
after WARMUP_ROUNDS and the run's throughput, and writes nothing. `--no-gso` turns segmentation
offload off on every host's NIC, so that the queues serve frames of one MSS rather than
segments of up to 64 KB. Needs root, network namespaces and tcpdump.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from control_queue_probe import CONTROL_BYTES, captured_run, packets  # noqa: E402

from hetbench import testbed  # noqa: E402
from hetbench.testbed.measure import link_bound_matrix, measure_link  # noqa: E402

#: Rounds past which every figure is taken (the first ones set TCP's windows up).
WARMUP_ROUNDS = 5


def rounds(found, server: str, gap_s: float) -> list[dict[str, list]]:
    """The server's outgoing data packets, split into rounds (a silence of more than gap_s
    ends one): per round, per destination, [first time, last time, bytes, largest packet]."""
    out = [p for p in found if p[1] == server and p[3] > CONTROL_BYTES]
    split: list[dict[str, list]] = []
    last = None
    for t, _, dst, length in out:
        if last is None or t - last > gap_s:
            split.append({})
        last = t
        reply = split[-1].setdefault(dst, [t, t, 0, 0])
        reply[1] = t
        reply[2] += length
        reply[3] = max(reply[3], length)
    return split


def analyse(split, workers: int) -> dict:
    """Medians over full rounds (a reply to every worker) past warm-up: how far apart the
    replies' first and last packets left, how far the last reply ended after the one before
    it, and the largest packet the capture saw (a GSO segment: what the queue serves at once)."""
    full = [r for r in split if len(r) == workers][WARMUP_ROUNDS:]
    if not full:
        raise SystemExit(f"no round with a reply to each of {workers} workers in the capture")
    start_spread, end_spread, last_gap, span = [], [], [], []
    for r in full:
        firsts = sorted(v[0] for v in r.values())
        lasts = sorted(v[1] for v in r.values())
        start_spread.append(firsts[-1] - firsts[0])
        end_spread.append(lasts[-1] - lasts[0])
        last_gap.append(lasts[-1] - lasts[-2])
        span.append(lasts[-1] - firsts[0])
    ms = 1e3
    return {"rounds": len(full),
            "median_start_spread_ms": round(statistics.median(start_spread) * ms, 1),
            "median_end_spread_ms": round(statistics.median(end_spread) * ms, 1),
            "median_last_after_previous_ms": round(statistics.median(last_gap) * ms, 1),
            "median_round_ms": round(statistics.median(span) * ms, 1),
            "largest_packet_bytes": max(v[3] for r in full for v in r.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=5)
    parser.add_argument("--rate", default="100mbit")
    parser.add_argument("--queue", default=testbed.DEFAULT_QUEUE, choices=testbed.QUEUES)
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--no-gso", action="store_true",
                        help="turn TSO and GSO off on every host's eth0")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="reply-probe-"))
    workers = args.hosts - 1  # the server takes the last host
    matrix = work / "probe.toml"
    matrix.write_text(link_bound_matrix("reply-probe", ["ps-sync"], workers, args.iterations))
    name = "rsp"
    testbed.down(name)
    bed = testbed.up(name, hosts=args.hosts, subnet="10.77.12", queue=args.queue)
    server_host = f"h{args.hosts}"
    try:
        for host in bed.hosts:
            if args.no_gso:
                bed.run(host, ["ethtool", "-K", "eth0", "tso", "off", "gso", "off"],
                        check=True, capture_output=True)
            testbed.shape_link(bed, host, args.rate, queue=args.queue)
        link = measure_link(bed)
        pcap = captured_run(bed, server_host, args.hosts, matrix, work)
        rate = link["payload_gbps"] * 1e9 / 8
        # Within a round the server's data pauses for at most a packet of each reply (64 KB
        # segments served in turn); between rounds, for a compute and a push at least.
        gap_s = 1.5 * workers * 2**16 / rate
        server = bed.hosts[server_host]
        result = analyse(rounds(packets(pcap, server), server, gap_s), workers)
        summary = json.loads(next((work / "out").glob("*/summary.json")).read_text())
        result["samples_per_s"] = round(summary["throughput"], 1)
    finally:
        testbed.down(name)
    reply_ms = 307_200 / rate * 1e3
    gso = "no GSO " if args.no_gso else ""
    print(f"ps-sync, {workers} workers, {args.rate} {args.queue} {gso}(link "
          f"{link['payload_gbps'] * 1e3:.1f} Mbit/s; a reply alone {reply_ms:.1f} ms, "
          f"{workers} shared evenly {workers * reply_ms:.1f} ms): {result}; capture in {work}")


if __name__ == "__main__":
    main()
