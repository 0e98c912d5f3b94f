"""Signals to `bench run`: SIGTERM and SIGHUP stop it as Ctrl-C does, and a launcher killed
outright (SIGKILL) leaves no rank or service running (issue 22; local launcher)."""

import json
import signal
import subprocess
import time

import pytest

from tests.distributed.test_faults import _training_run, alive, rank_pids

#: Every process of the run must be gone this soon after bench is stopped.
GONE_S = 10


def _start(tmp_path, bench_cmd, cli_env, algorithm):
    out = tmp_path / "out"
    matrix = tmp_path / "m.toml"
    matrix.write_text(f'algorithms = ["{algorithm}"]\nworkloads = ["mlp-digits"]\n'
                      "workers = [4]\niterations = 100000\npace_ms = 5\n")
    proc = subprocess.Popen([*bench_cmd, "run", str(matrix), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=cli_env)
    return proc, matrix, out, _training_run(out)


def _run_pids(run_dir) -> list[int]:
    """Every rank's pid (from its log) and every service's (services.json)."""
    pids = list(rank_pids(run_dir).values())
    services = json.loads((run_dir / "services.json").read_text())
    pids += [v for k, v in services.items() if k.endswith("_pid")]
    return pids


def _all_gone(pids, within_s: float) -> list[int]:
    deadline = time.time() + within_s
    while time.time() < deadline:
        survivors = [p for p in pids if alive(p)]
        if not survivors:
            return []
        time.sleep(0.2)
    return [p for p in pids if alive(p)]


@pytest.mark.parametrize(("sig", "algorithm"), [(signal.SIGTERM, "prague-smart"),
                                                (signal.SIGHUP, "hop")])
def test_a_terminating_signal_stops_bench_like_ctrl_c(tmp_path, bench_cmd, cli_env, sig,
                                                      algorithm):
    proc, _, _, run_dir = _start(tmp_path, bench_cmd, cli_env, algorithm)
    pids = _run_pids(run_dir)
    assert len(pids) == 4 + (algorithm == "prague-smart")
    proc.send_signal(sig)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, output
    assert f"interrupted by {sig.name}" in output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["cause"] == f"interrupted by {sig.name}"
    assert _all_gone(pids, GONE_S) == []


@pytest.mark.slow  # two runs of about 15 s each; CI runs it
@pytest.mark.parametrize("algorithm", ["prague-smart", "hop"])
def test_sigkill_to_bench_leaves_no_process_and_the_rerun_says_so(tmp_path, bench_cmd, cli_env,
                                                                   algorithm):
    proc, matrix, out, run_dir = _start(tmp_path, bench_cmd, cli_env, algorithm)
    pids = _run_pids(run_dir)
    proc.kill()
    proc.communicate(timeout=30)
    # Nothing trains on with half its peers: ranks and the Group Generator die with bench.
    assert _all_gone(pids, GONE_S) == [], f"alive {GONE_S} s after SIGKILL"
    assert not (run_dir / "summary.json").exists()
    # The next run of the same matrix says what became of the unfinished run and runs it again
    # (stopped here by SIGTERM once it has said so: the run itself would take minutes).
    rerun = subprocess.Popen([*bench_cmd, "run", str(matrix), "--out", str(out)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env={**cli_env, "COLUMNS": "1000"})
    said = next((line for line in rerun.stdout if "did not finish" in line), "")
    rerun.send_signal(signal.SIGTERM)
    rest, _ = rerun.communicate(timeout=60)
    assert "no summary.json: its launcher was killed" in said, said + rest
    assert rerun.returncode == 128 + signal.SIGTERM, rest
    assert len(list((out / ".attempts").iterdir())) == 1
