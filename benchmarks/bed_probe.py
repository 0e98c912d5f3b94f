"""One algorithm across a shaped test bed, with each host's TCP retransmissions counted: is a
shaped run slow because TCP lost segments at the bed's queues, or for the protocol's reasons?

    python benchmarks/bed_probe.py hop --hidden 32768 [--option backup_workers=0]

Runs testbed.measure's link-bound matrix (mlp-digits, 20 ms of emulated compute; --hidden
sets the message size: 32,768 units is 9.7 MB, beyond a socket's buffer) for the algorithm
on a bed of --hosts one-rank hosts, every link shaped to --rate, and prints per host the TCP
segments sent, received and retransmitted during the run (/proc/net/snmp inside each host's
namespace), then the run's throughput. Needs root and network namespaces.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hetbench import testbed  # noqa: E402
from hetbench.core.registry import ALGORITHMS  # noqa: E402
from hetbench.testbed.measure import bed_workers, link_bound_matrix, run_across  # noqa: E402

#: TcpExt counters (/proc/net/netstat) that name a stall: a retransmission timeout, a tail
#: loss probe, a delayed ACK, a zero window, a send that waited for buffer memory.
STALLS = ("TCPTimeouts", "TCPLossProbes", "DelayedACKs", "TCPFromZeroWindowAdv",
          "TCPToZeroWindowAdv", "TCPWantZeroWindowAdv", "TCPSlowStartRetrans",
          "TCPSpuriousRTOs", "TCPMemoryPressures")


def workers_on_bed(algorithm: str, hosts: int) -> int:
    """bed_workers for `algorithm` under its default options, with its own server ranks."""
    cls = ALGORITHMS.get(algorithm)
    return bed_workers(hosts, cls.server_ranks(cls.Config(), hosts - 1))


def tcp_counters(bed, host: str) -> dict[str, int]:
    """The host's Tcp: and TcpExt: counters (its own namespace's /proc/net/snmp, netstat)."""
    counters = {}
    for table, prefix in (("/proc/net/snmp", "Tcp:"), ("/proc/net/netstat", "TcpExt:")):
        lines = bed.run(host, ["cat", table], capture_output=True,
                        text=True).stdout.splitlines()
        keys, values = [line.split()[1:] for line in lines if line.startswith(prefix)]
        counters.update(zip(keys, map(int, values), strict=True))
    return counters


def small_packets_first(bed, host: str, rate: str) -> None:
    """An experiment, not the bed's setting: on both sides of the host's htb-shaped link
    (testbed.shape_link), packets of under 128 bytes (pure ACKs, gloo's control messages, a
    gRPC request) go to a class guaranteed the whole rate, which the round robin serves at
    every turn, rather than waiting behind the data queued in their peer's class or FIFO."""
    sides = ((["ip", "netns", "exec", bed.namespace(host)], "eth0"), ([], bed.veth(host)))
    for where, device in sides:
        subprocess.run([*where, "tc", "class", "add", "dev", device, "parent", "1:1",
                        "classid", "1:5", "htb", "rate", rate, "ceil", rate, "burst", "4kb",
                        "cburst", "4kb", "quantum", "1514"], check=True)
        # IP total length (bytes 2-3 of the header) below 128, ahead of the peers' filters.
        subprocess.run([*where, "tc", "filter", "add", "dev", device, "parent", "1:",
                        "protocol", "ip", "prio", "0", "u32", "match", "u16", "0x0000",
                        "0xff80", "at", "2", "flowid", "1:5"], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("algorithm")
    parser.add_argument("--hosts", type=int, default=5)
    parser.add_argument("--rate", default="100mbit")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--queue", default="tbf", choices=testbed.QUEUES,
                        help="how the links enforce their rate (tbf: as its page measured)")
    parser.add_argument("--queue-ms", type=float, default=testbed.SHAPE_QUEUE_MS,
                        help="each queue's depth in milliseconds of the rate")
    parser.add_argument("--small-first", action="store_true",
                        help="small packets ahead of data on every link (an experiment; htb "
                             "queues only)")
    parser.add_argument("--option", action="append", default=[],
                        help="KEY=VALUE for [algorithm.<name>] (TOML values), repeatable")
    args = parser.parse_args()
    workers = workers_on_bed(args.algorithm, args.hosts)
    matrix_text = link_bound_matrix("bed-probe", [args.algorithm], workers, args.iterations,
                                    args.hidden)
    if args.option:
        matrix_text += f"\n[algorithm.{args.algorithm}]\n" + "\n".join(args.option) + "\n"
    work = Path(tempfile.mkdtemp(prefix="bed-probe-"))
    matrix = work / "matrix.toml"
    matrix.write_text(matrix_text)
    name = "bprobe"
    testbed.down(name)
    bed = testbed.up(name, hosts=args.hosts, subnet="10.77.12")
    try:
        for host in bed.hosts:
            testbed.shape_link(bed, host, args.rate, queue_ms=args.queue_ms, queue=args.queue)
            if args.small_first:
                small_packets_first(bed, host, args.rate)
        before = {host: tcp_counters(bed, host) for host in bed.hosts}
        done = run_across(bed, args.hosts, matrix, work / "out")
        after = {host: tcp_counters(bed, host) for host in bed.hosts}
    finally:
        testbed.down(name)
    if done.returncode:
        raise SystemExit(f"the run failed: {done.stderr[-2000:]}")
    for host in bed.hosts:
        moved = {key: after[host][key] - before[host][key]
                 for key in ("OutSegs", "InSegs", "RetransSegs", *STALLS)
                 if key in after[host]}
        print(f"{host}: {moved}")
    for path in (work / "out").glob("*/summary.json"):
        summary = json.loads(path.read_text())
        print(f"{summary['algorithm']}: {summary['throughput']:.1f} samples/s "
              f"({summary['status']}); {step_means(path.parent)}; runs kept in {work}")


def step_means(run_dir: Path, warmup: int = 10) -> dict[str, float]:
    """Milliseconds a step, averaged over every rank's steps past `warmup`: its compute, comm
    and wait, and the algorithm's gg_s (prague-smart's Group Generator round trip) if logged;
    and rank 0's iteration (the mean gap between its step ends)."""
    steps, iteration = [], None
    for events in sorted(run_dir.glob("events.rank*.jsonl")):
        lines = [json.loads(line) for line in events.read_text().splitlines()][warmup:]
        steps += lines
        if events.name == "events.rank0.jsonl" and len(lines) > 1:
            iteration = (lines[-1]["t_end"] - lines[0]["t_end"]) / (len(lines) - 1) / 1e6
    means = {key: round(sum(e[key] for e in steps) / len(steps) * 1e3, 2)
             for key in ("compute_s", "comm_s", "wait_s", "gg_s")
             if steps and all(key in e for e in steps)}
    return {**means, "iteration_ms": round(iteration, 2) if iteration else None}


if __name__ == "__main__":
    main()
