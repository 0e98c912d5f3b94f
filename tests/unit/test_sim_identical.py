"""The simulator's speed work moves no result: every algorithm, with and without slowdown, on
both network models, gives the same summaries and byte-identical event logs as before it.

tests/fixtures/sim-identical/golden.json holds the runs as simulated at commit 8489504, before
issue 20's speed work (digest.py there says how it was made, and why prague-random's entries
were rewritten once since). Event lines are written with --events full.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "sim-identical"
sys.path.insert(0, str(HERE))
from digest import digest  # noqa: E402

GOLDEN = json.loads((HERE / "golden.json").read_text())
#: Summary keys added since the golden runs: records of how a run was written or what it read,
#: the algorithms' own facts (summary_facts, as real summaries have them, with their names and
#: units under "facts"), the real-only fields a simulation names as absent, which model the
#: evaluation scores (evaluated_model) and the code the run was made by (code); not results the
#: golden runs had.
ADDED_SINCE = {"events", "data", "absent", "wait_rule", "outer_steps", "ps_weight_min",
               "ps_weight_max", "updates", "facts", "evaluated_model", "code"}
#: Keys of the summary's `sim` record added since: protocol counters a large run has no event
#: lines for (Hop's skipped iterations, issue 46).
SIM_ADDED_SINCE = {"iterations_skipped"}


@pytest.fixture(scope="module")
def simulated(tmp_path_factory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("sim-identical")
    for matrix in ("alpha-beta", "network"):
        subprocess.run([sys.executable, "-m", "hetbench", "sim", str(HERE / f"{matrix}.toml"),
                        "--events", "full", "--out", str(out / matrix)],
                       check=True, capture_output=True, text=True, timeout=300)
    return {**digest(out / "alpha-beta"), **digest(out / "network")}


def test_every_golden_run_is_simulated_again(simulated):
    assert sorted(simulated) == sorted(GOLDEN)


@pytest.mark.parametrize("run_id", sorted(GOLDEN))
def test_summary_and_events_are_unchanged(simulated, run_id):
    got, want = simulated[run_id], GOLDEN[run_id]
    got_sim = dict(got["summary"].get("sim") or {})
    assert set(got_sim) - set(want["summary"].get("sim") or {}) <= SIM_ADDED_SINCE
    for key in SIM_ADDED_SINCE - set(want["summary"].get("sim") or {}):
        got_sim.pop(key, None)
    got_summary = {**got["summary"], "sim": got_sim} if "sim" in got["summary"] else got["summary"]
    assert {key: got_summary.get(key) for key in want["summary"]} == want["summary"]
    assert set(got["summary"]) - set(want["summary"]) <= ADDED_SINCE
    assert got["events_sha256"] == want["events_sha256"]
