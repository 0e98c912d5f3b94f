"""A full disk is a clear failure, not a corrupt result (issue 34).

Each test fills a real filesystem: a small tmpfs mounted for the test (CI runs as root). Where
mounting is not permitted the tests skip, saying so.
"""

import json
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from hetbench.core.config import RunConfig
from hetbench.core.store import EventLog, ResultsWriteError, read_jsonl
from hetbench.harness.launch.base import record_run
from tests.distributed.test_signals import GONE_S, TAG_ENV, gone_within

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "results"


@pytest.fixture
def small_disk(tmp_path):
    """mount(size) -> a fresh tmpfs of `size` bytes, unmounted after the test."""
    mounted = []

    def mount(size: int) -> Path:
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                               str(where)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here (needs root or a mount namespace): "
                        f"{done.stderr.strip() or done.returncode}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(disk: Path, leave: int = 0) -> None:
    """Fill `disk` to within `leave` bytes."""
    free = shutil.disk_usage(disk).free - leave
    with (disk / "filler").open("wb") as f:
        try:
            f.write(b"\0" * max(free, 0))
            f.flush()
        except OSError:
            pass


def assert_whole_lines(run_dir: Path) -> int:
    """Every event log ends in a newline and every line parses; returns the lines."""
    lines = 0
    for log in run_dir.glob("*.jsonl"):
        data = log.read_bytes()
        assert not data or data.endswith(b"\n"), f"{log.name} ends in a partial line"
        records, torn = read_jsonl(log)
        assert torn == 0, f"{log.name}: {torn} torn lines"
        lines += len(records)
    return lines


def one_error_line(result) -> str:
    """The failure's one line (notes printed before it, like bench sim's on its default costs,
    are not part of the failure)."""
    lines = [line for line in result.stderr.strip().splitlines()
             if not line.startswith("note: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


@pytest.mark.slow
def test_a_run_into_a_disk_that_fills_fails_in_one_line(small_disk, bench, cli_env):
    disk = small_disk(300_000)
    tag = uuid.uuid4().hex
    out = disk / "out"
    result = bench("run", "--algorithms", "allreduce,dpsgd", "--workloads", "mlp-digits",
                   "--workers", 4, "--iterations", 400, "--out", out,
                   env={**cli_env, TAG_ENV: tag})
    assert result.returncode == 1, result.stdout + result.stderr
    line = one_error_line(result)
    assert "allreduce mlp-digits w=4" in line
    assert "No space left on device" in line or "disk holding the results is full" in line
    assert "1 run(s) not started" in line
    (run_dir,) = [d for d in out.iterdir() if d.is_dir()]
    assert assert_whole_lines(run_dir) > 0
    assert gone_within(tag, GONE_S) == []  # ranks, services, the forkserver: all gone


def test_a_failed_run_whose_summary_cannot_be_written_says_so(small_disk):
    disk = small_disk(1_000_000)
    config = RunConfig.from_dict({"algorithm": "allreduce", "workload": "mlp-digits",
                                  "workers": 2, "iterations": 20})
    run_dir = disk / config.run_id

    def train(services):  # the ranks filled the disk, then one failed
        fill(disk)
        return "rank 1 raised InjectedFault in training at iteration 3: boom"

    with pytest.raises(ResultsWriteError) as raised:
        record_run(config, run_dir, train, cleanup=lambda: None)
    message = str(raised.value)
    assert "failed: rank 1 raised InjectedFault" in message
    assert "summary.json could not be written either, so nothing is on record" in message
    assert not (run_dir / "summary.json").exists()
    assert not list(run_dir.glob(".summary.json.*"))  # no temp file left behind


def test_a_run_that_fails_writing_records_it_and_stops_the_matrix(small_disk):
    disk = small_disk(1_000_000)
    config = RunConfig.from_dict({"algorithm": "allreduce", "workload": "mlp-digits",
                                  "workers": 2, "iterations": 20})
    run_dir = disk / config.run_id

    def train(services):  # as a rank reports a full disk, with room left for the summary
        return ("rank 0 raised ResultsWriteError in training at iteration 2: cannot write "
                f"{run_dir}/events.rank0.jsonl: No space left on device")

    with pytest.raises(ResultsWriteError) as raised:
        record_run(config, run_dir, train, cleanup=lambda: None)
    assert "on record in" in str(raised.value)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "ResultsWriteError" in summary["cause"]


def test_an_event_log_never_ends_in_a_partial_line(small_disk):
    disk = small_disk(64 * 1024)
    log = EventLog(disk / "events.rank0.jsonl")
    record = {"iteration": 0, "payload": "x" * 700}  # lines that do not divide the disk
    written = 0
    with pytest.raises(ResultsWriteError, match="No space left on device"):
        while True:
            log.append({**record, "iteration": written})
            written += 1
    log.close()
    data = (disk / "events.rank0.jsonl").read_bytes()
    assert data.endswith(b"\n")
    records, torn = read_jsonl(disk / "events.rank0.jsonl")
    assert torn == 0 and len(records) == written > 10


def test_sim_into_a_full_disk_fails_in_one_line(small_disk, bench):
    disk = small_disk(200_000)
    out = disk / "out"
    result = bench("sim", "--algorithms", "allreduce,dpsgd", "--workloads", "mlp-digits",
                   "--workers", 8, "--iterations", 400, "--pace-ms", 10, "--events", "full",
                   "--out", out)
    assert result.returncode == 1, result.stdout + result.stderr
    line = one_error_line(result)
    assert "No space left on device" in line and "run(s) not started" in line
    for run_dir in (d for d in out.iterdir() if d.is_dir()):
        assert_whole_lines(run_dir)


@pytest.mark.slow
def test_report_into_a_full_disk_fails_in_one_line(small_disk, bench):
    disk = small_disk(4_000_000)
    results = disk / "results"
    shutil.copytree(FIXTURE, results)
    fill(disk, leave=8192)
    result = bench("report", results)
    assert result.returncode == 1, result.stdout + result.stderr
    line = one_error_line(result)
    assert "No space left on device" in line
