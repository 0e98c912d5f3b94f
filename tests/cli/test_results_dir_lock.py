"""One writer per results directory (issue 34): the real `bench` in subprocesses, racing."""

import json
import subprocess
import time

import pytest

from hetbench.core.lock import LOCK_FILE
from tests.helpers import QUARTER_MINUTE_CASES, skip_unless_today

MATRIX = """
name = "race"
algorithms = ["allreduce", "dpsgd"]
workloads = ["mlp-digits"]
workers = [2]
slowdown = ["none"]
seeds = [1]
iterations = 150
warmup_iterations = 3
pace_ms = 10.0
"""


def start_bench(bench_cmd, cli_env, *args):
    return subprocess.Popen([*bench_cmd, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=cli_env,
                            stdin=subprocess.DEVNULL)


def wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
def test_a_second_writer_is_refused_and_the_first_finishes_every_run(tmp_path, bench,
                                                                     bench_cmd, cli_env):
    matrix = tmp_path / "race.toml"
    matrix.write_text(MATRIX)
    out = tmp_path / "results"
    first = start_bench(bench_cmd, cli_env, "run", matrix, "--out", out)
    try:
        # The first is training (an event line written) when the second starts.
        assert wait_for(lambda: any(out.glob("*/events.rank0.jsonl")), 120), "never started"
        holder = json.loads((out / LOCK_FILE).read_text())
        assert holder["pid"] == first.pid and holder["command"] == "bench run"
        started = time.time()
        second = bench("run", matrix, "--out", out, timeout=60)
        refused_s = time.time() - started
        first_out, first_err = first.communicate(timeout=240)
    finally:
        first.kill()
    assert second.returncode == 2, second.stdout + second.stderr
    assert refused_s < 10
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), second.stderr
    assert "in use by `bench run`" in lines[0] and f"pid {first.pid}" in lines[0]
    assert "since " in lines[0] and "--wait" in lines[0]
    assert "Traceback" not in second.stderr and not (out / ".attempts").exists()

    assert first.returncode == 0, first_out + first_err
    assert first_out.count("ok ") == 2, first_out
    for summary_path in out.glob("*/summary.json"):
        summary = json.loads(summary_path.read_text())
        assert summary["status"] == "ok" and summary["throughput"] > 0
        assert summary["iterations"] == 300
    assert not (out / LOCK_FILE).exists()  # a writer that ends removes its lock file


@pytest.mark.slow
def test_wait_runs_after_the_holder_and_skips_what_it_finished(tmp_path, bench_cmd, cli_env):
    matrix = tmp_path / "race.toml"
    matrix.write_text(MATRIX.replace("iterations = 150", "iterations = 40"))
    out = tmp_path / "results"
    first = start_bench(bench_cmd, cli_env, "run", matrix, "--out", out)
    try:
        assert wait_for(lambda: (out / LOCK_FILE).exists() and (out / LOCK_FILE).stat().st_size,
                        120)
        second = start_bench(bench_cmd, cli_env, "run", matrix, "--out", out, "--wait")
        second_out, second_err = second.communicate(timeout=240)
        first_out, _ = first.communicate(timeout=240)
    finally:
        first.kill()
    assert first.returncode == 0 and first_out.count("ok ") == 2
    assert second.returncode == 0, second_out + second_err
    assert "waiting for `bench run`" in second_err
    # It ran only once the first had finished both runs.
    assert second_out.count("skip") == 2, second_out


@pytest.mark.slow
def test_a_writer_killed_outright_leaves_no_lock(tmp_path, bench, bench_cmd, cli_env):
    matrix = tmp_path / "race.toml"
    matrix.write_text(MATRIX.replace("iterations = 150", "iterations = 20"))
    out = tmp_path / "results"
    killed = start_bench(bench_cmd, cli_env, "run", matrix, "--out", out)
    assert wait_for(lambda: any(out.glob("*/events.rank0.jsonl")), 120)
    killed.kill()
    killed.communicate(timeout=60)
    assert (out / LOCK_FILE).exists()  # the file stays; the flock died with its holder
    rerun = bench("run", matrix, "--out", out)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    # Its launcher provably gone (the lock was free), the cut-off run is set aside and rerun.
    assert "rerun" in rerun.stdout and rerun.stdout.count("ok ") == 2
    assert (out / ".attempts").is_dir()


@pytest.mark.slow
def test_sim_is_refused_while_a_run_writes_and_report_counts_runs_in_progress(tmp_path, bench,
                                                                            bench_cmd, cli_env):
    skip_unless_today("sim-refused-while-writing", QUARTER_MINUTE_CASES, per_day=2)
    matrix = tmp_path / "race.toml"
    # The writer must still be training when `bench report` runs, after `bench sim` (each a
    # few seconds of start-up on a loaded machine): 400 iterations (4 s) once ended first.
    # 5000 is 50 s of pacing; it is killed as soon as both have run.
    matrix.write_text(MATRIX.replace("iterations = 150", "iterations = 5000"))
    out = tmp_path / "results"
    first = bench("run", matrix, "--out", out, "--algorithms", "allreduce", "--iterations", 20)
    assert first.returncode == 0, first.stderr
    writer = start_bench(bench_cmd, cli_env, "run", matrix, "--out", out,
                         "--algorithms", "dpsgd")
    try:
        assert wait_for(lambda: any(out.glob("dpsgd*/events.rank0.jsonl")), 120)
        sim = bench("sim", matrix, "--out", out)
        report = bench("report", out)
    finally:
        writer.kill()
        writer.communicate(timeout=60)
    assert sim.returncode == 2 and "in use by `bench run`" in sim.stderr, sim.stderr
    assert report.returncode == 0, report.stderr
    assert "1 run(s) in progress, not reported" in report.stderr
    rows = (out / "report.csv").read_text().splitlines()
    assert len(rows) == 2 and rows[1].startswith("allreduce,")  # only the finished run
    assert "1 run(s) in progress" in (out / "report.md").read_text()
