"""Pure pieces: slowdown schedules, matrix expansion, run identity, throughput windows."""

import dataclasses

import numpy as np
import pytest

from hetbench.core.config import RunConfig
from hetbench.core.metrics import throughput, throughput_window
from hetbench.errors import UserError
from hetbench.harness.matrix import expand, split_list
from hetbench.slowdown import parse_slowdown


def test_probabilistic_slowdown_rate_and_replay():
    injector = parse_slowdown("prob:5", seed=3)
    injector.validate(workers=4)
    factors = np.array([[injector.factor(w, i, 0.0) for i in range(4000)] for w in range(4)])
    assert set(np.unique(factors)) == {1.0, 5.0}
    assert abs((factors == 5.0).mean() - 0.25) < 0.02  # p defaults to 1/workers
    replay = parse_slowdown("prob:5", seed=3)
    replay.validate(workers=4)
    assert all(replay.factor(2, i, 0.0) == factors[2, i] for i in range(200))
    other_seed = parse_slowdown("prob:5", seed=4)
    other_seed.validate(workers=4)
    assert any(other_seed.factor(2, i, 0.0) != factors[2, i] for i in range(200))


def test_explicit_probability_and_delay():
    injector = parse_slowdown("prob:3@1.0")
    injector.validate(workers=8)
    assert injector.delay_s(0, 0, 0.0, compute_s=0.1) == pytest.approx(0.2)


def test_deterministic_slowdown_hits_only_named_workers():
    injector = parse_slowdown("det:10@0,3")
    injector.validate(workers=4)
    assert [injector.factor(w, 7, 0.0) for w in range(4)] == [10.0, 1.0, 1.0, 10.0]


def test_trace_slowdown_follows_time(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("worker,t_from,t_to,factor\n1,2.0,4.0,3\n1,3.0,5.0,6\n")
    injector = parse_slowdown(f"trace:{trace}")
    injector.validate(workers=2)
    assert [injector.factor(1, 0, t) for t in (1.0, 2.5, 3.5, 4.5, 5.5)] == [1, 3, 6, 6, 1]
    assert injector.factor(0, 0, 3.5) == 1.0


@pytest.mark.parametrize("spec", ["none", "prob:5", "prob:3@0.3", "det:4@0,5", "trace",
                                  "net:5@1", "netprob:4@0.5"])
def test_every_kinds_factors_equal_factor_worker_by_worker(tmp_path, spec):
    if spec == "trace":
        path = tmp_path / "t.csv"
        path.write_text("2,0.5,1.5,3\n5,0.0,9.0,2\n")
        spec = f"trace:{path}"
    injector = parse_slowdown(spec, seed=4)
    injector.validate(8)
    elapsed = np.linspace(0.0, 2.0, 8)
    for iteration in (0, 1, 63, 64, 130):
        got = injector.factors(iteration, elapsed)
        want = [injector.factor(w, iteration, t) for w, t in enumerate(elapsed.tolist())]
        assert got.dtype == np.float64 and got.tolist() == want
    if injector.time_free:  # bench sim reads one column per iteration for these
        later = injector.factors(7, elapsed + 100.0).tolist()
        assert later == injector.factors(7, np.zeros(8)).tolist()
    if spec.startswith("prob"):  # over 130 iterations of 8 workers some are slowed
        assert any(injector.factors(k, elapsed).max() > 1 for k in range(130))


def test_slowdown_flag_keeps_det_worker_lists_together():
    assert split_list("none,det:5@0,3,prob:5", str, "--slowdown") == [
        "none", "det:5@0,3", "prob:5"]


def test_matrix_expands_the_product_with_resolved_options():
    configs = expand({"algorithms": ["allreduce", "ps-sync"], "workloads": ["svm"],
                      "workers": [2, 4], "slowdown": ["none", "prob:5"], "seeds": [1, 2],
                      "iterations": 10, "algorithm": {"allreduce": {"bucket_mb": 1}}})
    assert len(configs) == 2 * 2 * 2 * 2
    allreduce = [c for c in configs if c.algorithm == "allreduce"]
    assert all(c.algorithm_options == {
        "bucket_mb": 1.0, "impl": "buckets", "compression": "none", "powersgd_rank": 1,
        "powersgd_start_iter": 2, "powersgd_min_compression_rate": 2.0} for c in allreduce)
    assert all(c.workload_options["batch_size"] == 32 for c in configs)  # defaults filled in
    assert len({c.run_id for c in configs}) == len(configs)


def test_options_added_later_keep_stored_runs_ids_while_at_their_default():
    # make run's allreduce cell had this id before allreduce gained its compression options
    # (computed at e945a28): the stored run is still found, so a rerun skips it.
    config = RunConfig(algorithm="allreduce", workload="mlp-digits", workers=4, iterations=200,
                       pace_ms=10, slowdown="prob:5", target="accuracy:0.85")
    assert config.run_id == "allreduce-mlp-digits-w4-prob_5-s1-0f06a11b90"
    assert "compression" in config.algorithm_options  # resolved all the same
    compressed = dataclasses.replace(config, algorithm_options={
        **config.algorithm_options, "impl": "ddp", "compression": "powersgd"})
    assert compressed.config_hash != config.config_hash


def test_run_id_is_stable_and_ignores_the_matrix_name():
    a = RunConfig(algorithm="allreduce", workload="svm", workers=2, matrix="one")
    b = RunConfig(algorithm="allreduce", workload="svm", workers=2, matrix="two")
    c = RunConfig(algorithm="allreduce", workload="svm", workers=2, seed=9)
    assert a.run_id == b.run_id != c.run_id
    assert RunConfig.from_dict(a.to_dict()) == a


def test_option_table_for_an_algorithm_not_in_the_matrix_is_an_error():
    with pytest.raises(UserError, match=r"\[algorithm.hop\]"):
        expand({"algorithms": ["allreduce"], "workloads": ["svm"], "workers": [2],
                "algorithm": {"hop": {"staleness": 1}}})


def _events(starts_ms, duration_ms, samples=10):
    return [{"t_start": int(s * 1e6), "t_end": int((s + duration_ms) * 1e6), "samples": samples}
            for s in starts_ms]


def test_throughput_counts_only_while_every_worker_runs():
    # Worker 0: 10 iterations of 100 ms; worker 1: 20 of 50 ms, both from t=0.
    events = {0: _events(range(0, 1000, 100), 100), 1: _events(range(0, 1000, 50), 50)}
    window = throughput_window(events, warmup_iterations=2)
    assert window == (int(200e6), int(1000e6))  # after worker 0's warm-up, until the first end
    # In [0.2 s, 1.0 s]: worker 0 does 8 x 10 samples, worker 1 does 16 x 10 samples.
    assert throughput(events, warmup_iterations=2) == pytest.approx(240 / 0.8)


def test_throughput_window_excludes_a_worker_that_finished_early():
    events = {0: _events(range(0, 500, 50), 50), 1: _events(range(0, 2000, 100), 100)}
    _, t1 = throughput_window(events, warmup_iterations=1)
    assert t1 == int(500e6)  # worker 0's last iteration ends at 0.5 s
    assert throughput(events, warmup_iterations=1) > 0
    assert throughput({0: events[0][:1], 1: events[1]}, warmup_iterations=1) == 0.0


def test_throughput_without_a_common_window_sums_each_workers_own_rate():
    # Worker 0 does 5 iterations of 10 ms and is done at 50 ms; worker 1 leaves its 3-iteration
    # warm-up only at 300 ms: no moment where both are past warm-up and running.
    events = {0: _events(range(0, 50, 10), 10), 1: _events(range(0, 1000, 100), 100)}
    assert throughput_window(events, warmup_iterations=3) is None
    # Worker 0: 2 x 10 samples in [30, 50] ms; worker 1: 7 x 10 samples in [300, 1000] ms.
    assert throughput(events, warmup_iterations=3) == pytest.approx(20 / 0.02 + 70 / 0.7)


def test_sync_health_from_the_events_standard_fields():
    from hetbench.core.metrics import sync_health

    events = [{"peers": 1, "staleness": 0.0}, {"peers": 0}, {"peers": 3, "staleness": 2.0},
              {"peers": 1, "staleness": 1.0}]
    health = sync_health(events)
    assert health["sync_share"] == 0.75
    assert health["mean_group_size"] == 1 + 5 / 4
    assert health["mean_staleness"] == 1.0  # over the steps that averaged
    assert sync_health([{"loss": 1.0}]) == {"sync_share": None, "mean_group_size": None,
                                            "mean_staleness": None}


def test_intended_sync_share_of_the_static_schedule_and_local_sgd():
    from hetbench.algorithms.prague.static import PragueStatic, PragueStaticOptions
    from hetbench.algorithms.template import LocalSGD, LocalSGDOptions

    # 16 workers, 4 per node: one worker per node alone in two of every four steps.
    assert PragueStatic.intended_sync_share(PragueStaticOptions(), 16) == 1 - 8 / 64
    assert LocalSGD.intended_sync_share(LocalSGDOptions(period=4), 4) == 0.25
