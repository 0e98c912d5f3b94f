"""Issue 37's world-size study as tables: throughput and time to target side by side.

    .venv/bin/python benchmarks/learn_study_table.py results/learn-scale-study

reads the learned simulations of matrices/learn-scale-study.toml (or issue 46's
matrices/clusters-scale-study.toml; `bench sim` into that directory) and prints, per slowdown,
one row per algorithm and one column per world size:
"T x / R x (I)", T the throughput relative to All-Reduce's in the same cell, R All-Reduce's
time to the matrix's target divided by the algorithm's (above 1: it gets there sooner), I the
mean iteration at which it met the target; "not met (acc)" with its final accuracy when it did
not. The two ratios disagree exactly when an algorithm needs more (or fewer) iterations than
All-Reduce: where consensus or staleness eats (or adds to) its speed. A second table per
slowdown gives those mechanisms: final consensus distance, mean staleness, gradients dropped and
iterations skipped.

Run directories are found at any depth (benchmarks/run_scale_study.py writes one directory per
world size). A run whose [network] has `collective = "tree"` is its own row, `allreduce[tree]`
say; `--baseline "allreduce[tree]"` divides by the tree All-Reduce instead of the ring's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def load(results: Path) -> dict[tuple[str, int, str], dict]:
    cells = {}
    for run_dir in sorted(p.parent for p in results.rglob("summary.json")):
        summary = json.loads((run_dir / "summary.json").read_text())
        config = json.loads((run_dir / "config.json").read_text())
        if summary.get("status") != "ok":
            continue
        target = None
        if (run_dir / "eval.jsonl").exists():
            for line in (run_dir / "eval.jsonl").read_text().splitlines():
                record = json.loads(line)
                if record.get("kind") == "target":
                    target = record
                    break
        collective = (config.get("network") or {}).get("collective", "ring")
        name = config["algorithm"] + ("" if collective == "ring" else f"[{collective}]")
        cells[(name, config["workers"], config["slowdown"])] = {
            "throughput": summary["throughput"], "accuracy": summary.get("final_test_accuracy"),
            "target_s": target and target["wall_s"], "target_it": target and target["iteration"],
            "consensus": summary.get("final_consensus_distance"),
            "staleness": summary.get("mean_staleness"),
            "dropped": summary.get("gradients_dropped"),
            "iterations": summary.get("iterations"),
            "skipped": summary.get("sim", {}).get("iterations_skipped")}
    return cells


def table(cells: dict, slowdown: str, baseline: str = "allreduce") -> str:
    sizes = sorted({w for (_, w, s) in cells if s == slowdown})
    algorithms = sorted({a for (a, _, s) in cells if s == slowdown},
                        key=lambda a: (a != baseline, a))
    lines = ["| algorithm | " + " | ".join(f"{w} workers" for w in sizes) + " |",
             "|---|" + "---|" * len(sizes)]
    for algorithm in algorithms:
        row = []
        for w in sizes:
            cell, base = cells.get((algorithm, w, slowdown)), cells.get((baseline, w, slowdown))
            if cell is None or base is None:
                row.append("")
                continue
            throughput = cell["throughput"] / base["throughput"]
            if cell["target_s"] is None:
                row.append(f"{throughput:.2f}x / not met ({cell['accuracy']:.3f})")
            elif base["target_s"] is None:
                row.append(f"{throughput:.2f}x / ({cell['target_it']:.0f})")
            else:
                speedup = base["target_s"] / cell["target_s"]
                row.append(f"{throughput:.2f}x / {speedup:.2f}x ({cell['target_it']:.0f})")
        lines.append(f"| {algorithm} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def mechanisms(cells: dict, slowdown: str) -> str:
    """Per algorithm and size: the final consensus distance, the mean staleness and the
    gradients dropped (and Hop's iterations skipped), the mechanisms a speedup's loss is
    tied to."""
    sizes = sorted({w for (_, w, s) in cells if s == slowdown})
    algorithms = sorted({a for (a, _, s) in cells if s == slowdown},
                        key=lambda a: (a != "allreduce", a))
    lines = ["| algorithm | " + " | ".join(f"{w} workers" for w in sizes) + " |",
             "|---|" + "---|" * len(sizes)]

    def num(value, fmt):
        return "-" if value is None else format(value, fmt)

    for algorithm in algorithms:
        row = []
        for w in sizes:
            cell = cells.get((algorithm, w, slowdown))
            if cell is None:
                row.append("")
                continue
            text = (f"C {num(cell['consensus'], '.2g')}, S {num(cell['staleness'], '.2g')}")
            if cell["dropped"]:
                text += f", D {cell['dropped']}"
            if cell["skipped"]:
                text += f", K {cell['skipped']}"
            row.append(text)
        lines.append(f"| {algorithm} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--baseline", default="allreduce",
                        help="the row the ratios divide by (e.g. allreduce[tree])")
    args = parser.parse_args()
    cells = load(args.results)
    for slowdown in sorted({s for (_, _, s) in cells}):
        print(f"\n**{slowdown}** (throughput / time-to-target speedup over {args.baseline}, "
              "(iterations to target))\n")
        print(table(cells, slowdown, args.baseline))
        print(f"\n**{slowdown}**: final consensus distance C, mean staleness S (iterations), "
              "gradients dropped D, iterations skipped K\n")
        print(mechanisms(cells, slowdown))


if __name__ == "__main__":
    main()
