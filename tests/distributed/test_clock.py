"""Each rank's clock against rank 0's (comm/clock.py): NTP-style exchanges whose estimate is
within its own error bound of the truth, and every run's done records hold one at its start
and its end (issue 43)."""

import json
import socket
import time

from hetbench.comm.clock import machine_id
from hetbench.core.record import clock_alignment, read_events
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
    host = socket.gethostname()
    assert json.loads((run_dir / "done.rank0.json").read_text())["clock"] == {
        "host": host, "aligned": False, "machine": machine_id()}
    for rank in (1, 2):
        clock = json.loads((run_dir / f"done.rank{rank}.json").read_text())["clock"]
        # One host, one clock: the true offset is 0, and none is applied.
        assert clock["host"] == host and clock["aligned"] is False
        for when in ("start", "end"):
            assert abs(clock[when]["offset_ns"]) <= clock[when]["error_ns"] + 1_000, clock
        assert clock["end"]["at_ns"] > clock["start"]["at_ns"]
    assert summary["clock_hosts"] == 1 and "clock_offset_ms" not in summary


def test_a_drift_found_at_the_end_is_removed_linearly_from_the_events(tmp_path):
    """A rank aligned at the start whose clock ran 2 ms ahead of rank 0's by the end: its
    stamps are pulled back by the share of those 2 ms elapsed at each, and a rank on rank 0's
    host is read as written."""
    start_ns, end_ns = 10**18, 10**18 + 10 * 10**9
    clock = {"host": "h2", "aligned": True,
             "start": {"offset_ns": -50_000_000, "error_ns": 80_000,
                       "at_ns": start_ns + 50_000_000},  # its own clock, 50 ms ahead
             "end": {"offset_ns": -2_000_000, "error_ns": 90_000, "at_ns": end_ns}}
    (tmp_path / "done.rank1.json").write_text(json.dumps({"rank": 1, "clock": clock}))
    (tmp_path / "done.rank0.json").write_text(json.dumps(
        {"rank": 0, "clock": {"host": "h1", "aligned": False}}))
    middle = start_ns + 5 * 10**9
    for rank in (0, 1):
        line = {"iteration": 0, "t_start": start_ns, "t_end": middle, "skip_ns": end_ns}
        (tmp_path / f"events.rank{rank}.jsonl").write_text(json.dumps(line) + "\n")
    (event,), _ = read_events(tmp_path, 1)
    assert (event["t_start"], event["t_end"], event["skip_ns"]) == (
        start_ns, middle - 1_000_000, end_ns - 2_000_000)
    (untouched,), _ = read_events(tmp_path, 0)
    assert untouched["t_end"] == middle
    assert clock_alignment([{"clock": {"host": "h1", "aligned": False}}, {"clock": clock}]) == {
        "clock_hosts": 2, "clock_offset_ms": 50.0, "clock_error_ms": 0.09,
        "clock_drift_ms": 2.0}
