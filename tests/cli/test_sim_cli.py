"""`bench sim` through the real CLI: results that `bench report` and `bench compare` read."""

import csv
import json
import signal
import subprocess
import time

import pytest

from tests.helpers import SLOW_VARIANT_CASES, skip_unless_today

MATRIX = """
name = "tiny-sim"
algorithms = ["allreduce", "prague-smart", "hop"]
workloads = ["mlp-digits"]
workers = [4]
slowdown = ["none", "det:5@0"]
iterations = 40
pace_ms = 20
"""



def test_sim_then_report_and_compare(tmp_path, bench):
    matrix = tmp_path / "tiny.toml"
    matrix.write_text(MATRIX)
    out = tmp_path / "sim"
    result = bench("sim", str(matrix), "--workers", "4,8", "--alpha-us", "500",
                   "--cpu-us", "200", "--cores", "2", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "default costs" not in result.stderr  # costs given: nothing to warn of
    assert result.stdout.count("sim  ") == 12
    assert "predicted throughput vs allreduce" in result.stdout
    runs = sorted(p for p in out.iterdir() if p.is_dir())
    assert len(runs) == 12
    summary = json.loads((runs[0] / "summary.json").read_text())
    assert summary["simulated"] is True and summary["status"] == "ok"
    assert summary["sim"]["alpha_us"] == 500
    assert abs(summary["sim"]["cpu_per_message_us"] - 200) < 1e-9 and summary["sim"]["cores"] == 2

    report = bench("report", str(out))
    assert report.returncode == 0, report.stderr
    with (out / "report.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 12
    hop_det = next(r for r in rows if r["algorithm"] == "hop" and r["slowdown"] == "det:5@0"
                   and r["workers"] == "8")
    assert float(hop_det["throughput_vs_allreduce"]) > 2

    compare = bench("compare", str(out))
    assert compare.returncode == 0, compare.stderr
    assert "prague-smart" in compare.stdout


def test_sim_with_default_costs_says_so_first_and_how_to_fit_them(tmp_path, bench):
    result = bench("sim", "--algorithms", "allreduce", "--workloads", "mlp-digits", "--workers",
                   "4", "--iterations", "10", "--pace-ms", "5", "--out", tmp_path / "sim")
    assert result.returncode == 0, result.stderr
    first = result.stderr.splitlines()[0]
    assert first.startswith("note: default costs") and "--fit-from RESULTS" in first


@pytest.mark.slow
def test_sim_bad_input_is_one_line_and_exit_2(tmp_path, bench):
    cases = [
        ("--algorithms", "allreduce", "--workloads", "mlp-digits", "--workers", "4"),
        ("--algorithms", "allreduce", "--workloads", "mlp-digits", "--workers", "4",
         "--compute-ms", "5", "--fit-from", str(tmp_path)),
        ("--algorithms", "allreduce", "--workloads", "mlp-digits", "--workers", "4",
         "--pace-ms", "20", "--beta-gbps", "0"),
        ("--algorithms", "nope", "--workloads", "mlp-digits", "--workers", "4"),
        ("--against", str(tmp_path / "missing"), "--compute-ms", "10"),
        ("--algorithms", "allreduce", "--workloads", "mlp-digits", "--workers", "4",
         "--pace-ms", "20", "--cores", "0"),
        ("--algorithms", "allreduce", "--workloads", "mlp-digits", "--workers", "4",
         "--pace-ms", "20", "--cpu-us", "-1"),
    ]
    for args in cases:
        result = bench("sim", *args, "--out", str(tmp_path / "o"))
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, result.stderr)


@pytest.mark.slow
def test_sigterm_marks_the_simulation_interrupted_and_a_rerun_replaces_it(tmp_path, bench_cmd,
                                                                          cli_env, bench):
    """bench sim stops on SIGTERM as bench run does (issue 22): the run being simulated is on
    record as interrupted, bench exits 143, and the next `bench sim` replaces it."""
    skip_unless_today("sim-sigterm", SLOW_VARIANT_CASES, per_day=4)
    out = tmp_path / "sim"
    args = ["sim", "--algorithms", "prague-smart", "--workloads", "svm", "--workers", "512",
            "--iterations", "1500", "--pace-ms", "10", "--out", str(out)]
    proc = subprocess.Popen([*bench_cmd, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=cli_env)
    first = proc.stdout.readline()
    assert first.startswith("note: default costs"), first
    assert "simulated run(s)" in proc.stdout.readline()
    deadline = time.time() + 60
    while not list(out.glob("*/config.json")) and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # into the simulation (seconds at this size)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, output
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]  # beside matrix.json
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["cause"]) == ("interrupted", "interrupted by SIGTERM")
    assert summary["simulated"] is True
    # A simulation killed before its summary (SIGKILL) is replaced as well.
    (run_dir / "summary.json").unlink()
    rerun = bench(*args)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "ok"


def test_bench_sim_plays_the_template_algorithm(tmp_path, bench):
    """The template's simulated half: local SGD averages one step in `period`, on record as
    the real one would put it (peers in every event, sync_share in the summary)."""
    out = tmp_path / "sim"
    result = bench("sim", "--algorithms", "local-sgd,allreduce", "--workloads", "mlp-digits",
                   "--workers", "8", "--iterations", "40", "--pace-ms", "10",
                   "--slowdown", "prob:5", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    local = json.loads(next(out.glob("local-sgd-*/summary.json")).read_text())
    allreduce = json.loads(next(out.glob("allreduce-*/summary.json")).read_text())
    assert local["status"] == "ok" and local["iterations"] == 8 * 40
    assert local["sync_share"] == local["sync_intended"] == 1 / 4
    assert allreduce["sync_share"] == 1 and allreduce["mean_group_size"] == 8
    # Random stragglers: over four steps the slow draws even out, where all-reduce waits for
    # the slowest at every step. (A fixed straggler would gain nothing: everyone waits for its
    # four steps at the average.)
    assert local["throughput"] > allreduce["throughput"]


@pytest.mark.slow
def test_big_simulations_keep_one_record_per_worker_and_still_report(tmp_path, bench):
    """Above 64 workers `bench sim` writes workers.json instead of an event line per
    worker-iteration (--events full writes them anyway); the report still has every row, says
    why it attributes no waiting, and draws no timeline rather than an empty one."""
    skip_unless_today("big-simulation-records", SLOW_VARIANT_CASES, per_day=4)
    out = tmp_path / "sim"
    common = ["--algorithms", "allreduce,hop", "--workloads", "mlp-digits", "--workers", "128",
              "--iterations", "10", "--pace-ms", "20"]
    result = bench("sim", *common, "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    runs = sorted(p for p in out.iterdir() if p.is_dir())
    for run in runs:
        assert (run / "workers.json").exists() and not list(run.glob("events.rank*"))
    report = bench("report", str(out))
    assert report.returncode == 0, report.stderr
    with (out / "report.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 2
    assert not (out / "timeline.png").exists()
    assert "no event lines" in (out / "report.md").read_text()
    drawn = bench("report", str(out), "--timeline", runs[0].name)
    assert drawn.returncode == 2 and "--events full" in drawn.stderr

    full = bench("sim", *common, "--events", "full", "--out", str(tmp_path / "full"))
    assert full.returncode == 0, full.stderr
    run = next(p for p in (tmp_path / "full").iterdir() if p.is_dir())
    assert len(list(run.glob("events.rank*.jsonl"))) == 128


def test_sim_labels_a_swept_option_in_progress_and_speedup_lines(tmp_path, bench):
    """Two runs of one algorithm that differ in a swept option are told apart wherever bench
    sim names them: `dpsgd` (the default, ring) and `dpsgd[topology=exponential]`, not two
    lines both saying `dpsgd`."""
    matrix = tmp_path / "swept.toml"
    matrix.write_text('name = "swept"\nalgorithms = ["allreduce", "dpsgd"]\n'
                      'workloads = ["mlp-digits"]\nworkers = [4]\nslowdown = ["none"]\n'
                      'iterations = 10\npace_ms = 20\n'
                      '[algorithm.dpsgd]\ntopology = ["ring", "exponential"]\n')
    result = bench("sim", str(matrix), "--out", str(tmp_path / "sim"))
    assert result.returncode == 0, result.stdout + result.stderr
    progress, _, speedups = result.stdout.partition("predicted throughput vs allreduce")
    for lines in (progress, speedups):
        assert "dpsgd[topology=exponential] mlp-digits" in lines
        assert "dpsgd mlp-digits" in lines


@pytest.mark.slow
def test_a_report_of_runs_stored_without_event_lines_skips_the_timeline(tmp_path, bench):
    """A study kept as config, summary and evaluations (its event lines left out to save
    space) still reports: the default timeline run has nothing to draw, so there is none, with
    a warning, instead of an error that loses the whole report."""
    out = tmp_path / "sim"
    result = bench("sim", "--algorithms", "allreduce,dpsgd", "--workloads", "mlp-digits",
                   "--workers", "4", "--iterations", "10", "--pace-ms", "20", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    for events in out.glob("*/events*.jsonl"):
        events.unlink()
    report = bench("report", str(out))
    assert report.returncode == 0, report.stderr
    assert "no timeline" in report.stderr
    assert not (out / "timeline.png").exists() and (out / "report.md").exists()
