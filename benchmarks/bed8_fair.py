"""Point-to-point protocols on 8 one-rank test-bed hosts at shaped rates, against `bench sim`
with `transport = "fcfs"` and `"fair"` on the bed's measured link (issue 58; docs/network.md).

    python benchmarks/bed8_fair.py --rates 100mbit,50mbit [--queue-ms 1000]

For each rate: a bed of 8 hosts with every link shaped by tbf, the link measured
(testbed.measure), the matrix run for real across the hosts (torchrun, one rank a host), then
simulated both ways on the measured link. One run each; prints a line per algorithm and rate.
Needs root and network namespaces.
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
from hetbench.testbed.measure import (  # noqa: E402
    link_bound_matrix,
    measure_link,
    network_table,
)

HOSTS = 8
def throughputs(out: Path) -> dict[str, float]:
    found = {}
    for path in out.glob("*/summary.json"):
        summary = json.loads(path.read_text())
        found[summary["algorithm"]] = summary["throughput"]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="100mbit,50mbit")
    parser.add_argument("--algorithms", default="hop,dpsgd,adpsgd")
    parser.add_argument("--queue-ms", type=float, default=testbed.SHAPE_QUEUE_MS)
    args = parser.parse_args()
    matrix = link_bound_matrix("bed8", args.algorithms.split(","), HOSTS)
    work = Path(tempfile.mkdtemp(prefix="bed8-"))
    (work / "shaped.toml").write_text(matrix)
    hosts = ",".join(f"h{i}:1" for i in range(1, HOSTS + 1))
    agent = f"{sys.executable} -m hetbench testbed rsh --name bed8"
    for rate in args.rates.split(","):
        bed = testbed.up("bed8", hosts=HOSTS, subnet="10.77.8")
        try:
            for host in bed.hosts:
                testbed.shape_link(bed, host, rate, queue_ms=args.queue_ms)
            link = measure_link(bed)
            shaped_out = work / f"shaped-{rate}"
            done = bed.run("h1", [sys.executable, "-m", "hetbench", "run",
                                  str(work / "shaped.toml"), "--launcher", "torchrun",
                                  "--hosts", hosts, "--rsh-agent", agent, "--out",
                                  str(shaped_out)],
                           capture_output=True, text=True, cwd=ROOT, stdin=subprocess.DEVNULL,
                           timeout=1200)
            if done.returncode:
                raise SystemExit(f"shaped run failed: {done.stderr[-2000:]}")
        finally:
            testbed.down("bed8")
        shaped = throughputs(shaped_out)
        simulated = {}
        for transport in ("fcfs", "fair"):
            path = work / f"sim-{rate}-{transport}.toml"
            path.write_text(matrix + network_table(link, transport=transport))
            subprocess.run([sys.executable, "-m", "hetbench", "sim", str(path), "--out",
                            str(work / f"sim-{rate}-{transport}")],
                           check=True, capture_output=True, cwd=ROOT)
            simulated[transport] = throughputs(work / f"sim-{rate}-{transport}")
        for algorithm, real in sorted(shaped.items()):
            fcfs, fair = simulated["fcfs"][algorithm], simulated["fair"][algorithm]
            print(f"{rate} {algorithm}: shaped {real:.0f}, fcfs {fcfs:.0f}, fair {fair:.0f} "
                  f"samples/s; shaped/fcfs {real / fcfs:.2f}, shaped/fair {real / fair:.2f}; "
                  f"link {link['payload_gbps'] * 1000:.1f} Mbit/s, rtt {link['rtt_us']:.0f} us",
                  flush=True)
    print(f"runs kept in {work}")


if __name__ == "__main__":
    main()
