"""Hop on real processes: D-PSGD when its knobs are off, the iteration-gap bound, skipping."""

import bisect
import statistics

import numpy as np
import pytest
import torch

from hetbench.algorithms import topologies
from hetbench.core.config import RunConfig
from hetbench.core.tensors import flat_params
from hetbench.errors import UserError
from tests.distributed.test_dpsgd import drive, make_worker
from tests.helpers import (
    SLOW_VARIANT_CASES,
    events,
    final_models,
    on_ranks,
    run_config,
    skip_unless_today,
)

#: Hop options under which it must be D-PSGD exactly.
D_PSGD_KNOBS = {"backup_workers": 0, "staleness": 0, "skip": False}


def entries(events_of_worker: list[dict]) -> list[tuple[int, int]]:
    """(time in ns, iteration) each time a worker entered an iteration: the start of each logged
    iteration, and each skip, from the moment it was announced to the neighbours."""
    marks = [(e["t_start"], e["iteration"]) for e in events_of_worker]
    marks += [(e["skip_ns"], e["skip_to"]) for e in events_of_worker if "skip_to" in e]
    return sorted(marks)


def worst_gap(events_by_rank: dict[int, list[dict]], graph) -> int:
    """The largest k_i - k_j over neighbours i, j, at each moment i entered an iteration k_i
    (k_j: the iteration j had entered by then; every worker starts at 0)."""
    worst = 0
    for i, evs in events_by_rank.items():
        for j in graph[i]:
            marks = entries(events_by_rank[j])
            times = [t for t, _ in marks]
            reached = np.maximum.accumulate([k for _, k in marks]).tolist()
            for t, k in entries(evs):
                at = bisect.bisect_right(times, t) - 1
                worst = max(worst, k - (reached[at] if at >= 0 else 0))
    return worst


def test_the_gap_check_catches_a_worker_running_ahead():
    ahead = [{"t_start": 10 * k, "iteration": k} for k in range(10)]
    stuck = [{"t_start": 1000, "iteration": 0}]
    assert worst_gap({0: ahead, 1: stuck}, topologies.ring(2)) == 9
    # Stuck at 0 until it announces a jump to 8 at t = 75 (the other is then at 7): the gap
    # peaks at 7 just before the jump, not at 9.
    skipper = [{"t_start": 0, "iteration": 0, "skip_ns": 75, "skip_to": 8}]
    assert worst_gap({0: ahead, 1: skipper}, topologies.ring(2)) == 7


def test_hop_with_its_knobs_off_is_dpsgd_parameter_for_parameter(tmp_path):
    common = {"workload": "mlp-digits", "workers": 4, "iterations": 25, "seed": 3,
              "save_models": True, "warmup_iterations": 2}
    assert run_config(tmp_path / "dpsgd", algorithm="dpsgd", **common)["status"] == "ok"
    assert run_config(tmp_path / "hop", algorithm="hop", algorithm_options=D_PSGD_KNOBS,
                      **common)["status"] == "ok"
    hop, dpsgd = final_models(tmp_path / "hop", 4), final_models(tmp_path / "dpsgd", 4)
    assert not np.array_equal(dpsgd[0], dpsgd[1])  # the workers really differ
    for h, d in zip(hop, dpsgd, strict=True):
        np.testing.assert_array_equal(h, d)


def test_hop_is_dpsgd_on_another_graph_and_weights():
    options = {"topology": "exponential", "weights": "metropolis"}
    hop = on_ranks(drive, 5, "hop", {**options, **D_PSGD_KNOBS}, 8, 0.1)
    dpsgd = on_ranks(drive, 5, "dpsgd", options, 8, 0.1)
    for (_, h, _), (_, d, _) in zip(hop, dpsgd, strict=True):
        np.testing.assert_array_equal(h, d)


def _staged_hop(comm, steps: int):
    """Hop with its messages staged through host buffers, as ranks sharing a GPU send them
    (forced on CPU tensors): the pool's allocations after `steps` steps, and the final model."""
    comm.stages_through_host = True
    ctx, model, optimizer, algo = make_worker(comm, "hop", {}, 0.1)
    for _ in range(steps):
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        algo.step(ctx, model, optimizer)
    ctx.stopping = True
    algo.finish(ctx, model)
    return comm.staging.allocated, flat_params(model).numpy()


def test_hop_lets_each_sent_message_go_and_reuses_its_host_buffers():
    """gloo marks a send complete only once it is waited: Hop's sends are waited by a thread of
    its own, so their host buffers return to the pool instead of a new buffer being pinned for
    every send (issue 54: two per step, each ~80 ms to pin on a GPU)."""
    steps = 60
    results = on_ranks(_staged_hop, 4, steps)
    allocated = [a for a, _ in results]
    # Two neighbours on the ring, unpaced ranks up to the iteration gap apart: the sends and
    # receives in flight at once (7-16 here), not one buffer per send (126 before).
    assert max(allocated) <= steps // 2, allocated
    assert all(np.isfinite(m).all() for _, m in results)


def test_gap_stays_within_the_bound_and_updates_respect_backup_and_staleness(tmp_path):
    gap, backup, staleness = 2, 1, 1
    summary = run_config(
        tmp_path, algorithm="hop", workload="mlp-digits", workers=6, iterations=40,
        slowdown="prob:5@0.3", pace_ms=10, seed=5,
        algorithm_options={"backup_workers": backup, "staleness": staleness,
                           "max_iteration_gap": gap, "skip": True, "skip_threshold": 1})
    assert summary["status"] == "ok", summary["cause"]
    by_rank = events(tmp_path, 6)
    graph = topologies.ring(6)
    worst = worst_gap(by_rank, graph)
    assert 1 <= worst <= gap  # the gap was used, and never exceeded
    for rank, evs in by_rank.items():
        for e in evs:
            used = {int(j): k for j, k in e["used"].items()}
            assert set(used) <= set(graph[rank])
            if "skip_to" in e:
                continue  # a skip adopts the neighbours' newest models, whatever iteration
            assert len(used) >= len(graph[rank]) - backup
            assert all(e["iteration"] - staleness <= k <= e["iteration"] for k in used.values())


def test_a_deterministic_straggler_skips_and_the_others_keep_pace(tmp_path):
    pace_ms = 20
    summary = run_config(
        tmp_path, algorithm="hop", workload="mlp-digits", workers=4, iterations=60,
        slowdown="det:10@0", pace_ms=pace_ms, seed=2,
        algorithm_options={"backup_workers": 1, "skip": True, "max_iteration_gap": 12})
    assert summary["status"] == "ok", summary["cause"]
    by_rank = events(tmp_path, 4)
    straggler = by_rank[0]
    assert sum(e.get("skipped", 0) for e in straggler) > 30
    assert len(straggler) < 20  # it computed a fraction of the 60 iterations
    for rank in (1, 2, 3):
        # Others may skip a little too (at the very end, to catch up with a finished neighbour),
        # but they compute nearly every iteration themselves.
        assert len(by_rank[rank]) >= 54
        per_iteration_s = [e["t_end"] - e["t_start"] for e in by_rank[rank]]
        # Held back by a 10x straggler, an iteration would take ~10 paces.
        assert statistics.median(per_iteration_s) / 1e9 < 2 * pace_ms / 1000


@pytest.mark.parametrize(("options", "message"), [
    ({"backup_workers": 2}, "below the in-degree"),
    ({"staleness": -1}, "staleness must be >= 0"),
    ({"max_iteration_gap": 0}, "max_iteration_gap must be >= 1"),
    ({"skip": True, "skip_threshold": 4}, "skip_threshold"),
    ({}, "backup_workers = 0"),  # the default b = 1 on a 2-worker ring, whose degree is 1
    ({"topology": "star"}, "must be one of"),
])
def test_bad_options_fail_before_any_process_starts(options, message):
    with pytest.raises(UserError, match=message):
        RunConfig(algorithm="hop", workload="mlp-digits", workers=2 if not options else 4,
                  algorithm_options=options)


@pytest.mark.slow
def test_neighbours_finishing_far_apart_still_end_cleanly(tmp_path):
    # Without skipping and with a wide gap bound, worker 0 (10x slower) trails its neighbours by
    # up to 60 iterations of 200 ms: longer than the 5 s comm timeout, which must not fire.
    skip_unless_today("hop-neighbours-far-apart", SLOW_VARIANT_CASES, per_day=4)
    summary = run_config(
        tmp_path, algorithm="hop", workload="mlp-digits", workers=4, iterations=60,
        pace_ms=20, slowdown="det:10@0", comm_timeout_s=5.0,
        algorithm_options={"backup_workers": 1, "skip": False, "max_iteration_gap": 60})
    assert summary["status"] == "ok", summary["cause"]
    by_rank = events(tmp_path, 4)
    assert len(by_rank[0]) == 60  # no skipping: the straggler ran every iteration
    assert (by_rank[0][-1]["t_end"] - by_rank[2][-1]["t_end"]) / 1e9 > 5.0
