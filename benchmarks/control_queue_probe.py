"""Where gloo's rendezvous messages wait on a shaped link (issue 58): a packet capture of the
parameter server's NIC during a link-bound ps-async run on a test bed.

    python benchmarks/control_queue_probe.py [--rate 100mbit] [--algorithm ps-async]

gloo's TCP pair moves a message's bytes only after its receiver has answered the sender's
"ready to send" with a "ready to receive" (a small control message). The server's loop sends
its reply to one worker (307 KB written to that socket at once), then posts its next receive,
whose "ready to receive" to the next worker leaves through the same NIC. The capture (tcpdump
on the server host's eth0, which sees a packet when tbf lets it out) says, for every control
message the server sends while a reply is going out: how many of the reply's bytes left
before it, as time at the link's rate (what it waited behind, if the queue is FIFO), and how
far the reply's first packet was ahead of it. Prints the medians and writes nothing. Needs
root, network namespaces and tcpdump.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hetbench import testbed  # noqa: E402
from hetbench.testbed.measure import (  # noqa: E402
    link_bound_matrix,
    measure_link,
    run_across,
)

HOSTS = 5
CONTROL_BYTES = 200  # a payload this small is a control message, not a message's data


def packets(pcap: Path, host_ip: str) -> list[tuple[float, str, str, int]]:
    """(time, src ip, dst ip, payload bytes) of every TCP packet with a payload."""
    text = subprocess.run(["tcpdump", "-r", str(pcap), "-n", "-tt", "-q", "tcp"],
                          capture_output=True, text=True, check=True).stdout
    found = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 7 or parts[1] != "IP" or parts[-2] != "tcp":
            continue
        length = int(parts[-1])
        if length == 0:
            continue
        src = parts[2].rsplit(".", 1)[0]
        dst = parts[4].rstrip(":").rsplit(".", 1)[0]
        found.append((float(parts[0]), src, dst, length))
    return found


def analyse(found, server: str, rate_bytes_s: float) -> dict:
    """For each control message from the server sent inside a reply's burst: the reply bytes
    that left before it (as seconds at the link's rate) and the time since the burst began."""
    out = [p for p in found if p[1] == server]
    behind, since = [], []
    for i, (t, _, dst, length) in enumerate(out):
        if length > CONTROL_BYTES:
            continue
        # The data burst it sits in: data packets to one other worker, before and after it.
        before = [p for p in out[max(0, i - 400):i] if p[3] > CONTROL_BYTES]
        after = [p for p in out[i + 1:i + 50] if p[3] > CONTROL_BYTES]
        if not before or not after or before[-1][2] == dst or after[0][2] != before[-1][2]:
            continue
        reply_to = before[-1][2]
        burst = []
        for p in reversed(before):  # back to the burst's first packet
            if p[2] != reply_to or (burst and burst[-1][0] - p[0] > 0.05):
                break
            burst.append(p)
        behind.append(sum(p[3] for p in burst) / rate_bytes_s)
        since.append(t - burst[-1][0])
    return {"control_in_bursts": len(behind),
            "median_bytes_ahead_ms": statistics.median(behind) * 1e3 if behind else None,
            "median_since_burst_ms": statistics.median(since) * 1e3 if since else None}


def captured_run(bed, host: str, hosts: int, matrix: Path, work: Path,
                 timeout: float = 900) -> Path:
    """The matrix across the bed's hosts h1..h<hosts> (testbed.measure.run_across, into
    work/out) with tcpdump on `host`'s eth0 meanwhile (TCP headers only); the capture's path.
    A failed run ends the probe with its error."""
    pcap = work / f"{host}.pcap"
    capture = bed.popen(host, ["tcpdump", "-i", "eth0", "-s", "96", "-w", str(pcap), "tcp"],
                        stderr=subprocess.DEVNULL)
    time.sleep(1)  # tcpdump listening before the first packet
    done = run_across(bed, hosts, matrix, work / "out", timeout=timeout)
    capture.terminate()
    capture.wait(timeout=30)
    if done.returncode:
        raise SystemExit(f"run failed: {done.stderr[-2000:]}")
    return pcap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", default="100mbit")
    parser.add_argument("--algorithm", default="ps-async")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="control-probe-"))
    matrix = work / "probe.toml"
    matrix.write_text(link_bound_matrix("control-probe", [args.algorithm], HOSTS - 1))
    name = "cqp"
    testbed.down(name)
    bed = testbed.up(name, hosts=HOSTS, subnet="10.77.11")
    server_host = f"h{HOSTS}"  # the server is the last rank; torchrun gives it the last host
    try:
        for host in bed.hosts:
            testbed.shape_link(bed, host, args.rate, queue="tbf")  # the FIFO it measures
        link = measure_link(bed)
        pcap = captured_run(bed, server_host, HOSTS, matrix, work, timeout=600)
        server_ip = bed.hosts[server_host]
        result = analyse(packets(pcap, server_ip), server_ip,
                         link["payload_gbps"] * 1e9 / 8)
    finally:
        testbed.down(name)
    one_push_ms = 307_216 / (link["payload_gbps"] * 1e9 / 8) * 1e3
    print(f"{args.algorithm} at {args.rate} (link {link['payload_gbps'] * 1e3:.1f} Mbit/s, "
          f"a message {one_push_ms:.1f} ms): {result}; capture kept in {work}")


if __name__ == "__main__":
    main()
