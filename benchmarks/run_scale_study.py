"""Run a `bench sim` matrix in pieces, timing each: the world-size study of issue 46, with the
speed goal's numbers (1,024 workers x 1,000 iterations of every algorithm under 5 minutes and
8 GB) measured on the way.

    .venv/bin/python benchmarks/run_scale_study.py matrices/clusters-scale-study.toml \
        --out results/clusters-scale-study [--whole 16,64] [--workers 1024]

World sizes in --whole run as one `bench sim` each (small cells: their start-up would dominate
a cell's time); every other size runs one `bench sim` per (algorithm, slowdown), its wall time
and peak memory (the process's maximum resident set, from wait4) appended to OUT/speed.jsonl.
A piece already in speed.jsonl with exit 0 is skipped, so a stopped study resumes where it
stopped. Each world size has its directory (OUT/w<N>), so two runners on different sizes can
share the machine's two cores (OMP_NUM_THREADS=1 each); the speed goal's times are then those
of a core each.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path


def run_piece(matrix: Path, out: Path, piece: dict) -> dict:
    # A results directory per world size: `bench sim` holds its --out while it runs, and two
    # runners (a core each) may work on two sizes at once; `bench report OUT` reads them all.
    command = [sys.executable, "-m", "hetbench", "sim", str(matrix), "--out",
               str(out / f"w{piece['workers']}"), "--workers", str(piece["workers"])]
    if "algorithm" in piece:
        command += ["--algorithms", piece["algorithm"], "--slowdown", piece["slowdown"]]
    started = time.monotonic()
    with open(out / "study.log", "a") as log:
        log.write(f"$ {' '.join(command)}\n")
        log.flush()
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    return {**piece, "exit": os.waitstatus_to_exitcode(status),
            "wall_s": round(time.monotonic() - started, 1),
            "max_rss_gb": round(usage.ru_maxrss / 2**20, 3),  # ru_maxrss is in KiB on Linux
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("matrix", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--whole", default="", help="world sizes run as one bench sim each")
    parser.add_argument("--workers", default="",
                        help="only these world sizes (default: the matrix's)")
    parser.add_argument("--algorithms", default="",
                        help="only these algorithms, in this order (default: the matrix's)")
    args = parser.parse_args()
    spec = tomllib.loads(args.matrix.read_text())
    sizes = ([int(w) for w in args.workers.split(",")] if args.workers
             else list(spec["workers"]))
    whole = {int(w) for w in args.whole.split(",") if w}
    args.out.mkdir(parents=True, exist_ok=True)
    speed = args.out / "speed.jsonl"
    done = set()
    if speed.exists():
        for line in speed.read_text().splitlines():
            row = json.loads(line)
            if row["exit"] == 0:
                done.add((row["workers"], row.get("algorithm"), row.get("slowdown")))
    pieces = []
    for workers in sizes:
        if workers in whole:
            pieces.append({"workers": workers})
        else:
            algorithms = (args.algorithms.split(",") if args.algorithms
                          else spec["algorithms"])
            pieces += [{"workers": workers, "algorithm": a, "slowdown": s}
                       for a in algorithms for s in spec["slowdown"]]
    todo = [p for p in pieces
            if (p["workers"], p.get("algorithm"), p.get("slowdown")) not in done]
    print(f"{len(pieces) - len(todo)} of {len(pieces)} pieces done already", flush=True)
    failed = 0
    for i, piece in enumerate(todo, 1):
        row = run_piece(args.matrix, args.out, piece)
        with speed.open("a") as handle:  # one line a piece: a stop loses no finished piece
            handle.write(json.dumps(row) + "\n")
        failed += row["exit"] != 0
        print(f"[{i}/{len(todo)}] {piece}: exit {row['exit']}, {row['wall_s']} s, "
              f"{row['max_rss_gb']} GB", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
