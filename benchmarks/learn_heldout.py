"""The held-out check of issues 37 and 46: does `bench sim --learn`, its timing fitted to real
runs, predict their time to target, and keep the order of the algorithms that the real runs
separate?

    .venv/bin/python benchmarks/learn_heldout.py --out results/benchmarks/learn-heldout
    .venv/bin/python benchmarks/learn_heldout.py --matrix matrices/learn-heldout-clusters.toml \
        --out results/benchmarks/learn-heldout-clusters

runs the matrix for real (default matrices/learn-heldout.toml: 8 workers, mlp-digits, 20 ms
pacing, none and prob:5, every built-in algorithm) into OUT/real, simulates it with --learn and
--fit-from OUT/real into OUT/sim, reports both, and writes OUT/heldout.json and a markdown
table: per cell (algorithm, workers, slowdown) the real and simulated time to the matrix's
target and the error; and every pair of algorithms (same workers and slowdown) whose real times
differ by more than 20%, with whether the simulation orders them alike. The timing is fitted
from the real runs; what is held out is the learning. `--skip-real` reuses OUT/real.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(sys.executable).parent / "bench"
MATRIX = ROOT / "matrices" / "learn-heldout.toml"


def bench(*args) -> None:
    print("$ bench", *map(str, args), flush=True)
    subprocess.run([str(BENCH), *map(str, args)], check=True)


def times(results: Path) -> dict[tuple[str, int, str], float]:
    """(algorithm, workers, slowdown) -> seconds to the target (nan if not reached), from the
    report's time_to_target.csv."""
    found = {}
    with (results / "time_to_target.csv").open() as f:
        for row in csv.DictReader(f):
            value = row.get("time_to_target_s") or "nan"
            found[(row["algorithm"], int(row["workers"]), row["slowdown"])] = float(value)
    return found


def matrix_target(matrix: Path) -> str:
    import tomllib

    target = tomllib.loads(matrix.read_text()).get("target")
    if not isinstance(target, str):
        sys.exit(f"{matrix}: needs one `target = \"accuracy:V\"` for every workload")
    return target


def compare(real: dict, simulated: dict) -> dict:
    cells = []
    for key in sorted(real):
        r, s = real[key], simulated.get(key, math.nan)
        error = (s - r) / r if r == r and s == s else math.nan
        cells.append({"algorithm": key[0], "workers": key[1], "slowdown": key[2], "real_s": r,
                      "sim_s": s, "error": error})
    pairs = []
    for (a, b) in itertools.combinations(sorted(real), 2):
        if a[1:] != b[1:]:
            continue
        ra, rb, sa, sb = real[a], real[b], simulated.get(a, math.nan), simulated.get(b, math.nan)
        if not (ra == ra and rb == rb) or max(ra, rb) / min(ra, rb) <= 1.2:
            continue
        kept = (sa < sb) == (ra < rb) if sa == sa and sb == sb else False
        pairs.append({"workers": a[1], "slowdown": a[2], "faster": a[0] if ra < rb else b[0],
                      "slower": b[0] if ra < rb else a[0], "real_ratio": max(ra, rb) / min(ra, rb),
                      "kept": kept})
    within = [c for c in cells if c["error"] == c["error"] and abs(c["error"]) <= 0.2]
    return {"cells": cells, "pairs": pairs,
            "cells_within_20pct": len(within), "cells_compared": sum(
                1 for c in cells if c["error"] == c["error"]),
            "pairs_kept": sum(p["kept"] for p in pairs), "pairs_separated": len(pairs)}


def markdown(result: dict) -> str:
    lines = ["| algorithm | workers | slowdown | real (s) | simulated (s) | error |",
             "|---|---:|---|---:|---:|---:|"]
    for c in result["cells"]:
        lines.append(f"| {c['algorithm']} | {c['workers']} | {c['slowdown']} | "
                     f"{c['real_s']:.2f} | {c['sim_s']:.2f} | {c['error']:+.0%} |")
    lines += ["", f"{result['cells_within_20pct']} of {result['cells_compared']} cells within "
              f"20%; {result['pairs_kept']} of {result['pairs_separated']} pairs the real runs "
              "separate by more than 20% ordered alike."]
    broken = [p for p in result["pairs"] if not p["kept"]]
    if broken:
        lines.append("Reversed: " + "; ".join(
            f"{p['faster']} < {p['slower']} ({p['workers']} workers, {p['slowdown']}, real "
            f"{p['real_ratio']:.2f}x)"
            for p in broken))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results/benchmarks/learn-heldout")
    parser.add_argument("--matrix", type=Path, default=MATRIX)
    parser.add_argument("--skip-real", action="store_true")
    args = parser.parse_args()
    target = matrix_target(args.matrix)
    real_dir, sim_dir = args.out / "real", args.out / "sim"
    if not args.skip_real:
        bench("run", args.matrix, "--out", real_dir)
    bench("report", real_dir, "--target", target)
    bench("sim", args.matrix, "--learn", "--fit-from", real_dir, "--out", sim_dir)
    bench("report", sim_dir, "--target", target)
    result = compare(times(real_dir), times(sim_dir))
    (args.out / "heldout.json").write_text(json.dumps(result, indent=1))
    print(markdown(result))


if __name__ == "__main__":
    main()
