"""The torchrun and mpirun launchers against the local one: same seed, same results.

Everything here starts real processes: two torchrun agents on loopback standing in for two
machines (the documented multi-node path: `bench run --prepare`, torchrun on each node, `bench
summarize`), and `bench run --launcher torchrun|mpi` on one machine.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hetbench.core.config import RunConfig
from hetbench.harness.launch import make_launcher
from hetbench.harness.launch.external import prepare, summarize_run_dir
from hetbench.harness.launch.local import LocalLauncher
from tests.helpers import events, final_models, skip_unless_today

# Short runs whose outcome is deterministic for a seed: fixed iterations, no slowdown, one
# evaluation at the end (the wall-clock snapshots are the only timing-dependent records).
BASE = {"workload": "mlp-digits", "workers": 4, "iterations": 8, "warmup_iterations": 2,
        "seed": 3, "save_models": True, "eval_interval_s": 600.0, "comm_timeout_s": 30.0}
OPTIONS = {"allreduce": {}, "prague-static": {"workers_per_node": 2}}

try:
    import mpi4py  # noqa: F401

    HAVE_MPI = Path(sys.executable).with_name("mpirun").exists()
except ImportError:
    HAVE_MPI = False
needs_mpi = pytest.mark.skipif(not HAVE_MPI, reason="pip install -e '.[mpi]' for mpirun")


def config_for(algorithm: str, launcher: str, **extra) -> RunConfig:
    return RunConfig(algorithm=algorithm, algorithm_options=OPTIONS[algorithm],
                     launcher=launcher, **{**BASE, **extra})


@pytest.fixture(scope="module")
def local_results(tmp_path_factory):
    """The local launcher's run of each algorithm, the reference (made once per module)."""
    made: dict[str, Path] = {}

    def get(algorithm: str) -> Path:
        if algorithm not in made:
            run_dir = tmp_path_factory.mktemp(f"local-{algorithm}")
            summary = LocalLauncher().run(config_for(algorithm, "local"), run_dir)
            assert summary["status"] == "ok", summary["cause"]
            made[algorithm] = run_dir
        return made[algorithm]

    return get


def assert_same_results(run_dir: Path, reference: Path) -> None:
    """Final models, every iteration's loss and the final test loss equal the reference's."""
    workers = BASE["workers"]
    for mine, theirs in zip(final_models(run_dir, workers), final_models(reference, workers),
                            strict=True):
        np.testing.assert_array_equal(mine, theirs)
    for rank, log in events(run_dir, workers).items():
        ref_log = events(reference, workers)[rank]
        assert [e["loss"] for e in log] == [e["loss"] for e in ref_log], f"rank {rank}"
    mine, ref = json.loads((run_dir / "summary.json").read_text()), json.loads(
        (reference / "summary.json").read_text())
    assert mine["final_test_loss"] == ref["final_test_loss"]
    assert mine["iterations"] == ref["iterations"] == BASE["iterations"] * workers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_node(run_dir: Path, node_rank: int, port: int, run_id: str) -> subprocess.Popen:
    """One "machine" of a two-node job: the command docs/multi-node.md gives, on loopback."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
           "--nproc-per-node", "2", "--node-rank", str(node_rank), "--rdzv-backend", "c10d",
           "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id, "--max-restarts", "0",
           "--monitor-interval", "0.5", "-m", "hetbench.harness.worker", "--run-dir", str(run_dir)]
    log = open(run_dir / f"node{node_rank}.log", "wb")  # noqa: SIM115 (closed by the child)
    with log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})


def run_two_torchrun_nodes(run_dir: Path, config: RunConfig) -> list[int]:
    prepare(config, run_dir)
    port = free_port()
    nodes = [torchrun_node(run_dir, k, port, config.run_id) for k in (0, 1)]
    try:
        return [node.wait(timeout=240) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.wait()


# Only allreduce: P-Reduce's subgroups meet across two torchrun nodes in
# test_rank_0_starts_the_services_when_torchrun_runs_without_bench, and match the local
# launcher's results under mpirun below.
@pytest.mark.parametrize("algorithm", ["allreduce"])
def test_two_torchrun_nodes_match_the_local_launcher(tmp_path, local_results, algorithm):
    config = config_for(algorithm, "torchrun")
    codes = run_two_torchrun_nodes(tmp_path, config)
    node_logs = [(tmp_path / f"node{k}.log").read_text()[-2000:] for k in (0, 1)]
    assert codes == [0, 0], node_logs
    summary = summarize_run_dir(tmp_path)
    assert summary["status"] == "ok", summary["cause"]
    assert summary["launcher"] == "torchrun"
    # The same layout as a local run, so `bench report` reads it.
    for name in ("config.json", "env.json", "eval.jsonl", "summary.json",
                 *(f"events.rank{r}.jsonl" for r in range(4)),
                 *(f"worker.rank{r}.log" for r in range(4))):
        assert (tmp_path / name).exists(), name
    assert_same_results(tmp_path, local_results(algorithm))


@needs_mpi
@pytest.mark.parametrize("algorithm", ["allreduce",
                                       pytest.param("prague-static", marks=pytest.mark.slow)])
def test_mpirun_with_four_ranks_matches_the_local_launcher(tmp_path, local_results, algorithm):
    skip_unless_today(algorithm, ["allreduce", "prague-static"])  # one a day, 8-9 s each
    summary = make_launcher("mpi").run(config_for(algorithm, "mpi"), tmp_path)
    assert summary["status"] == "ok", summary["cause"]
    assert summary["launcher"] == "mpi"
    assert_same_results(tmp_path, local_results(algorithm))


def test_slurm_job_through_submitits_local_executor_matches_the_local_launcher(
        tmp_path, local_results):
    skip_unless_today("executor", SUBMITIT_CASES)  # submitit's local executor: one a day
    # The same job a cluster would get (one task per rank, rank 0's store address through the
    # run directory), run by submitit's local executor on this machine.
    launcher = make_launcher("slurm", options={"cluster": "local"})
    summary = launcher.run(config_for("allreduce", "slurm"), tmp_path)
    assert summary["status"] == "ok", summary["cause"]
    assert summary["launcher"] == "slurm"
    assert list(tmp_path.glob("store.*.json")) and (tmp_path / "slurm").is_dir()
    assert_same_results(tmp_path, local_results("allreduce"))


@pytest.mark.slow
def test_a_killed_rank_fails_the_slurm_job_with_its_cause(tmp_path):
    skip_unless_today("killed-slurm", LAUNCHER_FAULTS, per_day=2)
    config = config_for("allreduce", "slurm", fault="kill@1:3", iterations=40)
    summary = make_launcher("slurm", options={"cluster": "local"}).run(config, tmp_path)
    assert summary["status"] == "failed"
    assert summary["cause"].startswith("rank 1 was killed by SIGKILL"), summary["cause"]
    assert summary["wall_s"] < 150


def test_a_matrix_runs_as_slurm_jobs_from_the_cli(tmp_path, bench):
    skip_unless_today("cli", SUBMITIT_CASES)
    matrix = tmp_path / "m.toml"
    matrix.write_text('algorithms = ["allreduce"]\nworkloads = ["mlp-digits"]\nworkers = [2]\n'
                      'iterations = 10\nlauncher = "slurm"\n[slurm]\ncluster = "local"\n'
                      "timeout_min = 5\n")
    result = bench("run", str(matrix), "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stdout + result.stderr
    (run,) = (tmp_path / "out").glob("allreduce-*/summary.json")
    assert json.loads(run.read_text())["status"] == "ok"
    # A world that fills the nodes unevenly fails under the local executor, with the reason
    # (a SLURM cluster runs it: tests/distributed/test_slurm_bed.py).
    matrix.write_text(matrix.read_text().replace("timeout_min = 5", "nodes = 2")
                      .replace("workers = [2]", "workers = [3]"))
    result = bench("run", str(matrix), "--out", str(tmp_path / "odd"))
    assert result.returncode == 1
    (odd,) = (tmp_path / "odd").glob("allreduce-*/summary.json")
    assert "3 ranks (workers + server ranks) fill 2 nodes of 2 unevenly" in json.loads(
        odd.read_text())["cause"]
    matrix.write_text(matrix.read_text().replace("nodes = 2", "queue = 1"))
    result = bench("run", str(matrix), "--out", str(tmp_path / "bad"))
    assert result.returncode == 2 and "[slurm]: unknown key(s) queue" in result.stderr


# One-machine torchrun (`bench run --launcher torchrun`) runs in the services, kill and hang
# tests below; result equality with the local launcher is the two-node test's job.
#: The slow launcher faults (8-13 s each, the same failure path under different launchers):
#: two a day, in turn; and one of the two services cases a day.
LAUNCHER_FAULTS = ["killed-slurm", "killed-torchrun", "killed-mpi", "hung-torchrun",
                   "killed-torchrun-node"]
SERVICES_CASES = ["bench-starts-them", "rank-0-starts-them"]
#: The two runs through submitit's local executor (10-12 s each), one a day (a real SLURM
#: cluster runs them in tests/distributed/test_slurm_bed.py).
SUBMITIT_CASES = ["executor", "cli"]


@pytest.mark.slow
def test_prague_smart_services_run_under_torchrun(tmp_path):
    """The Group Generator (a service) started by `bench run` beside the torchrun job."""
    skip_unless_today("bench-starts-them", SERVICES_CASES)
    config = RunConfig(algorithm="prague-smart", algorithm_options={"group_size": 2},
                       launcher="torchrun", **BASE)
    summary = make_launcher("torchrun").run(config, tmp_path)
    assert summary["status"] == "ok", summary["cause"]
    assert all(e["group_id"] is not None for log in events(tmp_path, 4).values() for e in log)


@pytest.mark.slow
def test_rank_0_starts_the_services_when_torchrun_runs_without_bench(tmp_path):
    """No `bench run` beside the job: global rank 0 starts the Group Generator and hands its
    address to the other ranks through the store (all on loopback here, so all reach it)."""
    skip_unless_today("rank-0-starts-them", SERVICES_CASES)
    config = RunConfig(algorithm="prague-smart", algorithm_options={"group_size": 2},
                       launcher="torchrun", **BASE)
    codes = run_two_torchrun_nodes(tmp_path, config)
    assert codes == [0, 0], [(tmp_path / f"node{k}.log").read_text()[-2000:] for k in (0, 1)]
    summary = summarize_run_dir(tmp_path)
    assert summary["status"] == "ok", summary["cause"]
    assert not (tmp_path / "services.json").exists()  # only the store carried the address
    assert (tmp_path / "gg.log").exists()


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["torchrun", pytest.param("mpi", marks=needs_mpi)])
def test_a_killed_rank_fails_the_run_with_its_cause(tmp_path, launcher):
    skip_unless_today(f"killed-{launcher}", LAUNCHER_FAULTS, per_day=2)
    config = config_for("allreduce", launcher, fault="kill@1:3", iterations=40)
    summary = make_launcher(launcher).run(config, tmp_path)
    assert summary["status"] == "failed"
    assert summary["cause"].startswith("rank 1 was killed by SIGKILL"), summary["cause"]
    assert summary["wall_s"] < 150


@pytest.mark.slow
def test_a_hung_rank_under_torchrun_is_named(tmp_path):
    skip_unless_today("hung-torchrun", LAUNCHER_FAULTS, per_day=2)
    config = config_for("allreduce", "torchrun", fault="hang@1:3", iterations=40,
                        comm_timeout_s=5.0)
    summary = make_launcher("torchrun").run(config, tmp_path)
    assert summary["status"] == "failed"
    assert summary["cause"].startswith("rank 1 hung"), summary["cause"]


@pytest.mark.slow
def test_a_killed_rank_on_a_torchrun_node_fails_the_summary(tmp_path):
    skip_unless_today("killed-torchrun-node", LAUNCHER_FAULTS, per_day=2)
    config = config_for("allreduce", "torchrun", fault="kill@2:3", iterations=40)
    codes = run_two_torchrun_nodes(tmp_path, config)
    assert any(code != 0 for code in codes)
    summary = summarize_run_dir(tmp_path)
    assert summary["status"] == "failed"
    assert "rank 2" in summary["cause"], summary["cause"]


RUN_ARGS = ["run", "--algorithms", "allreduce", "--workloads", "mlp-digits", "--workers", "2",
            "--iterations", "10"]


def test_unknown_launcher_is_one_error_line(tmp_path, bench):
    result = bench(*RUN_ARGS, "--launcher", "pbs", "--out", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.strip() == ("error: launcher must be one of local, torchrun, mpi, "
                                     "slurm, got 'pbs'")
    matrix = tmp_path / "m.toml"
    matrix.write_text('algorithms = ["allreduce"]\nworkloads = ["mlp-digits"]\nworkers = [2]\n'
                      'launcher = "horovodrun"\n')
    result = bench("run", str(matrix), "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: launcher must be one of local, torchrun, mpi, slurm, got 'horovodrun'"]


def test_mpi_launcher_without_mpi4py_is_one_error_line(tmp_path, bench, cli_env):
    # A package directory that shadows mpi4py and fails to import, as a missing one does.
    shadow = tmp_path / "shadow" / "mpi4py"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named mpi4py')\n")
    env = {**cli_env, "PYTHONPATH": str(shadow.parent)}
    result = bench(*RUN_ARGS, "--launcher", "mpi", "--out", str(tmp_path / "out"), env=env)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: launcher mpi needs mpi4py and Open MPI: pip install 'hetbench[mpi]'"]
    assert not list((tmp_path / "out").glob("*/config.json"))  # nothing started


def test_prepare_needs_an_external_launcher(tmp_path, bench):
    result = bench(*RUN_ARGS, "--prepare", "--out", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error: --prepare is for runs that torchrun or "
                                            "mpirun start")
