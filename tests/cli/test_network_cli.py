"""The network model from the command line: presets, dilation, and the warning when the
dilation is obviously too small for the host."""

import json
import subprocess

import pytest

from hetbench.network.model import dilation_warning


def bench(*args):
    return subprocess.run([".venv/bin/bench", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_too_small_a_dilation_is_warned_about_before_anything_runs(tmp_path):
    common = ["run", "--algorithms", "allreduce", "--workloads", "mlp-digits", "--workers", "16",
              "--pace-ms", "10", "--iterations", "20", "--network", "prague", "--dry-run",
              "--out", str(tmp_path)]
    warned = bench(*common, "--dilation", "1")
    assert warned.returncode == 0, warned.stderr
    assert "warning: dilation 1 is likely too small for 16 workers" in warned.stderr
    assert "allreduce mlp-digits w=16" in warned.stdout  # the dry run still lists the run
    quiet = bench(*common, "--dilation", "50")
    assert quiet.returncode == 0 and "warning" not in quiet.stderr


def test_the_warning_follows_the_hosts_budget():
    # 16 workers x 2.5 ms of CPU per round against 2 cores x k x 10 ms, at most half busy.
    assert dilation_warning(16, 2, 0.010, 1.0).endswith("try dilation >= 4")
    assert dilation_warning(16, 2, 0.010, 4.0) is None
    assert dilation_warning(16, 2, 0.0, 1.0) is None  # real compute, no floor: unknown


def test_bench_sim_takes_the_same_network_flags_and_plays_the_preset(tmp_path):
    common = ["sim", "--algorithms", "ps-sync", "--workloads", "mlp-digits", "--workers", "8",
              "--iterations", "20", "--compute-ms", "1"]
    plain = bench(*common, "--out", str(tmp_path / "plain"))
    # Hop's 10 Gbit/s Ethernet, one worker per machine: the server's NIC takes every push.
    hop = bench(*common, "--network", "hop", "--dilation", "8", "--out", str(tmp_path / "hop"))
    assert plain.returncode == 0 and hop.returncode == 0, plain.stderr + hop.stderr
    (run,) = (tmp_path / "hop").glob("ps-sync-*/summary.json")
    played = json.loads(run.read_text())["sim"]["network"]
    assert "dilation 8 (preset hop)" in played
    rate = {name: float(out.stdout.split("samples/s")[0].rsplit(": ", 1)[1])
            for name, out in (("plain", plain), ("hop", hop))}
    assert rate["hop"] < rate["plain"]
    refused = bench("sim", "--against", str(tmp_path), "--network", "hop")
    assert refused.returncode == 2 and "drop the matrix file, --network" in refused.stderr
