"""Issue 56's real-run tables (docs/results/2026-11-27-algorithms-that-change-the-work.md): one
row per real run of a results directory, the per-worker facts of the three algorithms that
change the work, and the speedup tables over allreduce.

    .venv/bin/python benchmarks/work_changing_table.py results/work-changing \
        --labels docs/results/work-changing.json --json docs/results/work-changing.json

Each row: the run's summary numbers, the time and iteration of the target from its eval.jsonl
(null: not reached), the algorithm's own facts, and for dropcompute, batch-balance and
async-diloco each worker's own (DropCompute: share of micro-batches dropped once tau was set;
the batch balancer: mean batch after the warm-up; async DiLoCo: pushes, mean local steps, mean
staleness). A variant's label (async-diloco[dylu=True]) is the report's; `--labels` takes them
from an earlier JSON of the same runs (a run's id hashes its options, so a rerun keeps it).
A table cell is the mean over seeds of each seed's ratio to allreduce's run of the same
workers, slowdown and seed, +- half the range over the seeds. Where the cell's runs were made
in more than one sitting (`--baselines`: an earlier directory's allreduce runs), each run is
divided by the allreduce run started nearest to it: the same sitting's, as a host's speed
drifts by a few percent between sittings.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import statistics
from pathlib import Path

COLUMNS = ["run_id", "algorithm", "workers", "slowdown", "seed", "throughput",
           "final_test_accuracy", "final_test_loss", "time_to_target_s", "iterations_to_target",
           "mean_staleness", "final_consensus_distance", "gradients_dropped", "facts",
           "by_worker", "started_at"]
SLOWDOWNS = ["none", "prob:5", "det:5@1", "replay:bytedance-ar", "preset:production"]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _sig(value, digits: int = 4):
    if not isinstance(value, float) or not math.isfinite(value):
        return value
    return float(f"{value:.{digits}g}")


def by_worker(algorithm: str, run_dir: Path, workers: int, warmup: int) -> dict | None:
    events = [_jsonl(run_dir / f"events.rank{r}.jsonl") for r in range(workers)]
    if algorithm == "dropcompute":
        def share(es):
            after = [e for e in es if e.get("threshold_ms") is not None]
            m = max((e["micro_batches"] + e["dropped_micro_batches"] for e in es), default=0)
            return _sig(sum(e["dropped_micro_batches"] for e in after) / (len(after) * m)
                        if after else 0.0)
        return {"dropped_share_after_tau": [share(es) for es in events]}
    if algorithm == "batch-balance":
        return {"mean_batch": [_sig(statistics.fmean(e["batch"] for e in es[warmup:]))
                               for es in events]}
    if algorithm.startswith("async-diloco"):
        pushes = [[e for e in es if "local_steps" in e] for es in events]
        return {"pushes": [len(p) for p in pushes],
                "mean_local_steps": [_sig(statistics.fmean(e["local_steps"] for e in p))
                                     if p else None for p in pushes],
                "mean_staleness": [_sig(statistics.fmean(e["staleness"] for e in p))
                                   if p else None for p in pushes]}
    return None


def row(run_dir: Path, label: str) -> list:
    summary = json.loads((run_dir / "summary.json").read_text())
    config = json.loads((run_dir / "config.json").read_text())
    target = next((e for e in _jsonl(run_dir / "eval.jsonl") if e.get("kind") == "target"),
                  None)
    facts = summary.get("facts") and {k: _sig(summary.get(k)) for k in summary["facts"]}
    values = {"run_id": summary["run_id"], "algorithm": label, "workers": summary["workers"],
              "slowdown": summary["slowdown"], "seed": summary["seed"],
              "throughput": round(summary["throughput"]),
              "final_test_accuracy": _sig(summary["final_test_accuracy"]),
              "final_test_loss": _sig(summary["final_test_loss"]),
              "time_to_target_s": None if target is None else _sig(target["wall_s"]),
              "iterations_to_target": None if target is None else _sig(target["iteration"]),
              "mean_staleness": _sig(summary.get("mean_staleness")),
              "final_consensus_distance": _sig(summary.get("final_consensus_distance")),
              "gradients_dropped": summary.get("gradients_dropped"),
              "facts": facts or None,
              "by_worker": by_worker(config["algorithm"], run_dir, summary["workers"],
                                     config.get("warmup_iterations", 0)),
              "started_at": summary["started_at"]}
    return [values[c] for c in COLUMNS]


def cell(ratios: list[float]) -> str:
    if not ratios:
        return "-"
    mean = statistics.fmean(ratios)
    return (f"{mean:.2f}" if len(ratios) == 1
            else f"{mean:.2f}±{(max(ratios) - min(ratios)) / 2:.2f}")


def _started(r: dict) -> float:
    return datetime.datetime.fromisoformat(r["started_at"]).timestamp()


def nearest(bases: list[dict], r: dict) -> dict | None:
    """allreduce's run of r's cell and seed started nearest to r (its sitting's)."""
    same = [b for b in bases if (b["slowdown"], b["seed"]) == (r["slowdown"], r["seed"])]
    return min(same, key=lambda b: abs(_started(b) - _started(r)), default=None)


def tables(rows: list[dict]) -> str:
    out = []

    def latest(r):  # the last run of r's cell, algorithm and seed
        return max((x for x in rows if (x["algorithm"], x["workers"], x["slowdown"], x["seed"])
                    == (r["algorithm"], r["workers"], r["slowdown"], r["seed"])),
                   key=_started)

    labels = list(dict.fromkeys(r["algorithm"] for r in sorted(
        rows, key=lambda r: (r["algorithm"] != "allreduce", r["algorithm"]))))
    for workers in sorted({r["workers"] for r in rows}):
        out += [f"**{workers} workers** (real)", "",
                "| algorithm | " + " | ".join(SLOWDOWNS) + " |",
                "|---|" + "---|" * len(SLOWDOWNS)]
        bases = [r for r in rows if r["algorithm"] == "allreduce" and r["workers"] == workers]

        baseline = functools.partial(nearest, bases)
        for label in labels:
            cells = []
            for slowdown in SLOWDOWNS:
                mine = [r for r in rows if r["algorithm"] == label and r["workers"] == workers
                        and r["slowdown"] == slowdown and baseline(r) is not None]
                if label == "allreduce":  # the latest sitting's
                    mine = [r for r in mine if r is latest(r)]
                if not mine:
                    cells.append("-")
                    continue
                speed = [r["throughput"] / baseline(r)["throughput"] for r in mine]
                reached = [r for r in mine if r["time_to_target_s"] is not None
                           and baseline(r)["time_to_target_s"] is not None]
                times = [baseline(r)["time_to_target_s"] / r["time_to_target_s"]
                         for r in reached]
                missed = len(mine) - len(reached)
                if not reached:
                    acc = [r["final_test_accuracy"] for r in mine]
                    tail = f"not met ({cell(acc)})"
                else:
                    tail = cell(times) + (f", {missed} not met" if missed else "")
                cells.append(f"{cell(speed)} / {tail}")
            if any(c != "-" for c in cells):
                out.append(f"| {label} | " + " | ".join(cells) + " |")
        own = []
        for slowdown in SLOWDOWNS:
            mine = [b for b in bases if b["slowdown"] == slowdown and b is latest(b)]
            tps = [r["throughput"] for r in mine]
            ttt = [r["time_to_target_s"] for r in mine if r["time_to_target_s"] is not None]
            own.append(f"{statistics.fmean(tps):.0f}±{(max(tps) - min(tps)) / 2:.0f}, "
                       f"{statistics.fmean(ttt):.1f}±{(max(ttt) - min(ttt)) / 2:.1f} s"
                       if tps and ttt else "-")
        out += ["| allreduce: samples/s, s to 85% | " + " | ".join(own) + " |", ""]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--labels", type=Path, help="an earlier JSON of these runs")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--baselines", type=Path, action="append", default=[],
                        help="an earlier sitting's results: its allreduce runs join the rows")
    args = parser.parse_args()
    labels = {}
    about = "one row per run, its values in the order of columns"
    if args.labels and args.labels.exists():
        earlier = json.loads(args.labels.read_text())
        about = earlier.get("about", about)
        labels = {r[0]: r[1] for r in earlier["runs"]}
    rows = []
    for results in [args.results, *args.baselines]:
        for run_dir in sorted(p for p in results.iterdir() if (p / "summary.json").exists()):
            summary = json.loads((run_dir / "summary.json").read_text())
            if summary.get("status") != "ok" or (
                    results != args.results and summary["algorithm"] != "allreduce"):
                continue
            found = row(run_dir, labels.get(summary["run_id"], summary["algorithm"]))
            if found not in rows:
                rows.append(found)
    if args.json:
        args.json.write_text(json.dumps({"about": about, "columns": COLUMNS, "runs": rows},
                                        separators=(",", ":")) + "\n")
    print(tables([dict(zip(COLUMNS, r, strict=True)) for r in rows]))


if __name__ == "__main__":
    main()
