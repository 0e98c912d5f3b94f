"""Real runs, then the real `bench report` / `bench compare` / reproduce: files and numbers."""

from __future__ import annotations

import csv
import json

import pytest

from hetbench.core.metrics import throughput
from hetbench.core.store import read_jsonl

MATRIX = """
name = "e2e"
algorithms = ["allreduce", "ps-sync"]
workloads = ["mlp-digits"]
workers = [2]
slowdown = ["prob:3"]
seeds = [1]
iterations = 40
warmup_iterations = 3
pace_ms = 10
eval_interval_s = 0.2
target = "accuracy:0.5"
"""


def refined_crossing(run_dir, value):
    """The run's own "target" record, checked against its evaluation grid: it meets the target
    and lies after the last evaluation below it, at or before the first one at or above it."""
    evals, _ = read_jsonl(run_dir / "eval.jsonl")
    grid = [e for e in evals if e["kind"] in ("snapshot", "final")]
    first = next((i for i, e in enumerate(grid) if e["test_accuracy"] >= value), None)
    if first is None:
        return None, None
    (found,) = [e for e in evals if e["kind"] == "target"]
    assert found["test_accuracy"] >= value and found["target"] == f"accuracy:{value:g}"
    assert found["wall_s"] <= grid[first]["wall_s"]
    assert first == 0 or found["wall_s"] > grid[first - 1]["wall_s"]
    return found["wall_s"], found["iteration"]


@pytest.mark.slow
def test_run_then_report_agrees_with_the_event_logs(tmp_path, bench):
    matrix = tmp_path / "e2e.toml"
    matrix.write_text(MATRIX)
    out = tmp_path / "results"
    ran = bench("run", str(matrix), "--out", str(out))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    reported = bench("report", str(out), "--matrix", str(matrix))
    assert reported.returncode == 0, reported.stderr
    for name in ("report.md", "report.csv", "report.html", "time_to_target.csv", "timeline.png",
                 "convergence-mlp-digits-w2-time.png",
                 "convergence-mlp-digits-w2-iterations.png"):
        path = out / name
        assert path.is_file() and path.stat().st_size > 0, name
        assert path.name in reported.stdout
    with (out / "report.csv").open() as f:
        rows = {r["algorithm"]: r for r in csv.DictReader(f)}
    with (out / "time_to_target.csv").open() as f:
        ttt = {r["algorithm"]: r for r in csv.DictReader(f)}
    measured = {}
    for run_dir in sorted(p for p in out.iterdir() if p.is_dir() and not p.name.startswith(".")):
        config = json.loads((run_dir / "config.json").read_text())
        algorithm = config["algorithm"]
        by_rank = {r: read_jsonl(run_dir / f"events.rank{r}.jsonl")[0] for r in range(2)}
        assert [len(v) for v in by_rank.values()] == [40, 40]
        # Throughput recomputed from the raw event lines, independently of summary.json.
        measured[algorithm] = throughput(by_rank, 3)
        assert float(rows[algorithm]["throughput"]) == pytest.approx(measured[algorithm])
        seconds, iteration = refined_crossing(run_dir, 0.5)
        assert seconds is not None, f"{algorithm} never reached accuracy 0.5"
        assert float(ttt[algorithm]["time_to_target_s"]) == pytest.approx(seconds)
        assert float(ttt[algorithm]["iterations_to_target"]) == pytest.approx(iteration)
        assert ttt[algorithm]["target"] == "test accuracy >= 0.5"
    assert float(rows["ps-sync"]["throughput_vs_allreduce"]) == pytest.approx(
        measured["ps-sync"] / measured["allreduce"])
    times = {a: float(ttt[a]["time_to_target_s"]) for a in ("allreduce", "ps-sync")}
    speedup = times["allreduce"] / times["ps-sync"]
    assert float(ttt["ps-sync"]["speedup_vs_allreduce"]) == pytest.approx(speedup)
    assert "Target for mlp-digits: test accuracy >= 0.5 (from matrix)" in (
        out / "report.md").read_text()
    compared = bench("compare", str(out), "--matrix", str(matrix))
    assert compared.returncode == 0, compared.stderr
    ratio = measured["ps-sync"] / measured["allreduce"]
    assert f"| ps-sync | mlp-digits | 2 | prob:3 | 1 vs 1 | {ratio:.3g} (unsupported: 1 seed)" in (
        compared.stdout)


REPRODUCE = """
name = "reproduce-prague-quick"
algorithms = ["allreduce", "ps-sync"]
workloads = ["resnet18"]
workers = [2]
slowdown = ["none", "prob:5"]
iterations = 12
warmup_iterations = 2
[workload.resnet18]
compute = "emulated"
compute_ms = 5
"""


@pytest.mark.slow
def test_reproduce_runs_its_matrix_and_reports_beside_the_papers(tmp_path):
    from hetbench.reports.reproduce import reproduce

    (tmp_path / "reproduce-prague-quick.toml").write_text(REPRODUCE)
    lines: list[str] = []
    paths, failed = reproduce("prague", True, tmp_path / "out", echo=lines.append,
                              matrix_dir=tmp_path)
    assert failed == 0 and len([line for line in lines if line.startswith("ok")]) == 4
    md = paths["md"].read_text()
    section = md.split("## Published vs measured")[1].split("\n## ")[0]
    summaries = {}
    for path in (tmp_path / "out").glob("*/summary.json"):
        s = json.loads(path.read_text())
        summaries[(s["algorithm"], s["slowdown"])] = s["throughput"]
    # The slides' "All-Reduce under 5x slowdown: 0.24" row, with ours beside it.
    ours = summaries[("allreduce", "prob:5")] / summaries[("allreduce", "none")]
    row = next(line for line in section.splitlines()
               if line.startswith("| Prague slides | resnet18 | 2 | allreduce | prob:5"))
    assert f"| 0.24 | {ours:.3g} | throughput ratio |" in row
    # Algorithms not in this matrix are listed as not run, not dropped.
    assert "| adpsgd | none | allreduce (none) | 0.62 |  | not run |" in section
    assert "Emulated compute in: resnet18" in md
    assert paths["html"].read_text().count("Published vs measured") == 1
    published = list(csv.DictReader(paths["published_csv"].open()))
    assert {"source", "published", "measured", "measured as", "shape"} <= set(published[0])
    slides = next(r for r in published if r["algorithm"] == "allreduce"
                  and r["slowdown"] == "prob:5" and r["source"] == "Prague slides")
    assert float(slides["measured"]) == pytest.approx(ours)
