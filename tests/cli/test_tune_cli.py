"""`bench tune` through the real CLI: equal trials per algorithm, best trial scored."""

import csv
import json

from tests.helpers import QUARTER_MINUTE_CASES, skip_unless_today

MATRIX = """
name = "tune"
algorithms = ["allreduce", "local-sgd"]
workloads = ["mlp-digits"]
workers = [2]
iterations = 40
warmup_iterations = 3
target = "accuracy:0.6"
[tune]
trials = 2
seed = 1
[tune.workload]
lr = {min = 0.02, max = 0.4, scale = "log"}
[tune.algorithm.local-sgd]
period = [2, 4]
"""


def test_tune_runs_equal_trials_and_reports_each_algorithms_best(tmp_path, bench):
    skip_unless_today("tune", QUARTER_MINUTE_CASES, per_day=2)
    matrix = tmp_path / "tune.toml"
    matrix.write_text(MATRIX)
    out = tmp_path / "results"
    done = bench("tune", str(matrix), "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    tuning = json.loads((out / "tune.json").read_text())
    trials = {}
    for run_id, info in tuning["runs"].items():
        trials.setdefault(info["algorithm"], {})[info["trial"]] = (run_id, info["values"])
    assert {a: sorted(t) for a, t in trials.items()} == {"allreduce": [0, 1], "local-sgd": [0, 1]}
    for t in (0, 1):  # one learning rate per trial index, whichever the algorithm
        assert trials["allreduce"][t][1]["lr"] == trials["local-sgd"][t][1]["lr"]
    assert "best_time_to_target_s" in done.stdout  # the tuned table, printed at the end

    # Resume: the same trials are skipped, and a larger budget extends the same sequence.
    more = bench("tune", str(matrix), "--out", str(out), "--trials", "3")
    assert more.returncode == 0, more.stdout + more.stderr
    assert more.stdout.count("skip") == 4 and more.stdout.count("ok ") == 2, more.stdout
    tuning = json.loads((out / "tune.json").read_text())
    assert sorted(i["trial"] for i in tuning["runs"].values()) == [0, 0, 1, 1, 2, 2]

    report = bench("report", str(out))
    assert report.returncode == 0, report.stdout + report.stderr
    text = (out / "report.md").read_text()
    assert "## Tuned comparison" in text and "Hyperparameters tuned" in text
    rows = {r["algorithm"]: r for r in csv.DictReader((out / "tuned.csv").open())}
    assert set(rows) == {"allreduce", "local-sgd"}
    for run_id, info in tuning["runs"].items():
        trials[info["algorithm"]][info["trial"]] = (run_id, info["values"])
    for algorithm, by_trial in trials.items():
        # Each trial's own time to target, from the run's refined "target" evaluation.
        times = {}
        for t, (run_id, _) in by_trial.items():
            records = [json.loads(line) for line in (out / run_id / "eval.jsonl").open()]
            hit = [r["wall_s"] for r in records if r["kind"] == "target"]
            if hit:
                times[t] = hit[0]
        row = rows[algorithm]
        assert int(row["trials"]) == 3 and int(row["reached"]) == len(times)
        assert times, f"no trial of {algorithm} reached 60% in 40 iterations"
        best = min(times, key=times.get)
        assert float(row["best_time_to_target_s"]) == times[best]
        assert int(float(row["best_trial"])) == best
        assert "lr=" in row["best_values"] and (
            algorithm == "allreduce" or "period=" in row["best_values"])
    assert float(rows["allreduce"]["speedup_vs_allreduce"]) == 1.0
