"""The real `bench` CLI in a subprocess: a tiny matrix end to end, resume, and the report."""

import csv
import json

MATRIX = """
name = "tiny"
algorithms = ["allreduce", "ps-async"]
workloads = ["mlp-digits"]
workers = [2]
slowdown = ["none"]
seeds = [1]
iterations = 30
warmup_iterations = 3
"""



def test_run_resume_and_report(tmp_path, bench):
    matrix = tmp_path / "tiny.toml"
    matrix.write_text(MATRIX)
    out = tmp_path / "results"
    first = bench("run", str(matrix), "--out", str(out))
    assert first.returncode == 0, first.stdout + first.stderr
    runs = sorted(p for p in out.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert [r.name.split("-mlp")[0] for r in runs] == ["allreduce", "ps-async"]
    for run in runs:
        files = {p.name for p in run.iterdir()}
        assert {"config.json", "env.json", "summary.json", "eval.jsonl",
                "events.rank0.jsonl", "events.rank1.jsonl"} <= files
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "ok"
        assert summary["iterations"] == 60 and summary["throughput"] > 0
        env = json.loads((run / "env.json").read_text())
        assert {"python", "torch", "hostname", "git_sha"} <= set(env)
        event = json.loads((run / "events.rank1.jsonl").read_text().splitlines()[-1])
        assert event["rank"] == 1 and event["iteration"] == 29
        assert event["t_end"] > event["t_start"] and event["samples"] == 32
        assert {"schema_version", "run_id", "compute_s", "comm_s", "wait_s", "slowdown_s",
                "loss"} <= set(event)

    again = bench("run", str(matrix), "--out", str(out))
    assert again.returncode == 0
    assert again.stdout.count("skip") == 2, again.stdout
    forced = bench("run", str(matrix), "--out", str(out), "--force",
                   "--algorithms", "allreduce")
    assert forced.returncode == 0 and "skip" not in forced.stdout
    assert (out / ".attempts").is_dir()  # the replaced attempt is kept, not deleted

    report = bench("report", str(out))
    assert report.returncode == 0, report.stderr
    with (out / "report.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {"algorithm", "workload", "workers", "slowdown", "throughput",
            "throughput_vs_allreduce"} <= set(rows[0])
    by_algorithm = {r["algorithm"]: r for r in rows}
    assert float(by_algorithm["allreduce"]["throughput_vs_allreduce"]) == 1.0
    ps = json.loads(next(out.glob("ps-async-*/summary.json")).read_text())
    ar = json.loads(next(out.glob("allreduce-*/summary.json")).read_text())
    ratio = float(by_algorithm["ps-async"]["throughput_vs_allreduce"])
    assert abs(ratio - ps["throughput"] / ar["throughput"]) < 1e-6 * ratio
    assert "ps-async" in (out / "report.md").read_text()


def test_flags_only_run(tmp_path, bench):
    out = tmp_path / "demo"
    result = bench("run", "--algorithms", "allreduce", "--workloads", "svm",
                   "--workers", "2", "--slowdown", "det:3@1", "--iterations", "20",
                   "--seeds", "1", "--pace-ms", "5", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    config = json.loads((run / "config.json").read_text())
    assert config["slowdown"] == "det:3@1" and config["pace_ms"] == 5.0
    events = [json.loads(line) for line in (run / "events.rank1.jsonl").read_text().splitlines()]
    # Worker 1 is 3x slower: it sleeps 2x its (paced, >= 5 ms) compute every iteration.
    assert all(e["slowdown_s"] >= 2 * e["compute_s"] * 0.9 for e in events)
    assert all(e["compute_s"] >= 0.005 for e in events)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["synthetic"] is True  # svm without data_file generates its data
