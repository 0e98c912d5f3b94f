"""No-deadlock stress: many short randomized runs of the asynchronous algorithms must all finish.

Each case draws a world size (2-8), a slowdown, a seed, a budget (iterations, or wall seconds so
workers stop at different iterations) and the algorithm's options from a seeded generator, so a
failing case is replayed by its id alone (`HETBENCH_STRESS_CASES=137`, or `-k "finishes[137]"`
with HETBENCH_TEST_DAY set to the failing run's day).

Each suite runs CASES of them, a different window of a pool of POOL each day
(tests.helpers.rotation_day), so successive CI runs cover the whole pool while each stays short.
"""

import os

import numpy as np
import pytest

from hetbench.algorithms import topologies
from hetbench.core.config import RunConfig
from hetbench.errors import UserError
from tests.helpers import events, rotation_day, run_config

#: Cases a day, from a window of the pool that moves daily (each 1-4 s).
CASES = 6
POOL = 400


def todays_cases() -> list[int]:
    """The indices this suite runs: HETBENCH_STRESS_CASES (comma-separated) when set, else
    today's window of the pool."""
    if chosen := os.environ.get("HETBENCH_STRESS_CASES"):
        return [int(index) for index in chosen.split(",")]
    start = (rotation_day() * CASES) % POOL
    return list(range(start, start + CASES))
#: Bound on one run's wall time, start-up of 8 ranks on a busy 2-core machine included.
TIME_BOUND_S = 90


def case(index: int) -> dict:
    """The RunConfig fields of stress case `index`."""
    rng = np.random.default_rng([2026, index])
    algorithm = "hop" if index % 2 else "adpsgd"
    workers = int(rng.integers(2, 9))
    slow = [int(w) for w in rng.choice(workers, size=min(2, workers), replace=False)]
    slowdown = str(rng.choice(["none", "prob:5", "prob:10@0.5", f"det:8@{slow[0]}",
                               f"det:4@{slow[0]},{slow[-1]}"]))
    budget = ({"iterations": int(rng.integers(8, 30))} if rng.random() < 0.6
              else {"iterations": None, "seconds": float(rng.uniform(1.0, 2.5))})
    topology = str(rng.choice(list(topologies.TOPOLOGIES)))
    if algorithm == "hop":
        degree = min(topologies.degrees(topologies.build(topology, workers)))
        gap = int(rng.integers(1, 5))
        options = {"topology": topology, "backup_workers": int(rng.integers(0, degree)),
                   "staleness": int(rng.integers(0, 3)), "max_iteration_gap": gap,
                   "skip": bool(rng.random() < 0.6), "skip_threshold": int(rng.integers(0, gap))}
    else:
        options = {"topology": topology}
    fields = {"algorithm": algorithm, "workload": str(rng.choice(["mlp-digits", "svm"])),
              "workers": workers, "slowdown": slowdown, "seed": int(rng.integers(1, 10_000)),
              "pace_ms": float(rng.choice([0.0, 5.0, 10.0])), "warmup_iterations": 2,
              "comm_timeout_s": 30.0, "algorithm_options": options, **budget}
    try:
        RunConfig(**fields)
    except UserError:
        # Some graphs have no connected active/passive split for AD-PSGD; the ring always has.
        fields["algorithm_options"] = {"topology": "ring"}
    return fields


@pytest.mark.slow
@pytest.mark.timeout(TIME_BOUND_S + 60)
@pytest.mark.parametrize("index", todays_cases())
def test_random_short_run_finishes(index, tmp_path):
    fields = case(index)
    summary = run_config(tmp_path, **fields)
    assert summary["status"] == "ok", f"{fields}: {summary['cause']}"
    assert summary["wall_s"] < TIME_BOUND_S, fields
    logged = events(tmp_path, fields["workers"])
    assert all(logged[r] for r in range(fields["workers"]))
    if fields.get("iterations"):
        # Every worker's counter reached the budget (Hop may jump to it by skipping).
        for evs in logged.values():
            last = evs[-1]
            assert last.get("skip_to", last["iteration"] + 1) >= fields["iterations"]
