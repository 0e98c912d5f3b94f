"""Does a shifted clock change what hetbench reports? (issue 43)

Two test beds of two hosts each, the same in all but h2's clock: 50 ms ahead (libfaketime) in
one. The same run (All-Reduce, 4 workers as h1:2,h2:2, worker 0 a 3x straggler, paced) goes
through `bench run --launcher torchrun --hosts` on each bed, alternating, ROUNDS times. For each
run: throughput, training wall time, the waits attributed to the straggler, and how far apart the
ranks' stamps of each iteration's end are (All-Reduce's ranks leave each step together, so the
spread is what the clocks disagree by, plus the collective's own jitter). The raw spread is the
same stamps with the applied offset taken back out: what the reports would have read without
alignment.

    python benchmarks/clock_alignment.py --rounds 3 --out docs/results/clock-alignment.json

Needs root, network namespaces and libfaketime (apt-get install faketime).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hetbench import testbed  # noqa: E402
from hetbench.core.record import read_events  # noqa: E402
from hetbench.core.store import read_json  # noqa: E402
from hetbench.reports.waits import run_waits  # noqa: E402

SHIFT_S = 0.050
RUN = ["--algorithms", "allreduce", "--workloads", "mlp-digits", "--workers", "4",
       "--iterations", "60", "--pace-ms", "10", "--slowdown", "det:3@0"]


def run_on(bed: testbed.Bed, out: Path, seed: int) -> Path:
    agent = f"{sys.executable} -m hetbench testbed rsh --name {bed.name}"
    done = bed.run("h1", [sys.executable, "-m", "hetbench", "run", *RUN, "--seeds", f"{seed},",
                          "--launcher", "torchrun", "--hosts", "h1:2,h2:2",
                          "--rsh-agent", agent, "--out", str(out)],
                   capture_output=True, text=True, cwd=ROOT, timeout=600,
                   stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise SystemExit(f"run on {bed.name} failed: {done.stderr[-2000:]}")
    (run_dir,) = [p.parent for p in out.glob("*/summary.json")]
    return run_dir


def figures(run_dir: Path) -> dict:
    summary = read_json(run_dir / "summary.json")
    waits = run_waits(run_dir)
    on_straggler = waits.table[waits.table["waited_on"] == 0]["wait_s"].sum()
    total = waits.table["wait_s"].sum()
    events = {r: read_events(run_dir, r)[0] for r in range(4)}
    applied = {r: (read_json(run_dir / f"done.rank{r}.json")["clock"] or {}) for r in range(4)}
    raw_shift = {r: (c["start"]["offset_ns"] if c.get("aligned") else 0)
                 for r, c in applied.items()}
    spreads, raw_spreads = [], []
    for k in range(5, len(events[0])):  # past the warm-up
        ends = [events[r][k]["t_end"] for r in range(4)]
        raw = [events[r][k]["t_end"] - raw_shift[r] for r in range(4)]
        spreads.append((max(ends) - min(ends)) / 1e6)
        raw_spreads.append((max(raw) - min(raw)) / 1e6)
    return {"throughput": summary["throughput"], "train_wall_s": summary["train_wall_s"],
            "waits_s": total, "waits_on_straggler_share": on_straggler / total if total else None,
            "end_spread_ms_median": statistics.median(spreads),
            "end_spread_ms_max": max(spreads),
            "raw_end_spread_ms_median": statistics.median(raw_spreads),
            **{k: summary.get(k) for k in ("clock_hosts", "clock_offset_ms", "clock_error_ms",
                                           "clock_drift_ms")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "docs/results/clock-alignment.json")
    args = parser.parse_args()
    plain = testbed.up("ckp", hosts=2, subnet="10.79.0")
    try:
        shifted = testbed.up("cks", hosts=2, subnet="10.79.1", clock_offsets={"h2": SHIFT_S})
        try:
            rows = []
            with tempfile.TemporaryDirectory() as tmp:
                for i in range(args.rounds):
                    order = (plain, shifted) if i % 2 == 0 else (shifted, plain)
                    for bed in order:
                        run_dir = run_on(bed, Path(tmp) / f"{bed.name}-{i}", seed=1)
                        row = {"bed": "shifted" if bed is shifted else "plain", "round": i,
                               **figures(run_dir)}
                        print(json.dumps(row), flush=True)
                        rows.append(row)
        finally:
            testbed.down("cks")
    finally:
        testbed.down("ckp")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"shift_s": SHIFT_S, "run": RUN, "rows": rows}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
