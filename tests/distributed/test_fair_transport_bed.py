"""Hop on kernel-shaped links against `bench sim` with `transport = "fair"` (issue 58): real
ranks on a test bed of four one-rank hosts whose links tbf shapes to 100 Mbit/s, and the same
matrix simulated on the bed's measured link, within 10% of each other.

Hop is the point-to-point protocol whose gap the model had most to answer for: each worker
sends its model to both neighbours at once, and the two messages share its link (first come
first served, the model had them one after the other, 0.70x of the shaped run). Every case is
real: namespaces, bench and its ranks as processes on them, gloo over the bed's shaped bridge.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hetbench import testbed
from hetbench.testbed.measure import (
    link_bound_matrix,
    measure_link,
    network_table,
    run_across,
)
from tests.helpers import NEEDS_TEST_BED

pytestmark = [
    pytest.mark.slow,
    NEEDS_TEST_BED,
]

ROOT = Path(__file__).resolve().parents[2]
HOSTS = 4
MATRIX = link_bound_matrix("fair-bed", ["hop"], HOSTS)


def _throughput(out: Path) -> float:
    summaries = [json.loads(p.read_text()) for p in out.glob("*/summary.json")]
    assert len(summaries) == 1 and summaries[0]["status"] == "ok", summaries
    return summaries[0]["throughput"]


def test_hops_shaped_run_is_within_10_percent_of_its_fair_simulation(tmp_path):
    name = "fairtb"
    testbed.down(name)
    bed = testbed.up(name, hosts=HOSTS, subnet="10.77.9")
    try:
        for host in bed.hosts:
            testbed.shape_link(bed, host, "100mbit")
        link = measure_link(bed)
        shaped_matrix = tmp_path / "shaped.toml"
        shaped_matrix.write_text(MATRIX)
        done = run_across(bed, HOSTS, shaped_matrix, tmp_path / "shaped", timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    finally:
        testbed.down(name)
    shaped = _throughput(tmp_path / "shaped")
    simulated_matrix = tmp_path / "simulated.toml"
    simulated_matrix.write_text(MATRIX + network_table(link, transport="fair"))
    done = subprocess.run([sys.executable, "-m", "hetbench", "sim", str(simulated_matrix),
                           "--out", str(tmp_path / "simulated")],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    simulated = _throughput(tmp_path / "simulated")
    # Measured on the 2-core development machine: shaped 1681, fair 1742 samples/s (0.965);
    # first come first served 2394 (0.70), which this bound rules out.
    assert 0.9 <= shaped / simulated <= 1.1, (shaped, simulated, link)
