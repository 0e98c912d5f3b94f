"""A stored fair_bed.py table's simulations again, on the link as testbed.measure now measures
it (issue 58): the shaped runs stand as measured; only the models' predictions, which are a
function of the `[network]` table, are made again.

    python benchmarks/fair_bed_relink.py docs/results/fair-transport-bed.json \
        --iterations 40 --out docs/results/fair-transport-bed-relinked.json

measure_link timed its bulk transfer at the sender until 2026-11-29 and read 3.9% low (92
Mbit/s of payload on a 100 Mbit/s link, 46 on 50); it now times it where the bytes arrive
(95.6 and 47.8). For each (rate, queue) of the table this measures the link on a fresh
two-host bed, then for each cell's bed size simulates the link-bound matrix under fcfs and
fair on that rate and the cell's own round trip. First it simulates them on the cell's stored
link, to show the rerun reproduces the stored predictions (`check`: the largest relative
difference; the model has changed since some tables were taken). The emulated columns, real
runs under the emulator, are not made again: they keep their link. Needs root and network
namespaces.
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

from fair_bed import simulate_both  # noqa: E402

from hetbench import testbed  # noqa: E402
from hetbench.core.store import write_json_atomic  # noqa: E402
from hetbench.testbed.measure import link_bound_matrix, measure_link  # noqa: E402


def measured_links(pairs: set[tuple[str, str]]) -> dict[tuple[str, str], dict]:
    """measure_link on a two-host bed shaped to each (rate, queue)."""
    links, name = {}, "relink"
    for rate, queue in sorted(pairs):
        testbed.down(name)
        bed = testbed.up(name, hosts=2, subnet="10.77.11", queue=queue)
        try:
            for host in bed.hosts:
                testbed.shape_link(bed, host, rate, queue=queue)
            links[(rate, queue)] = measure_link(bed)
        finally:
            testbed.down(name)
        print(f"{rate} {queue}: {links[(rate, queue)]['payload_gbps'] * 1e3:.2f} Mbit/s",
              flush=True)
    return links


def simulate(work: Path, cells: list[dict], link: dict, iterations: int, hidden: int,
             tag: str) -> dict[str, dict[str, float]]:
    """fair_bed.simulate_both for `cells` (one bed size, rate and queue: their workers may
    differ), on the link-bound matrix they were measured on."""
    groups: dict[int, list[str]] = {}
    for cell in cells:
        groups.setdefault(cell["workers"], []).append(cell["algorithm"])
    matrices = {}
    for workers, algorithms in groups.items():
        matrices[workers] = work / f"{tag}-w{workers}.toml"
        matrices[workers].write_text(link_bound_matrix("relink", algorithms, workers,
                                                       iterations, hidden))
    return simulate_both(work, matrices, link, tag)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("table", type=Path, help="a fair_bed.py --out JSON")
    parser.add_argument("--iterations", type=int, required=True,
                        help="the table's (its command's --iterations; 40 before 120 was "
                             "the default)")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    table = json.loads(args.table.read_text())
    cells = [c for c in table["cells"] if c.get("status") == "ok"]
    for cell in cells:
        cell.setdefault("queue", "tbf")  # tables before the queue option: tbf's
    links = measured_links({(c["rate"], c["queue"]) for c in cells})
    work = Path(tempfile.mkdtemp(prefix="relink-"))
    beds: dict[tuple, list[dict]] = {}
    for cell in cells:
        beds.setdefault((cell["hosts"], cell["rate"], cell["queue"]), []).append(cell)
    check = 0.0
    for (hosts, rate, queue), members in beds.items():
        old = {"payload_gbps": members[0]["link_mbit_s"] / 1e3, "rtt_us": members[0]["rtt_us"]}
        new = {"payload_gbps": links[(rate, queue)]["payload_gbps"], "rtt_us": old["rtt_us"]}
        tag = f"h{hosts}-{rate}-{queue}"
        again = simulate(work, members, old, args.iterations, args.hidden, f"{tag}-old")
        relinked = simulate(work, members, new, args.iterations, args.hidden, f"{tag}-new")
        for cell in members:
            algorithm = cell["algorithm"]
            for transport in ("fcfs", "fair"):
                check = max(check, abs(again[algorithm][transport] / cell[transport] - 1))
            cell["sender_timed"] = {"link_mbit_s": cell["link_mbit_s"], "fcfs": cell["fcfs"],
                                    "fair": cell["fair"],
                                    "shaped_over_fcfs": cell["shaped_over_fcfs"],
                                    "shaped_over_fair": cell["shaped_over_fair"]}
            cell["link_mbit_s"] = round(new["payload_gbps"] * 1e3, 2)
            for transport in ("fcfs", "fair"):
                cell[transport] = relinked[algorithm][transport]
                cell[f"shaped_over_{transport}"] = round(cell["shaped"] / cell[transport], 3)
            print(f"{hosts} hosts {rate} {queue} {algorithm}: shaped/fair "
                  f"{cell['sender_timed']['shaped_over_fair']:.3f} -> "
                  f"{cell['shaped_over_fair']:.3f}, shaped/fcfs "
                  f"{cell['sender_timed']['shaped_over_fcfs']:.3f} -> "
                  f"{cell['shaped_over_fcfs']:.3f}", flush=True)
    print(f"stored predictions reproduced within {check:.2%}")
    write_json_atomic(args.out, {"command": " ".join(sys.argv), "relinked": str(args.table),
                                 "check": round(check, 5), "cells": cells})


if __name__ == "__main__":
    main()
