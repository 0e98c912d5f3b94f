"""Each rank's clock against rank 0's (comm/clock.py): NTP-style exchanges whose estimate is
within its own error bound of the truth, and every run's done records hold one at its start
and its end (issue 43)."""

import json
import time

from tests.helpers import on_ranks, run_config

SHIFT_NS = 50_000_000


def _estimate(comm):
    from hetbench.comm.clock import estimate_offsets

    # Rank 2 reads a clock 50 ms ahead (as libfaketime would make it); ranks 0 and 1 the host's.
    clock = (lambda: time.time_ns() + SHIFT_NS) if comm.rank == 2 else time.time_ns
    estimate = estimate_offsets(comm, [0, 1, 2], clock=clock)
    return None if estimate is None else estimate.to_dict()


def test_the_offset_is_found_within_its_error_bound():
    results = on_ranks(_estimate, 3)
    assert results[0] is None  # rank 0 is the reference
    for rank, truth in ((1, 0), (2, -SHIFT_NS)):  # rank 0's clock minus this rank's
        estimate = results[rank]
        assert abs(estimate["offset_ns"] - truth) <= estimate["error_ns"] + 1_000, estimate
        assert estimate["error_ns"] < 20_000_000, estimate  # a round trip on one host


def test_a_runs_done_records_hold_each_ranks_clock_at_start_and_end(tmp_path):
    summary = run_config(tmp_path, algorithm="allreduce", workload="mlp-digits", workers=3,
                         iterations=5, warmup_iterations=1)
    assert summary["status"] == "ok", summary["cause"]
    run_dir = tmp_path
    assert json.loads((run_dir / "done.rank0.json").read_text())["clock"] is None
    for rank in (1, 2):
        clock = json.loads((run_dir / f"done.rank{rank}.json").read_text())["clock"]
        for when in ("start", "end"):
            # One host, one clock: the true offset is 0.
            assert abs(clock[when]["offset_ns"]) <= clock[when]["error_ns"] + 1_000, clock
        assert clock["end"]["at_ns"] > clock["start"]["at_ns"]
