"""A run records the CPU time its processes spent training: per event, per rank, per service."""

import json

import pytest

from tests.helpers import events, run_config

BASE = {"workload": "mlp-digits", "pace_ms": 10, "iterations": 30, "comm_timeout_s": 30}


@pytest.mark.parametrize("algorithm, services", [("ps-sync", []), ("prague-smart", ["gg"])])
def test_every_process_cpu_time_is_recorded(tmp_path, algorithm, services):
    summary = run_config(tmp_path, algorithm=algorithm, workers=2, **BASE)
    assert summary["status"] == "ok", summary["cause"]
    world = summary["world_size"]  # ps-sync: the server is rank 2
    ranks = {r: json.loads((tmp_path / f"done.rank{r}.json").read_text())["train_cpu_s"]
             for r in range(world)}
    for rank, log in events(tmp_path, 2).items():
        cpu = [e["process_cpu_s"] for e in log]
        assert len(cpu) == 30 and all(c >= 0 for c in cpu)
        # Forward/backward of every iteration costs CPU; the events lie within the rank's
        # training window.
        assert 0 < sum(cpu) <= ranks[rank]
    served = {name: json.loads((tmp_path / f"service-{name}.cpu.json").read_text())["cpu_s"]
              for name in services}
    assert all(c > 0 for c in served.values())  # the generator answered 60 requests, ~1 ms each
    assert summary["train_cpu_s"] == pytest.approx(sum(ranks.values()) + sum(served.values()))


def test_consensus_distance_compares_models_of_the_same_iteration(tmp_path):
    """At a wall-clock tick All-Reduce's workers can be a step apart; with the models kept per
    step (a run with a target), every evaluation compares the workers' models after the same
    iteration: identical for All-Reduce, apart for D-PSGD."""
    from hetbench.core.store import read_jsonl

    common = dict(workload="mlp-digits", workers=4, iterations=60, warmup_iterations=2,
                  pace_ms=10, eval_interval_s=0.1, target="accuracy:0.999")
    spreads = {}
    for algorithm in ("allreduce", "dpsgd"):
        summary = run_config(tmp_path / algorithm, algorithm=algorithm, **common)
        assert summary["status"] == "ok", summary["cause"]
        evals = [e for e in read_jsonl(tmp_path / algorithm / "eval.jsonl")[0]
                 if e["kind"] in ("snapshot", "final")]
        snapshots = [e for e in evals if e["kind"] == "snapshot"]
        assert len(snapshots) >= 4 and all("consensus_iteration" in e for e in snapshots)
        spreads[algorithm] = [e["consensus_distance"] for e in evals]
    assert all(d == 0.0 for d in spreads["allreduce"]), spreads["allreduce"]
    assert max(spreads["dpsgd"]) > 0
