"""replay:PATH on real gloo ranks: the injector the worker loop applies is the table's."""

from __future__ import annotations

import numpy as np
import pytest

from hetbench.slowdown.table import table_csv
from tests.helpers import events, run_config


def test_replaying_a_twice_slower_worker_halves_allreduce_on_real_ranks(tmp_path):
    # Three workers, so that each iteration's median is the fast workers' 1 s: worker 2's
    # factor is then exactly 2 (with two, the median would be their mean).
    table = tmp_path / "twice.csv"
    compute = np.ones((3, 7))
    compute[2] = 2.0
    table.write_text(table_csv(compute))
    fields = dict(algorithm="allreduce", workload="mlp-digits", workers=3, iterations=30,
                  warmup_iterations=5, seed=2,
                  workload_options={"compute": "emulated", "compute_ms": 40.0})
    base = run_config(tmp_path / "none", **fields)
    slow = run_config(tmp_path / "replay", slowdown=f"replay:{table}", **fields)
    assert base["status"] == "ok" and slow["status"] == "ok", (base["cause"], slow["cause"])
    assert base["throughput"] / slow["throughput"] == pytest.approx(2.0, rel=0.15)
    # The slowed worker slept its factor's share of every step's compute; the others none.
    logs = events(tmp_path / "replay", 3)
    slept = {r: np.mean([e["slowdown_s"] / e["compute_s"] for e in logs[r][5:]]) for r in logs}
    assert slept[2] == pytest.approx(1.0, abs=0.15)
    assert slept[0] < 0.1 and slept[1] < 0.1
