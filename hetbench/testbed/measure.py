"""What a test bed's shaped link carries, measured between two of its hosts: the payload
rate of a bulk TCP transfer (tbf counts frames with their headers; hetbench's network model
counts payload) and the round trip of a one-byte ping-pong. A `[network]` table that models
the bed takes these, not the rate the link was shaped to (benchmarks/shaped_links.py,
benchmarks/fair_bed.py, tests/distributed/test_fair_transport_bed.py); and the matrix those
compare on, a step bound by the link."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

#: Bytes of the bulk transfer the receiver lets pass before it starts timing (past tbf's
#: burst and TCP's slow start), and the bytes it times.
BULK_SKIP = 4 << 20
BULK_TIMED = 24 << 20

#: The server and client halves of measure_link: a ping-pong, then a bulk transfer from the
#: client, timed where its bytes arrive. Timed at the sender, from a sendall's return, it read
#: 3.5-4.4% low (91.4-92.3 Mbit/s of payload on a 100 Mbit/s link, whose frames carry 95.6): a
#: sendall returns once its bytes are in the socket buffer, so the timed span began with up
#: to a buffer's bytes still to leave (docs/results/2026-11-28-fair-transport-bed.md, "The link's
#: rate, timed where it arrives").
SERVER = f"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 5299)); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
for _ in range(200):
    c.recv(1); c.sendall(b"x")
total, marks, at = 0, [], [{BULK_SKIP}, {BULK_SKIP + BULK_TIMED}]
while True:
    data = c.recv(1 << 20)
    if not data:
        break
    total += len(data)
    if len(marks) < 2 and total >= at[len(marks)]:
        marks.append((time.perf_counter(), total))
(t0, b0), (t1, b1) = marks
print((b1 - b0) * 8 / (t1 - t0) / 1e9, flush=True)
"""
CLIENT = f"""
import socket, statistics, sys, time
c = socket.create_connection((sys.argv[1], 5299))
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rtts = []
for _ in range(200):
    t = time.perf_counter(); c.sendall(b"x"); c.recv(1); rtts.append(time.perf_counter() - t)
block = b"\\0" * (1 << 20)
for _ in range({(BULK_SKIP + BULK_TIMED) // (1 << 20) + 1}):
    c.sendall(block)
c.close()
print(statistics.median(rtts))
"""


def measure_link(bed, server: str = "h2", client: str = "h1") -> dict:
    """{'rtt_us', 'payload_gbps'} from `client` to `server` (median of 200 round trips; the
    payload rate as the server receives it)."""
    listening = bed.popen(server, [sys.executable, "-c", SERVER], stdout=subprocess.PIPE,
                          text=True)
    try:
        listening.stdout.readline()
        done = bed.run(client, [sys.executable, "-c", CLIENT, bed.hosts[server]],
                       capture_output=True, text=True, timeout=120, check=True)
        gbps = float(listening.stdout.readline())
    finally:
        listening.wait(timeout=30)
    return {"rtt_us": float(done.stdout) * 1e6, "payload_gbps": gbps}


def network_table(link: dict, **options) -> str:
    """The `[network]` table of a bed whose hosts each hold one rank, from measure_link's
    `link`: its payload rate for every NIC, half its round trip for the latency, and
    `options` (dilation, transport) after them."""
    lines = ["[network]", "workers_per_node = 1", f"nic_gbps = {link['payload_gbps']:.5f}",
             "inter_gbps = 100", f"inter_latency_us = {link['rtt_us'] / 2:.1f}"]
    lines += [f"{key} = {value!r}".replace("'", '"') for key, value in options.items()]
    return "\n" + "\n".join(lines) + "\n"


#: Options that keep each algorithm's traffic in a link-bound bed's few workers: groups of two
#: for Prague (two groups at a time at 4 workers), and an outer all-reduce every 4 steps for
#: DiLoCo (its default 20 would leave 40 iterations two all-reduces).
LINK_BOUND_OPTIONS = {"prague-static": "workers_per_node = 2", "prague-smart": "group_size = 2",
                      "diloco": "inner_steps = 4"}


#: Iterations a link-bound run measures: Hop keeps the fair model's pace for about its first
#: 50 on the bed and only then settles (docs/results/2026-11-28-fair-transport-bed.md, "Hop's
#: steady state"), so a validation measures past them.
STEADY_ITERATIONS = 120


def bed_workers(hosts: int, server_ranks: int) -> int:
    """Workers of a link-bound run on a bed of `hosts` one-rank hosts: every host but the
    servers' for an algorithm with `server_ranks` (its Algorithm.server_ranks, which the caller
    asks: the testbed sits below the registry), else an even number (Prague's groups of two)."""
    return hosts - server_ranks if server_ranks else hosts - hosts % 2


def link_bound_matrix(name: str, algorithms: list[str], workers: int,
                      iterations: int = STEADY_ITERATIONS, hidden: int = 1024) -> str:
    """A matrix whose every step is bound by a shaped bed's link rather than its compute:
    mlp-digits with a `hidden`-unit hidden layer (1,024: 307 KB messages, within a socket's
    buffer; 32,768: 9.7 MB, beyond it) and 20 ms of emulated compute, one seed, listening on
    every address (ranks on other hosts reach the run's services), with LINK_BOUND_OPTIONS for
    the algorithms it names."""
    options = "".join(f"\n[algorithm.{a}]\n{LINK_BOUND_OPTIONS[a]}\n"
                      for a in algorithms if a in LINK_BOUND_OPTIONS)
    return (f'name = "{name}"\nalgorithms = {json.dumps(algorithms)}\n'
            f'workloads = ["mlp-digits"]\nworkers = [{workers}]\niterations = {iterations}\n'
            'seeds = [1]\nbind_host = "0.0.0.0"\ncomm_timeout_s = 60.0\n\n'
            f'[workload.mlp-digits]\ncompute = "emulated"\ncompute_ms = 20\nhidden = {hidden}\n'
            + options)


def run_across(bed, hosts: int, matrix: Path, out: Path,
               timeout: float = 1800) -> subprocess.CompletedProcess:
    """`bench run MATRIX --out OUT` from h1 across the bed's hosts h1..h<hosts>, one rank a
    host (torchrun through the bed's own rsh agent), its output captured."""
    slots = ",".join(f"h{i}:1" for i in range(1, hosts + 1))
    agent = f"{sys.executable} -m hetbench testbed rsh --name {bed.name}"
    return bed.run("h1", [sys.executable, "-m", "hetbench", "run", str(matrix), "--launcher",
                          "torchrun", "--hosts", slots, "--rsh-agent", agent, "--out", str(out)],
                   capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout)
