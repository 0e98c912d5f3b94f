"""`--launcher slurm` on a real SLURM cluster (issue 43): `bench testbed up --slurm` runs
slurmctld and slurmdbd on h1, a slurmd on each host, munge and MariaDB, and `bench run
--launcher slurm` on h1 submits every run through submitit's SlurmExecutor, whose job states
come from sacct (slurmdbd), not from a guess.

Skipped without root, namespaces, or the Debian packages (.ci/run installs them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hetbench import testbed
from hetbench.testbed import slurm as slurm_cluster
from tests.helpers import (
    ACROSS_HOSTS_MATRIX,
    HALF_MINUTE_CASES,
    LOCKSTEP,
    QUICK_ALGORITHMS,
    final_models,
    is_today,
    rotation_day,
)


def _missing() -> str | None:
    if os.geteuid() != 0 or not Path("/proc/self/ns/net").exists():
        return "the test bed makes network namespaces: needs root and a kernel with them"
    try:
        slurm_cluster.check_installed()
    except Exception as exc:  # UserError: which packages
        return str(exc)
    return None


pytestmark = [
    pytest.mark.slow,  # across hosts: CI's full run (the quick tier is one host's)
    pytest.mark.skipif(_missing() is not None, reason=str(_missing())),
    # One launcher across hosts a day (tests/distributed/test_multihost.py has the others).
    pytest.mark.skipif(not is_today("slurm", HALF_MINUTE_CASES),
                       reason="rotated by day: another launcher runs across hosts today "
                              "(HETBENCH_TEST_ALL=1 runs every one)"),
]

ROOT = Path(__file__).resolve().parents[2]
QUICK, DETERMINISTIC = QUICK_ALGORITHMS, LOCKSTEP
MATRIX = ('name = "slurm-bed"\nlauncher = "slurm"\nbind_host = "0.0.0.0"\n'
          + ACROSS_HOSTS_MATRIX + "\n[slurm]\nnodes = 3\ntimeout_min = 10\n")


@pytest.fixture(scope="module")
def cluster():
    name = f"q{os.getpid() % 100000}"
    testbed.down(name)
    made = testbed.up(name, hosts=3, subnet="10.77.3", slurm=True)
    try:
        yield made
    finally:
        testbed.down(name)
    assert not Path(made.slurm["dir"]).exists()


def todays() -> list[str]:
    """A lockstep algorithm (checked against a local run's models) and one of the others."""
    day = rotation_day()
    checked = sorted(DETERMINISTIC)
    others = [a for a in QUICK if a not in DETERMINISTIC]
    return [checked[day % len(checked)], others[(day + 1) % len(others)]]


def test_todays_algorithms_run_as_slurm_jobs_with_real_job_states(cluster, tmp_path, bench):
    algorithms = todays()
    matrix = tmp_path / "slurm.toml"
    matrix.write_text(MATRIX)
    done = cluster.run("h1", [sys.executable, "-m", "hetbench", "run", str(matrix),
                              "--algorithms", ",".join(algorithms), "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, cwd=ROOT, timeout=600,
                       stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = {json.loads(p.read_text())["algorithm"]: p.parent
            for p in (tmp_path / "out").glob("*/summary.json")}
    assert sorted(runs) == sorted(algorithms)
    for algorithm, run_dir in runs.items():
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "ok", summary["cause"]
        world = summary["world_size"]
        hosts = {json.loads((run_dir / f"done.rank{r}.json").read_text())["clock"]["host"]
                 for r in range(world)}
        # Two ranks a node (cpus 2 each): 4 ranks on two hosts, the Parameter Server's 5 on 3.
        assert len(hosts) == (world + 1) // 2, (algorithm, hosts)
        # sacct, through slurmdbd, knows the job and its end (recorded a moment after the
        # ranks' results, which is when bench saw the job done).
        job = next((run_dir / "slurm").glob("*_submitted.pkl")).name.split("_")[0]
        deadline = time.monotonic() + 60
        while True:
            state = cluster.run("h1", ["sacct", "-n", "-X", "-P", "-o", "State", "-j", job],
                                capture_output=True, text=True, timeout=30).stdout.split()
            if state != ["RUNNING"] or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert state == ["COMPLETED"], (algorithm, job, state)
    checked = [a for a in algorithms if a in DETERMINISTIC]
    local = bench("run", matrix, "--algorithms", ",".join(checked), "--launcher", "local",
                  "--out", tmp_path / "local")
    assert local.returncode == 0, local.stderr[-3000:]
    reference = {json.loads(p.read_text())["algorithm"]: p.parent
                 for p in (tmp_path / "local").glob("*/summary.json")}
    for algorithm in checked:
        for mine, theirs in zip(final_models(runs[algorithm], 4),
                                final_models(reference[algorithm], 4), strict=True):
            np.testing.assert_array_equal(mine, theirs, err_msg=algorithm)
