"""Issue 58's rerun of the world-size study's point-to-point cells under the fair transport,
beside the study's first-come-first-served cells.

    .venv/bin/python benchmarks/fair_study_table.py results/clusters-scale-study \
        results/clusters-scale-study-fair [--baseline "allreduce[tree]"]

reads both result directories (learn_study_table.load) and prints, per slowdown, one row per
algorithm the fair directory holds and one column per world size: "A -> B" for the throughput
speedup over the baseline (the fcfs study's tree All-Reduce in the same cell: a collective
is the same under either transport, and the tree is not modeled as flows), then the
time-to-target speedup the same way, with the mean iteration at which the workers met the
target ("not met (acc)" with the final accuracy where they did not). A second table per
slowdown gives fair's throughput over fcfs's and the mechanisms under both (final consensus
distance C, mean staleness S).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from learn_study_table import load


def speedups(cell: dict | None, base: dict | None) -> tuple[str, str]:
    """(throughput speedup, time-to-target speedup with its iteration) of a cell."""
    if cell is None or base is None:
        return "-", "-"
    throughput = f"{cell['throughput'] / base['throughput']:.2f}x"
    if cell["target_s"] is None:
        return throughput, f"not met ({cell['accuracy']:.3f})"
    if base["target_s"] is None:
        return throughput, f"({cell['target_it']:.0f})"
    return throughput, f"{base['target_s'] / cell['target_s']:.2f}x ({cell['target_it']:.0f})"


def tables(fcfs: dict, fair: dict, slowdown: str, baseline: str) -> str:
    sizes = sorted({w for (_, w, s) in fair if s == slowdown})
    algorithms = sorted({a for (a, _, s) in fair if s == slowdown})
    head = ["| algorithm | " + " | ".join(f"{w} workers" for w in sizes) + " |",
            "|---|" + "---|" * len(sizes)]
    speed, moved = list(head), list(head)
    for algorithm in algorithms:
        row, mech = [], []
        for w in sizes:
            base = fcfs.get((baseline, w, slowdown))
            before = fcfs.get((algorithm, w, slowdown))
            after = fair.get((algorithm, w, slowdown))
            (t0, r0), (t1, r1) = speedups(before, base), speedups(after, base)
            row.append(f"{t0} -> {t1}; {r0} -> {r1}")
            if before is None or after is None:
                mech.append("-")
                continue
            mech.append(f"{after['throughput'] / before['throughput']:.2f}x; "
                        f"C {before['consensus']:.2g} -> {after['consensus']:.2g}, "
                        f"S {before['staleness']:.2g} -> {after['staleness']:.2g}")
        speed.append(f"| {algorithm} | " + " | ".join(row) + " |")
        moved.append(f"| {algorithm} | " + " | ".join(mech) + " |")
    return (f"**{slowdown}**: fcfs -> fair, throughput speedup over {baseline}; time-to-target "
            "speedup (iterations to target)\n\n" + "\n".join(speed)
            + f"\n\n**{slowdown}**: fair throughput / fcfs throughput; final consensus distance "
            "C and mean staleness S, fcfs -> fair\n\n" + "\n".join(moved))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fcfs", type=Path, help="the study's results (first come first served)")
    parser.add_argument("fair", type=Path, help="the rerun's results (transport = \"fair\")")
    parser.add_argument("--baseline", default="allreduce[tree]")
    args = parser.parse_args()
    fcfs, fair = load(args.fcfs), load(args.fair)
    for slowdown in sorted({s for (_, _, s) in fair}):
        print()
        print(tables(fcfs, fair, slowdown, args.baseline))


if __name__ == "__main__":
    main()
