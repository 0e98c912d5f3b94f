"""Kernel-shaped links against hetbench's network models (issue 43): the same link rate three
ways, for every algorithm of the quick matrix.

1. **shaped**: real ranks on a test bed of one-rank hosts whose links are shaped by the kernel
   (a tbf qdisc on each host's eth0 and on its bridge port: the host's NIC, both directions),
   `bench run --launcher torchrun --hosts h1:1,...`;
2. **emulated**: the same matrix on this one host with a `[network]` table of that rate
   (hetbench's emulator holds every Comm operation to its modeled time);
3. **simulated**: `bench sim` of the emulated matrix (the same `[network]` table).

The workload is mlp-digits with emulated compute (a 20 ms wait an iteration) and a hidden layer
wide enough (1024 units: 311 KB messages) that the link, not the compute, bounds every
algorithm at 100 Mbit/s. Each host has one rank, so the model's per-rank NIC is the host's
shaped link; a parameter server's rank is a host of its own (the model gives servers a node).

The `[network]` table takes the bed's measured payload rate (a bulk TCP transfer between two
hosts: tbf counts frames with their headers, the model counts payload) and half the measured
round trip of a one-byte TCP ping-pong as the latency. Each run's TCP retransmissions (every
host namespace's /proc/net/snmp before and after) are recorded beside it: a queue that
overflows a tbf's limit drops packets, which the model has no notion of.

    python benchmarks/shaped_links.py --repeats 3 --out docs/results/shaped-links.json

Needs root and network namespaces (hetbench.testbed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hetbench import testbed  # noqa: E402
from hetbench.core.record import read_events  # noqa: E402
from hetbench.core.store import read_json  # noqa: E402
from hetbench.testbed.measure import measure_link, network_table  # noqa: E402

ALGORITHMS = ["allreduce", "ps-sync", "ps-async", "dpsgd", "adpsgd", "hop", "prague-static",
              "prague-smart"]
RATE = "100mbit"
WORKERS = 4
HOSTS = 5  # the parameter servers' world: 4 workers + 1 server rank
MATRIX = """
name = "shaped-links"
algorithms = {algorithms}
workloads = ["mlp-digits"]
workers = [{workers}]
iterations = {iterations}
seeds = [1]
bind_host = "0.0.0.0"

[workload.mlp-digits]
compute = "emulated"
compute_ms = 20
hidden = 1024

[algorithm.prague-static]
workers_per_node = 2

[algorithm.prague-smart]
group_size = 2
"""

def retransmits(bed: testbed.Bed) -> int:
    total = 0
    for host in bed.hosts:
        lines = bed.run(host, ["cat", "/proc/net/snmp"], capture_output=True, text=True,
                        check=True).stdout.splitlines()
        names, values = [line.split()[1:] for line in lines if line.startswith("Tcp:")][:2]
        total += int(values[names.index("RetransSegs")])
    return total


def sent_bytes(bed: testbed.Bed) -> dict[str, int]:
    """Bytes each host's shaped eth0 has sent (its tbf's counter)."""
    sent = {}
    for host in bed.hosts:
        stats = bed.run(host, ["tc", "-s", "qdisc", "show", "dev", "eth0"], capture_output=True,
                        text=True, check=True).stdout
        sent[host] = int(stats.split("Sent ", 1)[1].split()[0])
    return sent


def bench(argv: list[str], bed: testbed.Bed | None = None) -> None:
    command = [sys.executable, "-m", "hetbench", *argv]
    kwargs = dict(capture_output=True, text=True, cwd=ROOT, stdin=subprocess.DEVNULL,
                  timeout=1800)
    done = bed.run("h1", command, **kwargs) if bed else subprocess.run(command, **kwargs)
    if done.returncode != 0:
        raise SystemExit(f"`bench {' '.join(argv)}` failed: {done.stderr[-3000:]}")


def results(out: Path) -> dict[str, dict]:
    found = {}
    for path in out.glob("*/summary.json"):
        summary = read_json(path)
        if summary["status"] != "ok":
            raise SystemExit(f"{path.parent}: {summary['status']}: {summary.get('cause')}")
        if not summary.get("simulated"):
            summary["step_end_spread_ms"] = step_end_spread_ms(path.parent, summary["workers"])
        found[summary["algorithm"]] = summary
    return found


def step_end_spread_ms(run_dir: Path, workers: int) -> float:
    """The median over iterations of how far apart the workers' ends of that iteration are
    (ms): near 0 where a protocol's replies reach every worker together, the gap between
    replies where a link serves them one after another."""
    ends = [{e["iteration"]: e["t_end"] for e in read_events(run_dir, w)[0]}
            for w in range(workers)]
    common = set.intersection(*(set(e) for e in ends))
    return statistics.median(max(e[k] for e in ends) - min(e[k] for e in ends)
                             for k in common) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs/results/shaped-links.json")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    parser.add_argument("--no-idle-restart", action="store_true",
                        help="hosts keep TCP's congestion window across idle spells "
                             "(net.ipv4.tcp_slow_start_after_idle=0)")
    parser.add_argument("--keep", type=Path,
                        help="write the runs here (kept) instead of a temporary directory")
    parser.add_argument("--queue-ms", type=float, default=testbed.SHAPE_QUEUE_MS,
                        help="how much queue (ms at the rate) each shaped link holds before "
                             "it drops packets")
    args = parser.parse_args()
    algorithms = args.algorithms.split(",")
    bed = testbed.up("shl", hosts=HOSTS, subnet="10.79.5")
    try:
        for host in bed.hosts:
            # tbf, as its page measured.
            testbed.shape_link(bed, host, RATE, queue_ms=args.queue_ms, queue="tbf")
            if args.no_idle_restart:
                bed.run(host, ["sysctl", "-q", "-w", "net.ipv4.tcp_slow_start_after_idle=0"],
                        check=True)
        link = measure_link(bed)
        print(f"link: {link}", flush=True)
        base = MATRIX.format(algorithms=json.dumps(ALGORITHMS), workers=WORKERS,
                             iterations=args.iterations)
        network = network_table(link, dilation=2)
        hosts = ",".join(f"h{i}:1" for i in range(1, HOSTS + 1))
        agent = f"{sys.executable} -m hetbench testbed rsh --name {bed.name}"
        shaped: dict[str, list[dict]] = {a: [] for a in algorithms}
        emulated: dict[str, list[dict]] = {a: [] for a in algorithms}
        with tempfile.TemporaryDirectory() as tmp:
            tmp = str(args.keep or tmp)
            Path(tmp).mkdir(parents=True, exist_ok=True)
            shaped_matrix, emulated_matrix = Path(tmp) / "shaped.toml", Path(tmp) / "emu.toml"
            shaped_matrix.write_text(base)
            emulated_matrix.write_text(base + network)
            for repeat in range(args.repeats):
                for algorithm in algorithms:  # alternating, one algorithm at a time
                    out = Path(tmp) / f"shaped-{repeat}-{algorithm}"
                    before, bytes_before = retransmits(bed), sent_bytes(bed)
                    start = time.perf_counter()
                    bench(["run", str(shaped_matrix), "--algorithms", algorithm, "--launcher",
                           "torchrun", "--hosts", hosts, "--rsh-agent", agent, "--out",
                           str(out)], bed)
                    summary = results(out)[algorithm]
                    summary["retransmits"] = retransmits(bed) - before
                    # How busy the busiest link was while the ranks trained (handshakes and
                    # evaluation are a small part of the bytes).
                    moved = max(after - bytes_before[h] for h, after in sent_bytes(bed).items())
                    summary["busiest_link_use"] = (moved * 8 / summary["train_wall_s"]
                                                   / float(RATE.removesuffix("mbit")) / 1e6)
                    shaped[algorithm].append(summary)
                    out = Path(tmp) / f"emulated-{repeat}-{algorithm}"
                    bench(["run", str(emulated_matrix), "--algorithms", algorithm, "--out",
                           str(out)])
                    emulated[algorithm].append(results(out)[algorithm])
                    print(f"repeat {repeat} {algorithm}: shaped "
                          f"{shaped[algorithm][-1]['throughput']:.0f} "
                          f"({summary['retransmits']} retransmits), emulated "
                          f"{emulated[algorithm][-1]['throughput']:.0f} samples/s "
                          f"({time.perf_counter() - start:.0f} s)", flush=True)
            bench(["sim", str(emulated_matrix), "--algorithms", args.algorithms, "--out",
                   f"{tmp}/sim"])
            simulated = results(Path(tmp) / "sim")
    finally:
        testbed.down("shl")
    rows = []
    for algorithm in algorithms:
        real = [s["throughput"] for s in shaped[algorithm]]
        emu = [s["throughput"] for s in emulated[algorithm]]
        rows.append({
            "algorithm": algorithm, "world_size": shaped[algorithm][0]["world_size"],
            "shaped": real, "emulated": emu, "simulated": simulated[algorithm]["throughput"],
            "retransmits": [s["retransmits"] for s in shaped[algorithm]],
            "busiest_link_use": [s["busiest_link_use"] for s in shaped[algorithm]],
            "fidelity": [s.get("fidelity") for s in emulated[algorithm]],
            "late_share": [s.get("network", {}).get("late_share") for s in emulated[algorithm]],
            "p2p_mb_per_iteration": shaped[algorithm][0].get("p2p_mb_per_iteration"),
            "collective_mb_per_iteration":
                shaped[algorithm][0].get("collective_mb_per_iteration"),
            "step_end_spread_ms": [s["step_end_spread_ms"] for s in shaped[algorithm]],
            "emulated_step_end_spread_ms": [s["step_end_spread_ms"]
                                            for s in emulated[algorithm]],
            "comm_wait_s": [(s["comm_s"] + s["wait_s"]) for s in shaped[algorithm]],
            "emulated_comm_wait_s": [(s["comm_s"] + s["wait_s"]) for s in emulated[algorithm]],
        })
        median = statistics.median
        print(f"| {algorithm} | {median(real):.0f} ({min(real):.0f}-{max(real):.0f}) | "
              f"{median(emu):.0f} ({min(emu):.0f}-{max(emu):.0f}) | "
              f"{simulated[algorithm]['throughput']:.0f} | "
              f"{median(emu) / median(real) - 1:+.1%} | "
              f"{simulated[algorithm]['throughput'] / median(real) - 1:+.1%} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rate": RATE, "queue_ms": args.queue_ms,
                                    "idle_restart": not args.no_idle_restart, "link": link,
                                    "hosts": hosts, "matrix": base, "network": network,
                                    "rows": rows}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
