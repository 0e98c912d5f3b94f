"""Faults end a run cleanly: within a bound, with the right cause, and no process left behind."""

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from hetbench.core.registry import ALGORITHMS
from hetbench.errors import UserError
from tests.helpers import SLOW_VARIANT_CASES, rotation_day, run_config, skip_unless_today

#: A failure must end the whole run within this many seconds (issue: 60 s).
BOUND_S = 60


def available_algorithms() -> list[str]:
    names = []
    for name in ALGORITHMS.names():
        try:
            ALGORITHMS.get(name)
        except UserError:
            continue
        names.append(name)
    return names


QUICK = ["allreduce", "ps-async"]


def rank_pids(run_dir: Path) -> dict[int, int]:
    pids = {}
    for log in run_dir.glob("worker.rank*.log"):
        match = re.search(r"started \(pid (\d+)\)", log.read_text())
        if match:
            pids[int(log.name.split("rank")[1].split(".")[0])] = int(match[1])
    return pids


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes (its parent has yet to reap it).
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "State:\tZ" not in status.read_text()


def assert_no_survivors(run_dir: Path, world_size: int) -> None:
    pids = rank_pids(run_dir)
    assert len(pids) == world_size, f"expected a pid per rank, got {pids}"
    survivors = [pid for pid in pids.values() if alive(pid)]
    assert not survivors, f"processes of the run still alive: {survivors}"


def run_with_fault(tmp_path, algorithm, fault, **extra):
    fields = dict(algorithm=algorithm, workload="mlp-digits", workers=4, iterations=60,
                  fault=fault, comm_timeout_s=5.0, pace_ms=5, **extra)
    start = time.time()
    summary = run_config(tmp_path, **fields)
    return summary, time.time() - start


#: The three faults below (a crash, SIGKILL, a hang), in the order the others take turns.
FAULTS = ("crash", "sigkill", "hang")


def _params(names, fault: str):
    """QUICK's algorithms meet every fault. Of the others, half meet a fault each day
    (tests.helpers.rotation_day: the halves alternate), each one of the three in turn, shifted
    every other day: every algorithm meets a fault every two days and every fault in six, and
    every fault hits algorithms of every kind each day, at a sixth of the cross product's runs
    (each a real 4-rank world, 4-9 s; the launcher, not the algorithm, ends a failed run, so
    the full cross product bought little)."""
    day = rotation_day()
    others = [n for i, n in enumerate(n for n in names if n not in QUICK) if i % 2 == day % 2]
    mine = [n for i, n in enumerate(others)
            if FAULTS[(i + day // 2) % len(FAULTS)] == fault]
    return [pytest.param(n, marks=() if n in QUICK else pytest.mark.slow)
            for n in names if n in QUICK or n in mine]


@pytest.mark.parametrize("algorithm", _params(available_algorithms(), "crash"))
def test_crash_fails_the_run_with_its_cause(tmp_path, algorithm):
    summary, took = run_with_fault(tmp_path, algorithm, "crash@1:10")
    assert summary["status"] == "failed"
    assert "rank 1 raised InjectedFault" in summary["cause"], summary["cause"]
    assert "iteration 10" in summary["cause"]
    assert took < BOUND_S
    assert_no_survivors(tmp_path, summary["world_size"])


@pytest.mark.parametrize("algorithm", _params(available_algorithms(), "sigkill"))
def test_sigkill_fails_the_run_naming_the_signal(tmp_path, algorithm):
    summary, took = run_with_fault(tmp_path, algorithm, "kill@2:10")
    assert summary["status"] == "failed"
    assert "rank 2 was killed by SIGKILL" in summary["cause"], summary["cause"]
    assert took < BOUND_S
    assert_no_survivors(tmp_path, summary["world_size"])


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", _params(available_algorithms(), "hang"))
def test_hung_worker_fails_the_run_within_the_bound(tmp_path, algorithm):
    summary, took = run_with_fault(tmp_path, algorithm, "hang@3:10")
    assert summary["status"] == "failed"
    assert "rank 3 hung" in summary["cause"] or "no rank made progress" in summary["cause"], \
        summary["cause"]
    assert took < BOUND_S
    assert_no_survivors(tmp_path, summary["world_size"])


def _wait_for(predicate, timeout_s, what):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _training_run(out: Path):
    """The run dir of the matrix's run once its rank 0 has logged a few iterations."""
    def ready():
        for events in out.glob("*/events.rank0.jsonl"):
            if events.read_text().count("\n") >= 5:
                return events.parent
        return None
    return _wait_for(ready, 90, "training to start")


@pytest.mark.slow
def test_external_sigkill_of_a_worker(tmp_path, bench_cmd, cli_env):
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [*bench_cmd, "run", "--algorithms", "allreduce", "--workloads", "mlp-digits",
         "--workers", "4", "--iterations", "100000", "--pace-ms", "5", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cli_env)
    run_dir = _training_run(out)
    victim = rank_pids(run_dir)[2]
    os.kill(victim, signal.SIGKILL)
    killed_at = time.time()
    output, _ = proc.communicate(timeout=BOUND_S)
    assert time.time() - killed_at < BOUND_S
    assert proc.returncode == 1, output  # the matrix had a failed run
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert summary["cause"].startswith("rank 2 was killed by SIGKILL"), summary["cause"]
    assert_no_survivors(run_dir, 4)


@pytest.mark.slow
def test_ctrl_c_marks_the_run_interrupted_and_leaves_nothing(tmp_path, bench_cmd, cli_env):
    out = tmp_path / "out"
    matrix = tmp_path / "m.toml"
    matrix.write_text('algorithms = ["allreduce", "ps-sync"]\nworkloads = ["mlp-digits"]\n'
                      "workers = [2]\niterations = 100000\npace_ms = 5\n")
    # SIGINT back to its default in the child: a suite started in the background by a
    # non-interactive shell (`make test &`) inherits SIGINT ignored, and so would `bench`.
    proc = subprocess.Popen([*bench_cmd, "run", str(matrix), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=cli_env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    run_dir = _training_run(out)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=BOUND_S)
    assert proc.returncode == 130, output
    assert "interrupted" in output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert not (out / "ps-sync").exists() and len(list(out.glob("ps-sync-*"))) == 0
    assert_no_survivors(run_dir, 2)


@pytest.mark.slow
def test_killed_group_generator_fails_prague_smart_with_that_cause(tmp_path, bench_cmd, cli_env):
    skip_unless_today("killed-group-generator", SLOW_VARIANT_CASES, per_day=4)
    out = tmp_path / "out"
    matrix = tmp_path / "m.toml"
    matrix.write_text('algorithms = ["prague-smart"]\nworkloads = ["mlp-digits"]\n'
                      "workers = [4]\niterations = 100000\npace_ms = 5\ncomm_timeout_s = 5\n"
                      "[algorithm.prague-smart]\ngroup_size = 2\n")
    proc = subprocess.Popen([*bench_cmd, "run", str(matrix), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=cli_env)
    run_dir = _training_run(out)
    gg_pid = json.loads((run_dir / "services.json").read_text())["gg_pid"]
    os.kill(gg_pid, signal.SIGKILL)
    killed_at = time.time()
    output, _ = proc.communicate(timeout=BOUND_S)
    assert time.time() - killed_at < BOUND_S
    assert proc.returncode == 1, output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert "group generator" in summary["cause"] and "unreachable" in summary["cause"], \
        summary["cause"]
    assert_no_survivors(run_dir, 4)
