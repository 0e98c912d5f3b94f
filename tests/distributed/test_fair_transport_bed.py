"""Hop on kernel-shaped links against `bench sim` with `transport = "fair"` and `"fcfs"`
(issue 58): real ranks on a test bed of four one-rank hosts whose links are shaped to 100
Mbit/s as a cluster's queue (the bed's default queue, host-fair: a queue per peer out of each
host, one FIFO into it), and the same matrix simulated on the bed's measured link both ways.

Hop is the point-to-point protocol whose gap the model had most to answer for: each worker
sends its model to both neighbours at once, and the two messages share its link (first come
first served, the model had them one after the other and overestimated Hop by half). Every case
is real: namespaces, bench and its ranks as processes on them, gloo over the bed's shaped
bridge.

120 iterations measure Hop's steady state, not its start. Under the bed's first shaping (tbf)
Hop kept the fair model's pace for about 50 iterations and then fell to 0.88-0.91x of it, with
tbf busying the bed's cores; under htb's queues the shaped run stays near fair
(docs/results/2026-11-28-fair-transport-bed.md, "The bed's queue"). The issue asks for fair
within 10% of the shaped run. Until measure_link timed its bulk transfer where the bytes arrive
it read the link 3.5-4.4% slow, and the shaped run was 1.02-1.12x of fair across sittings; on the
link as it is (95.6 Mbit/s of payload), the same sittings' runs are 0.99-1.09x, and six runs
of this test on 2026-11-29 were 0.97-1.07x
(docs/results/2026-11-28-fair-transport-bed.md, "The link's rate, timed where it arrives").
The test also holds the comparison that decides between the models: fair nearer the shaped
run than first come first served (which overstates Hop by 30-40% on 4 and 5 hosts).
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
MATRIX = link_bound_matrix("fair-bed", ["hop"], HOSTS)  # 120 iterations: past Hop's start


def _throughput(out: Path) -> float:
    summaries = [json.loads(p.read_text()) for p in out.glob("*/summary.json")]
    assert len(summaries) == 1 and summaries[0]["status"] == "ok", summaries
    return summaries[0]["throughput"]


def _simulated(tmp_path: Path, link: dict, transport: str) -> float:
    matrix = tmp_path / f"{transport}.toml"
    matrix.write_text(MATRIX + network_table(link, transport=transport))
    done = subprocess.run([sys.executable, "-m", "hetbench", "sim", str(matrix),
                           "--out", str(tmp_path / transport)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return _throughput(tmp_path / transport)


def test_hops_shaped_run_is_nearer_its_fair_simulation_than_first_come(tmp_path):
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
    fair, fcfs = _simulated(tmp_path, link, "fair"), _simulated(tmp_path, link, "fcfs")
    figures = {"shaped": shaped, "fair": fair, "fcfs": fcfs, "link": link}
    assert 0.90 <= shaped / fair <= 1.10, figures
    assert abs(1 - shaped / fair) < abs(1 - shaped / fcfs), figures
