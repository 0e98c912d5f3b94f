"""The simulator (hetbench.sim): cost formulas, protocol behaviour, and the result schema."""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from hetbench.algorithms import topologies
from hetbench.algorithms.prague.schedule import static_group
from hetbench.core.config import RunConfig
from hetbench.core.record import summarize
from hetbench.core.store import read_jsonl
from hetbench.errors import UserError
from hetbench.sim.engine import Engine
from hetbench.sim.fit import fit_alpha, fit_compute, fit_gg_request, fit_group_setup, fit_latency
from hetbench.sim.model import (
    ComputeModel,
    NetworkModel,
    SimModels,
    layout,
)
from hetbench.sim.run import simulate
from hetbench.slowdown import parse_slowdown
from tests.helpers import SLOW_VARIANT_CASES, skip_unless_today

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "results"
NET = NetworkModel(alpha_s=1e-3, beta_bytes_per_s=1e8)
MODELS = SimModels(NET, ComputeModel())


def config(algorithm="allreduce", workers=4, slowdown="none", iterations=60, **kw):
    return RunConfig(algorithm=algorithm, workload="mlp-digits", workers=workers,
                     slowdown=slowdown, iterations=iterations, pace_ms=20, **kw)


def events(run_dir: Path, workers: int) -> dict[int, list[dict]]:
    return {r: read_jsonl(run_dir / f"events.rank{r}.jsonl")[0] for r in range(workers)}


def test_events_run_in_time_order_and_ties_in_the_order_they_were_scheduled():
    # The queue keeps each distinct time once; what one heap of (t, seq) gave must hold:
    # earlier times first, equal times in scheduling order, including callbacks scheduled at
    # the current time while it runs (they come after those already there).
    engine = Engine(config(workers=2), MODELS)
    seen = []

    def note(label, then=None):
        seen.append((engine.now, label))
        if then is not None:
            engine.at(*then)

    engine.at(2.0, note, "b1")
    engine.at(1.0, note, "a1", (1.0, note, "a3"))
    engine.at(2.0, note, "b2", (3.0, note, "c1"))
    engine.at(1.0, note, "a2", (2.0, note, "b3"))
    engine.at(0.5, note, "z")
    engine.finished = [True, True]  # no worker loop here: only the callbacks above
    engine._drain_heap()
    assert seen == [(0.5, "z"), (1.0, "a1"), (1.0, "a2"), (1.0, "a3"), (2.0, "b1"),
                    (2.0, "b2"), (2.0, "b3"), (3.0, "c1")]
    assert not engine._times and not engine._at


def test_ring_allreduce_and_p_reduce_formulas():
    net = NetworkModel(alpha_s=2e-6, beta_bytes_per_s=1e9)
    assert net.message(1000) == pytest.approx(2e-6 + 1e-6)
    assert net.ring_allreduce(8e6, 8) == pytest.approx(2 * 7 / 8 * 8e-3 + 14 * 2e-6)
    assert net.p_reduce(8e6, 4) == net.ring_allreduce(8e6, 4)
    assert net.p_reduce(8e6, 1) == 0.0


def test_allreduce_without_slowdown_is_exactly_workers_batch_over_compute_plus_allreduce(
        tmp_path):
    c = config(workers=4)
    result = simulate(c, MODELS, tmp_path)
    cost = sum(NET.ring_allreduce(b, 4) for b in layout(c).bucket_bytes)
    assert result.summary["status"] == "ok"
    assert result.summary["throughput"] == pytest.approx(4 * 32 / (0.020 + cost), rel=1e-9)
    assert result.summary["iterations_per_worker"] == [60] * 4


def test_deterministic_straggler_sets_allreduce_pace_but_not_hops(tmp_path):
    k, c_s = 5, 0.020
    allreduce = simulate(config(slowdown=f"det:{k}@1", workers=8), MODELS, tmp_path).summary
    cost = sum(NET.ring_allreduce(b, 8) for b in layout(config()).bucket_bytes)
    assert allreduce["throughput"] == pytest.approx(8 * 32 / (k * c_s + cost), rel=1e-9)

    hop_cfg = config("hop", slowdown=f"det:{k}@1", workers=8,
                     algorithm_options={"backup_workers": 1})
    hop = simulate(hop_cfg, MODELS, tmp_path)
    # Hop's fast workers are not held to the straggler's pace: well over twice allreduce's rate.
    assert hop.summary["throughput"] > 2 * allreduce["throughput"]
    straggler = events(hop.run_dir, 8)[1]
    assert sum(e.get("skipped", 0) for e in straggler) > 0, "the straggler never skipped"


def test_hop_iteration_gap_is_bounded_by_the_token_queues(tmp_path):
    gap = 2
    c = config("hop", slowdown="det:5@0", workers=6,
               algorithm_options={"max_iteration_gap": gap, "skip": False})
    logs = events(simulate(c, MODELS, tmp_path).run_dir, 6)
    graph = topologies.ring(6)
    for i in range(6):
        for e in logs[i]:
            # When i started iteration k (t_start), every neighbour had entered >= k - gap - 1
            # (the token rule is checked for the iteration after the step).
            for j in graph[i]:
                entered = max((x["iteration"] for x in logs[j] if x["t_end"] <= e["t_start"]),
                              default=-1) + 1
                assert e["iteration"] - entered <= gap, (i, j, e["iteration"], entered)


def test_hop_without_slowdown_waits_one_message_per_iteration(tmp_path):
    c = config("hop", workers=4, algorithm_options={"backup_workers": 0})
    summary = simulate(c, MODELS, tmp_path).summary
    msg = NET.message(layout(c).model_bytes + 4 * 4)
    assert summary["throughput"] == pytest.approx(4 * 32 / (0.020 + msg), rel=1e-6)


def test_prague_smart_groups_never_conflict(tmp_path):
    c = config("prague-smart", slowdown="prob:5", workers=16, iterations=80)
    result = simulate(c, MODELS, tmp_path)
    assert result.summary["status"] == "ok"
    logs = events(result.run_dir, 16)
    members_seen = defaultdict(dict)  # group id -> {worker: event}
    for w, evs in logs.items():
        ids = [e["group_id"] for e in evs]
        assert ids == sorted(ids) and len(set(ids)) == len(ids), "groups out of global order"
        for e in evs:
            assert w in e["group"]
            members_seen[e["group_id"]][w] = e
    assert len(members_seen) > 100
    for group_id, seen in members_seen.items():
        group = next(iter(seen.values()))["group"]
        assert all(e["group"] == group for e in seen.values())
        # Every member logged in training met at the same instant (the P-Reduce's end); the
        # rest ran it in finish(), which logs nothing.
        assert len({e["t_end"] for e in seen.values()}) == 1, group_id


def test_prague_smart_leaves_a_deterministic_straggler_behind_less_than_allreduce(tmp_path):
    smart = simulate(config("prague-smart", slowdown="det:5@0", workers=16), MODELS, tmp_path)
    allreduce = simulate(config(slowdown="det:5@0", workers=16), MODELS, tmp_path)
    assert smart.summary["throughput"] > allreduce.summary["throughput"]


def test_prague_static_groups_come_from_the_schedule(tmp_path):
    c = config("prague-static", workers=8, algorithm_options={"workers_per_node": 4})
    logs = events(simulate(c, MODELS, tmp_path).run_dir, 8)
    for w, evs in logs.items():
        for e in evs:
            assert tuple(e["group"]) == static_group(w, e["schedule_step"], 8, 4)


def test_adpsgd_peers_are_the_real_workers_draws(tmp_path):
    # 600 iterations: over two of the simulator's batches of draws (DRAWS_AT_ONCE).
    c = config("adpsgd", workers=6, iterations=600)
    logs = events(simulate(c, MODELS, tmp_path).run_dir, 6)
    graph = topologies.bipartite(topologies.ring(6))
    for w in (0, 2, 4):
        rng = np.random.default_rng([c.seed, w, 17])
        expected = [int(graph[w][rng.integers(len(graph[w]))]) for _ in logs[w]]
        assert [e["peer"] for e in logs[w]] == expected
    assert sum(e["served"] for w in (1, 3, 5) for e in logs[w]) > 0


@pytest.mark.parametrize("choices", [1, 2, 3, 5, 7, 1000, 2**33])
def test_an_array_of_bounded_draws_is_the_single_draws_in_turn(choices):
    # What ADPSGDSim's batched peer draws rely on (numpy's bounded integers: one 32- or
    # 64-bit stream whether drawn one at a time or as an array).
    single = np.random.default_rng([5, 2, 17])
    batched = np.random.default_rng([5, 2, 17])
    one_by_one = [int(single.integers(choices)) for _ in range(700)]
    assert batched.integers(choices, size=300).tolist() + \
        batched.integers(choices, size=400).tolist() == one_by_one


@pytest.mark.parametrize("algorithm", ["ps-sync", "ps-async", "dpsgd", "prague-random"])
def test_every_protocol_finishes_its_budget_under_slowdown(tmp_path, algorithm):
    result = simulate(config(algorithm, slowdown="prob:5", workers=6), MODELS, tmp_path)
    assert result.summary["status"] == "ok", result.summary["cause"]
    assert result.summary["iterations_per_worker"] == [60] * 6


def test_ps_sync_serialises_at_the_server(tmp_path):
    few = simulate(config("ps-sync", workers=2), MODELS, tmp_path).summary
    many = simulate(config("ps-sync", workers=8), MODELS, tmp_path).summary
    # Per-worker rate falls with more workers: the server's link carries every message.
    assert many["throughput"] / 8 < few["throughput"] / 2


def test_wall_clock_budget_stops_synchronous_workers_together(tmp_path):
    c = RunConfig(algorithm="allreduce", workload="mlp-digits", workers=4, iterations=None,
                  seconds=1.0, pace_ms=20)
    summary = simulate(c, MODELS, tmp_path).summary
    counts = summary["iterations_per_worker"]
    assert len(set(counts)) == 1 and 10 < counts[0] < 50


def test_summary_equals_the_harness_summary_of_the_files_written(tmp_path):
    c = config("hop", slowdown="prob:5", workers=4)
    result = simulate(c, MODELS, tmp_path)
    from_files = summarize(c, result.run_dir)
    for key, value in from_files.items():
        if isinstance(value, float):
            assert result.summary[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
        else:
            assert result.summary[key] == value, key
    assert result.summary["simulated"] is True
    assert json.loads((result.run_dir / "env.json").read_text())["simulated"] is True


@pytest.mark.parametrize("algorithm", ["hop", "allreduce-backup", "prague-random", "prague-smart",
                                       "adpsgd", "ps-async", "osgp", "allreduce", "dpsgd"])
def test_per_worker_records_give_the_summary_of_the_event_lines(tmp_path, algorithm):
    c = config(algorithm, slowdown="prob:5", workers=6, iterations=40)
    full = simulate(c, MODELS, tmp_path / "full", events="full")
    lean = simulate(c, MODELS, tmp_path / "lean", events="workers")
    assert not list(lean.run_dir.glob("events.rank*.jsonl"))
    assert full.summary["events"] == "full" and lean.summary["events"] == "workers"
    drop = {"events", "sim_s", "started_at", "finished_at"}
    assert ({k: v for k, v in lean.summary.items() if k not in drop}
            == {k: v for k, v in full.summary.items() if k not in drop})
    records = json.loads((lean.run_dir / "workers.json").read_text())["workers"]
    logs = events(full.run_dir, 6)
    for record in records:
        mine = logs[record["rank"]]
        assert record["iterations"] == len(mine)
        assert record["last_iteration"] == mine[-1]["iteration"]
        assert record["t_start"] == mine[0]["t_start"]
        assert record["t_end"] == max(e["t_end"] for e in mine)
        assert record["samples"] == sum(e["samples"] for e in mine)
        for key in ("compute_s", "slowdown_s", "comm_s", "wait_s"):
            assert record[key] == pytest.approx(math.fsum(e[key] for e in mine), abs=1e-12)


def test_event_lines_have_the_real_schema(tmp_path):
    result = simulate(config("prague-smart"), MODELS, tmp_path)
    real = read_jsonl(FIXTURES / "allreduce-mlp-digits-w2-none-s1-762ae15f3d"
                      / "events.rank0.jsonl")[0][0]
    sim = read_jsonl(result.run_dir / "events.rank0.jsonl")[0][0]
    assert set(real) <= set(sim)
    assert math.isnan(sim["loss"]) and sim["run_id"] == result.config.run_id
    assert {"group", "gg_s", "group_id"} <= set(sim)


def test_load_runs_reads_simulated_runs(tmp_path):
    from hetbench.reports.load import load_runs

    for algorithm in ("allreduce", "hop"):
        simulate(config(algorithm), MODELS, tmp_path)
    runs = load_runs(tmp_path)
    assert sorted(runs["algorithm"]) == ["allreduce", "hop"]
    assert (runs["status"] == "ok").all() and runs["simulated"].all()
    assert (runs["throughput"] > 0).all()


def test_a_real_run_directory_is_never_overwritten(tmp_path):
    c = config()
    (tmp_path / c.run_id).mkdir()
    (tmp_path / c.run_id / "summary.json").write_text('{"status": "ok"}')
    with pytest.raises(UserError, match="real"):
        simulate(c, MODELS, tmp_path)
    simulate(config(iterations=50), MODELS, tmp_path)
    again = simulate(config(iterations=50), MODELS, tmp_path)  # a simulated one is replaced
    assert again.summary["iterations"] == 200


def test_compute_model_sources():
    assert ComputeModel(constant_s=0.05).seconds(config()) == 0.05
    assert ComputeModel(constant_s=0.001).seconds(config()) == 0.020  # the pacing floor
    assert ComputeModel().seconds(config()) == 0.020
    emulated = RunConfig(algorithm="allreduce", workload="mlp-digits", workers=2,
                         workload_options={"compute": "emulated", "compute_ms": 7.0})
    assert ComputeModel().seconds(emulated) == pytest.approx(0.007)
    unpaced = RunConfig(algorithm="allreduce", workload="mlp-digits", workers=2)
    with pytest.raises(UserError, match="compute"):
        ComputeModel().seconds(unpaced)


def test_fit_compute_from_real_runs_keeps_only_unslowed_iterations():
    model = fit_compute(FIXTURES)
    paced = RunConfig(algorithm="allreduce", workload="mlp-digits", workers=2, pace_ms=10)
    fitted = model.seconds(paced)
    slowed = unslowed = 0
    for run in ("allreduce-mlp-digits-w2-prob_3-s1-0faad71447",
                "ps-async-mlp-digits-w2-prob_3-s1-0560b9e963"):
        cfg = json.loads((FIXTURES / run / "config.json").read_text())
        injector = parse_slowdown(cfg["slowdown"], cfg["seed"])
        injector.validate(2)
        for e in read_jsonl(FIXTURES / run / "events.rank0.jsonl")[0][5:]:
            if injector.factor(0, e["iteration"], 0.0) > 1:
                slowed += 1
                assert e["compute_s"] + e["slowdown_s"] > 2 * fitted  # 3x: left out of the fit
            else:
                unslowed += 1
    assert slowed and unslowed
    # The pacing floor is 10 ms; the fit adds what pacing overshoots by, never a slowdown.
    assert 0.010 <= fitted < 0.013
    with pytest.raises(UserError, match="pace_ms 20"):
        model.seconds(config())


def test_p_reduce_builds_a_communicator_only_on_a_cache_miss(tmp_path):
    setup = SimModels(NetworkModel(alpha_s=1e-3, beta_bytes_per_s=1e8, group_setup_s=0.05),
                      ComputeModel())
    one_set = config("prague-smart", workers=4, algorithm_options={"group_size": 4})
    summary = simulate(one_set, setup, tmp_path).summary
    # Four workers in groups of four: one member set, built once, then found in every cache.
    assert summary["sim"]["preduce_cache_misses"] == 1
    assert summary["sim"]["preduce_cache_hits"] > 50
    tiny_cache = config("prague-smart", workers=8,
                        algorithm_options={"group_size": 2, "cache_size": 1})
    slow = simulate(tiny_cache, setup, tmp_path).summary
    free = simulate(tiny_cache, MODELS, tmp_path).summary
    assert slow["sim"]["preduce_cache_misses"] > 50
    assert slow["throughput"] < free["throughput"]


@pytest.mark.parametrize("algorithm", ["prague-static", "prague-smart", "hop", "adpsgd"])
def test_asynchronous_protocols_drain_after_a_wall_clock_budget(tmp_path, algorithm):
    # Workers stop at different iterations: prague-static must agree on a last step, smart
    # must drain buffered groups and hop must see DONE, or the simulation stalls.
    c = RunConfig(algorithm=algorithm, workload="mlp-digits", workers=8, slowdown="det:5@1",
                  iterations=None, seconds=1.0, pace_ms=20)
    summary = simulate(c, MODELS, tmp_path).summary
    assert summary["status"] == "ok", summary["cause"]
    assert summary["train_wall_s"] < 1.3
    counts = summary["iterations_per_worker"]
    if algorithm in ("hop", "adpsgd"):  # fast workers are not held to the straggler's pace
        assert min(counts) < max(counts)


def test_fit_alpha_inverts_the_ring_formula_on_real_allreduce_runs():
    run = FIXTURES / "allreduce-mlp-digits-w2-none-s1-762ae15f3d"
    beta = 1.25e9
    alpha = fit_alpha(FIXTURES, beta)  # the only allreduce run without slowdown there
    cfg = RunConfig.from_dict(json.loads((run / "config.json").read_text()))
    # Per iteration, the collective of the worker whose gradient was ready last (it waited for
    # nobody); the median over iterations.
    last = {}
    for r in range(2):
        for e in read_jsonl(run / f"events.rank{r}.jsonl")[0][cfg.warmup_iterations:]:
            ready = e["t_start"] / 1e9 + e["compute_s"] + e["slowdown_s"]
            if ready > last.get(e["iteration"], (-1.0, 0.0))[0]:
                last[e["iteration"]] = (ready, e["comm_s"])
    collective = statistics.median(c for _, c in last.values())
    everyone = statistics.median(
        e["comm_s"] for r in range(2)
        for e in read_jsonl(run / f"events.rank{r}.jsonl")[0][cfg.warmup_iterations:])
    assert collective < everyone  # the median over all workers counts waiting for the last
    buckets = layout(cfg).bucket_bytes
    net = NetworkModel(alpha_s=alpha, beta_bytes_per_s=beta)
    assert sum(net.ring_allreduce(b, 2) for b in buckets) == pytest.approx(collective)


def test_fitted_compute_jitter_makes_synchronous_workers_wait(tmp_path):
    fitted = SimModels(NET, ComputeModel(fitted={("mlp-digits", 20.0): (0.020, 0.021, 0.030)},
                                         fitted_from="test"))
    summary = simulate(config(workers=8), fitted, tmp_path).summary
    constant = simulate(config(workers=8), MODELS, tmp_path).summary
    # Each step waits for the slowest of 8 draws, so it is slower than the median (21 ms) alone.
    assert summary["wait_s"] > 0 and constant["wait_s"] == 0
    cost = sum(NET.ring_allreduce(b, 8) for b in layout(config()).bucket_bytes)
    assert summary["throughput"] < 8 * 32 / (0.021 + cost)


def test_cpu_sharing_stretches_only_the_cpu_part_of_a_hop():
    net = NetworkModel(alpha_s=1e-3, beta_bytes_per_s=1e9, cpu_s=5e-4, cores=2)
    assert net.share(1) == net.share(2) == 1.0
    assert net.share(8) == 4.0
    assert net.hop(2) == pytest.approx(1e-3 + 5e-4)
    assert net.hop(8) == pytest.approx(1e-3 + 4 * 5e-4)
    assert net.message(1000, 6) == pytest.approx(1e-3 + 3 * 5e-4 + 1e-6)
    # An all-reduce of n keeps all n processes busy: 2(n-1) hops at share n / cores.
    assert net.ring_allreduce(8e6, 8) == pytest.approx(2 * 7 / 8 * 8e-3 + 14 * (1e-3 + 2e-3))
    assert net.ring_allreduce(8e6, 4, active=16) == pytest.approx(
        2 * 3 / 4 * 8e-3 + 6 * (1e-3 + 8 * 5e-4))
    own = NetworkModel(alpha_s=1e-3, beta_bytes_per_s=1e9, cpu_s=5e-4)  # a core each
    assert own.hop(64) == pytest.approx(1.5e-3)
    with pytest.raises(UserError, match="cores"):
        NetworkModel(cores=0)
    with pytest.raises(UserError, match="CPU"):
        NetworkModel(cpu_s=-1.0)


def test_allreduce_on_shared_cores_pays_the_shared_cpu_per_hop(tmp_path):
    shared = SimModels(NetworkModel(alpha_s=1e-3, beta_bytes_per_s=1e8, cpu_s=5e-4, cores=2),
                       ComputeModel())
    c = config(workers=8)
    summary = simulate(c, shared, tmp_path).summary
    per_hop = 1e-3 + 5e-4 * 8 / 2  # all 8 workers are in the collective on 2 cores
    cost = sum(2 * 7 / 8 * b / 1e8 + 14 * per_hop for b in layout(c).bucket_bytes)
    assert summary["throughput"] == pytest.approx(8 * 32 / (0.020 + cost), rel=1e-9)
    assert summary["sim"]["cores"] == 2 and summary["sim"]["cpu_per_message_us"] == 500


def test_ps_sync_server_handles_one_message_at_a_time(tmp_path):
    net = NetworkModel(alpha_s=1e-3, beta_bytes_per_s=1e8, cpu_s=5e-4, cores=2)
    c = config("ps-sync", workers=4)
    summary = simulate(c, SimModels(net, ComputeModel()), tmp_path).summary
    # Each message flies one hop: alpha + its sender's CPU time, shared by the 5 processes (4
    # workers and the server) on 2 cores. The server spends cpu_s on every receive, then on
    # every send, one after another; its replies leave cpu_s + pull apart, so gradients arrive
    # that far apart and each is received before the next lands. Worker 0's round: compute,
    # a hop, its gradient's bytes, the n receives of the others after it... in all:
    # compute + 2 hops + push + n pulls + (n + 1) server CPU times.
    hop = 1e-3 + 5e-4 * 5 / 2
    model = layout(c).model_bytes
    push, pull = (model + 4) / 1e8, model / 1e8
    period = 0.020 + 2 * hop + push + 4 * pull + 5 * 5e-4
    assert summary["throughput"] == pytest.approx(4 * 32 / period, rel=1e-9)
    own = simulate(c, SimModels(replace(net, cores=None), ComputeModel()), tmp_path).summary
    assert own["throughput"] == pytest.approx(4 * 32 / (period - 2 * 5e-4 * 1.5), rel=1e-9)
    # The server's CPU is paid per worker: 16 workers' rounds take 12 more server CPU times.
    many = simulate(config("ps-sync", workers=16), SimModels(replace(net, cores=None),
                                                             ComputeModel()), tmp_path).summary
    period16 = 0.020 + 2 * 1.5e-3 + push + 16 * pull + 17 * 5e-4
    assert many["throughput"] == pytest.approx(16 * 32 / period16, rel=1e-9)


def test_group_generator_serves_requests_one_at_a_time(tmp_path):
    alpha, service = 1e-3, 4e-3
    net = NetworkModel(alpha_s=alpha, beta_bytes_per_s=1e8, gg_request_s=service)
    c = config("prague-smart", workers=8, iterations=20)
    run = simulate(c, SimModels(net, ComputeModel()), tmp_path)
    first = sorted(e[0]["gg_s"] for e in events(run.run_dir, 8).values())
    # All 8 ask at the same instant: the k-th one served waits for k - 1 before it.
    assert first == pytest.approx([2 * alpha + k * service for k in range(1, 9)])
    instant = simulate(c, SimModels(replace(net, gg_request_s=0.0), ComputeModel()),
                       tmp_path / "instant")
    assert [e[0]["gg_s"] for e in events(instant.run_dir, 8).values()] == pytest.approx(
        [2 * alpha] * 8)
    assert run.summary["throughput"] < instant.summary["throughput"]
    assert run.summary["sim"]["gg_request_us"] == pytest.approx(4000)
    with pytest.raises(UserError, match="Group Generator"):
        NetworkModel(gg_request_s=-1.0)


def _as_real_runs(runs: list[Path], cores: int) -> None:
    """Make simulated run directories look measured (for the fitting functions)."""
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        summary["simulated"] = False
        (run / "summary.json").write_text(json.dumps(summary))
        (run / "env.json").write_text(json.dumps({"cpu_count": cores}))


def test_fit_latency_recovers_alpha_and_cpu_from_allreduce_at_two_sizes(tmp_path):
    truth = SimModels(NetworkModel(alpha_s=8e-4, beta_bytes_per_s=1.25e9, cpu_s=3e-4, cores=2),
                      ComputeModel())
    runs = [simulate(config(workers=n), truth, tmp_path / "real").run_dir for n in (4, 8)]
    _as_real_runs(runs, cores=2)
    fit = fit_latency(tmp_path / "real", 1.25e9)
    assert fit.runs == 2 and fit.cores == 2
    assert fit.alpha_s == pytest.approx(8e-4, rel=1e-6)
    assert fit.cpu_s == pytest.approx(3e-4, rel=1e-6)
    # One worker count cannot separate the two: all of it is alpha.
    one = tmp_path / "one"
    _as_real_runs([simulate(config(workers=4), truth, one).run_dir], cores=2)
    single = fit_latency(one, 1.25e9)
    assert single.cpu_s == 0 and single.alpha_s == pytest.approx(8e-4 + 2 * 3e-4, rel=1e-6)


def test_fit_compute_counts_the_loop_time_between_steps():
    model = fit_compute(FIXTURES)
    expected = []
    for run in sorted(p for p in FIXTURES.iterdir() if (p / "config.json").exists()):
        cfg = json.loads((run / "config.json").read_text())
        summary = json.loads((run / "summary.json").read_text())
        if (summary.get("status") != "ok" or cfg["workload"] != "mlp-digits"
                or cfg.get("pace_ms") != 10):
            continue
        injector = parse_slowdown(cfg["slowdown"], cfg["seed"])
        injector.validate(cfg["workers"])
        for r in range(cfg["workers"]):
            ev = read_jsonl(run / f"events.rank{r}.jsonl")[0]
            if not ev:
                continue
            w = max(cfg["warmup_iterations"], 1)
            for before, e in zip(ev[w - 1:], ev[w:], strict=False):
                if injector.factor(r, e["iteration"], (e["t_start"] - ev[0]["t_start"]) / 1e9) \
                        == 1.0:
                    expected.append((e["t_start"] - before["t_end"]) / 1e9 + e["compute_s"]
                                    + e["slowdown_s"])
    assert expected
    assert model.fitted[("mlp-digits", 10.0)] == pytest.approx(sorted(expected))
    assert any(x > 0.010 for x in expected)


def test_fit_group_setup_recovers_the_communicator_cost_from_the_groups_logged(tmp_path):
    truth = SimModels(NetworkModel(alpha_s=1e-3, beta_bytes_per_s=1e8, group_setup_s=0.005),
                      ComputeModel())
    c = config("prague-smart", workers=8, slowdown="prob:5",
               algorithm_options={"group_size": 2, "cache_size": 4})
    run = simulate(c, truth, tmp_path / "real")
    assert run.summary["sim"]["preduce_cache_misses"] > 10
    assert run.summary["sim"]["preduce_cache_hits"] > 10
    _as_real_runs([run.run_dir], cores=2)
    # Replaying the members' caches over the logged groups tells misses from hits; their comm
    # differs by exactly the set-up cost (a P-Reduce of 2 costs the same otherwise).
    assert fit_group_setup(tmp_path / "real") == pytest.approx(0.005, rel=1e-6)
    assert fit_group_setup(FIXTURES) is None  # no prague-smart run there


def test_fit_gg_request_is_the_generators_cpu_per_iteration(tmp_path):
    runs = [simulate(config("prague-smart", workers=4, iterations=i, seed=i), MODELS,
                     tmp_path / "real").run_dir for i in (20, 40, 60)]
    _as_real_runs(runs, cores=2)
    for run, per_request in zip(runs, (1e-3, 2e-3, 5e-3), strict=True):
        iterations = json.loads((run / "summary.json").read_text())["iterations"]
        (run / "service-gg.cpu.json").write_text(json.dumps({"cpu_s": per_request * iterations}))
    assert fit_gg_request(tmp_path / "real") == pytest.approx(2e-3)  # the median
    assert fit_gg_request(FIXTURES) is None  # no prague-smart run there


def test_ps_async_workers_queued_at_the_server_do_not_compete_for_the_cores(tmp_path):
    net = NetworkModel(alpha_s=1e-4, beta_bytes_per_s=1e9, cpu_s=2e-3, cores=2)
    c = config("ps-async", workers=16, iterations=40)
    summary = simulate(c, SimModels(net, ComputeModel()), tmp_path).summary
    # The server is saturated (16 workers, 20 ms compute): it spends the CPU time of two
    # messages per request. If all 17 processes competed for the cores, that would be at share
    # 17 / 2 and cap the rate there; never below share 1.
    everyone = 32 / (2 * net.cpu_s * net.share(17))
    alone = 32 / (2 * net.cpu_s * net.share(2))
    assert everyone < summary["throughput"] <= alone * 1.0001


def test_ps_async_flights_overlap_only_the_servers_cpu_time_is_serial(tmp_path):
    # CPU-free messages: the server is never the bottleneck, however long the flights, so every
    # worker runs at compute + two flights.
    net = NetworkModel(alpha_s=5e-3, beta_bytes_per_s=1e12, cpu_s=0.0)
    c = config("ps-async", workers=16, iterations=40)
    summary = simulate(c, SimModels(net, ComputeModel()), tmp_path).summary
    model = layout(c).model_bytes
    step = 0.020 + 2 * net.alpha_s + (2 * model + 4) / net.beta_bytes_per_s
    assert summary["throughput"] == pytest.approx(16 * 32 / step, rel=1e-3)


LAYOUT_PROBE = """
import json, sys
from hetbench.core.config import RunConfig
from hetbench.sim.model import layout
c = RunConfig(algorithm="allreduce", workload="resnet18", workers=4, slowdown="none",
              iterations=10, workload_options={"synthetic": True, "compute": "emulated"})
got = layout(c)
print(json.dumps([got.numel, list(got.bucket_bytes), "torchvision" in sys.modules]))
"""


@pytest.mark.slow
def test_a_layout_built_once_is_read_from_the_cache_without_torchvision(tmp_path):
    skip_unless_today("layout-cache", SLOW_VARIANT_CASES, per_day=4)
    import os
    import subprocess
    import sys

    env = {**os.environ, "HETBENCH_CACHE_DIR": str(tmp_path)}

    def probe():
        out = subprocess.run([sys.executable, "-c", LAYOUT_PROBE], env=env, check=True,
                             capture_output=True, text=True, timeout=120).stdout
        return json.loads(out)

    numel, buckets, imported = probe()
    assert imported and numel == 11_181_642 and sum(buckets) == numel * 4
    assert probe() == [numel, buckets, False]  # read back: no model, no torchvision
    (tmp_path / "layouts.json").write_text("{not json")
    assert probe() == [numel, buckets, True]  # an unreadable cache: built again
    assert probe() == [numel, buckets, False]


def test_member_caches_are_an_lru_per_worker_and_a_hit_needs_every_member():
    from collections import OrderedDict

    from hetbench.sim.protocol import MemberCaches, iteration_gaps

    rng = np.random.default_rng(3)
    # 24 workers, groups of 2-4 and of 20 (past NUMBERED_FROM: cached under a number).
    caches, reference = MemberCaches(24, cache_size=3), [OrderedDict() for _ in range(24)]
    hits = 0
    for _ in range(2000):
        size = int(rng.choice([2, 2, 3, 4, 20]))
        pool = 6 if size < 20 else 21  # few workers: repeated sets, so hits and evictions
        members = tuple(sorted(rng.choice(pool, size=size, replace=False).tolist()))
        want = all(members in reference[x] for x in members)
        for x in members:  # the plain LRU: insert or refresh, then evict the oldest
            reference[x][members] = True
            reference[x].move_to_end(members)
            if len(reference[x]) > 3:
                reference[x].popitem(last=False)
        assert caches.use(members) == want
        hits += want
    assert 0 < hits < 2000
    iteration = rng.integers(0, 9, size=12).tolist()
    for members in [(0, 5), (1, 2, 3), tuple(range(12))]:
        assert iteration_gaps(iteration, members) == {
            x: sum(abs(iteration[o] - iteration[x]) for o in members) for x in members}


def test_fit_compute_draws_an_algorithms_own_iterations_where_it_has_them():
    model = fit_compute(FIXTURES)
    pooled = model.fitted[("mlp-digits", 10.0)]
    own = {name: model.fitted_by_algorithm[("mlp-digits", 10.0, name)]
           for name in ("allreduce", "ps-async")}
    # Each algorithm's whole-batch unslowed iterations, which together are the pool.
    assert sorted(own["allreduce"] + own["ps-async"]) == list(pooled)
    assert own["allreduce"] != own["ps-async"]

    def drawn(algorithm):
        config = RunConfig(algorithm=algorithm, workload="mlp-digits", workers=2, pace_ms=10)
        draw = model.sampler(config)
        return {draw(w) for _ in range(200) for w in range(2)}

    floor = lambda values: {max(v, 0.010) for v in values}  # noqa: E731 (the pace floor)
    assert drawn("allreduce") <= floor(own["allreduce"])
    assert drawn("ps-async") <= floor(own["ps-async"])
    # An algorithm the fit has no run of draws from every algorithm's.
    assert drawn("dpsgd") <= floor(pooled) and not drawn("dpsgd") <= floor(own["allreduce"])
