"""Worlds that cannot fit are refused before they start (issue 34), with and without --dry-run;
--allow-oversubscribe is the way past it."""

import pytest

from hetbench.core.config import RunConfig
from hetbench.harness.launch.capacity import RANKS_PER_CORE, available_mb, rank_mb

RESNET = """
name = "big"
algorithms = ["allreduce"]
workloads = ["resnet18"]
workers = [{workers}]
iterations = 20
[workload.resnet18]
synthetic = true
"""


def refusal(result) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    line = lines[0]
    assert "cannot run on this machine" in line and "bench sim" in line
    assert "compute = \"emulated\"" in line and "--launcher slurm" in line
    assert "--allow-oversubscribe" in line
    return line


@pytest.mark.slow
@pytest.mark.parametrize("dry_run", [True, False])
def test_more_ranks_than_the_cores_allow_are_refused(tmp_path, bench, dry_run):
    out = tmp_path / "out"
    result = bench("run", "--algorithms", "allreduce", "--workloads", "mlp-digits",
                   "--workers", 100_000, "--iterations", 10, "--out", out,
                   *(["--dry-run"] if dry_run else []), timeout=60)
    line = refusal(result)
    assert f"exceed {RANKS_PER_CORE} ranks per core" in line
    assert "100000 ranks of mlp-digits need about" in line  # and the memory, too
    assert result.stdout == "" and not out.exists()  # nothing listed, nothing written


@pytest.mark.slow
@pytest.mark.parametrize("dry_run", [True, False])
def test_ranks_that_would_exhaust_the_memory_are_refused(tmp_path, bench, dry_run):
    memory_mb = available_mb()
    if memory_mb is None:
        pytest.skip("this machine does not say how much memory is available")
    config = RunConfig.from_dict({"algorithm": "allreduce", "workload": "resnet18",
                                  "workers": 2, "iterations": 20,
                                  "workload_options": {"synthetic": True}})
    # Few enough ranks for the cores, too many for the memory.
    workers = int(memory_mb / rank_mb(config)) + 2
    matrix = tmp_path / "big.toml"
    matrix.write_text(RESNET.format(workers=workers))
    out = tmp_path / "out"
    result = bench("run", matrix, "--out", out, *(["--dry-run"] if dry_run else []),
                   timeout=60)
    line = refusal(result)
    assert f"{workers} ranks of resnet18 need about" in line and "ranks per core" not in line
    assert not out.exists()


def test_allow_oversubscribe_lists_the_run(tmp_path, bench):
    result = bench("run", "--algorithms", "allreduce", "--workloads", "mlp-digits",
                   "--workers", 100_000, "--iterations", 10, "--dry-run",
                   "--allow-oversubscribe", timeout=60)
    assert result.returncode == 0, result.stderr
    assert "w=100000" in result.stdout


def test_simulating_the_same_world_is_not_refused(tmp_path, bench):
    result = bench("sim", "--algorithms", "allreduce", "--workloads", "mlp-digits",
                   "--workers", 100_000, "--iterations", 10, "--pace-ms", 10, "--dry-run",
                   timeout=60)
    assert result.returncode == 0, result.stderr
