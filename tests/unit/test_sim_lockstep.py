"""Lockstep (Engine._run_lockstep: an iteration of every worker at a time, numpy over the workers)
gives exactly what the event path gives: the same summary, the same event lines byte for byte,
the same per-worker records, for every protocol that declares it, under every compute model and
slowdown kind it meets. The event path is the reference (tests/unit/test_sim_identical.py holds
it to the results from before the speed work)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hetbench.algorithms.dpsgd import DPSGDSim
from hetbench.core.config import RunConfig
from hetbench.core.metrics import SyncTally
from hetbench.sim.engine import Engine
from hetbench.sim.model import ComputeModel, NetworkModel, SimModels
from hetbench.sim.run import simulate

WALL_CLOCK = {"sim_s", "started_at", "finished_at"}
NET = NetworkModel(alpha_s=1e-3, beta_bytes_per_s=1e8)
#: Compute drawn per worker and iteration from fitted samples (ComputeModel.sampler).
FITTED = ComputeModel(fitted={("mlp-digits", 20.0): (0.020, 0.021, 0.030, 0.0203)},
                      fitted_from="tests")


def config(algorithm, slowdown="prob:5", workers=16, iterations=25, options=None, **kw):
    return RunConfig(algorithm=algorithm, workload="mlp-digits", workers=workers,
                     slowdown=slowdown, iterations=iterations, pace_ms=20, seed=3,
                     algorithm_options=options or {}, **kw)


def played(c: RunConfig, models: SimModels, out: Path, events: str) -> dict:
    """Everything a run directory holds but the wall clock, played each way."""
    runs = {}
    for lockstep in (True, False):
        run = simulate(c, models, out / str(lockstep), events=events, lockstep=lockstep)
        files = {p.name: p.read_bytes() for p in sorted(run.run_dir.iterdir())
                 if p.name not in ("summary.json", "env.json")}
        summary = {k: v for k, v in run.summary.items() if k not in WALL_CLOCK}
        runs[lockstep] = (summary, files)
    return runs


def trace_file(tmp_path: Path) -> str:
    path = tmp_path / "trace.csv"
    path.write_text("worker,t_from,t_to,factor\n3,0.05,0.3,4\n7,0.0,0.1,2.5\n3,0.2,1.0,3\n")
    return f"trace:{path}"


CASES = [
    ("allreduce", {}), ("ps-sync", {}), ("dpsgd", {"topology": "ring"}),
    ("dpsgd", {"topology": "torus"}), ("dpsgd", {"topology": "exponential"}),
    ("dpsgd", {"topology": "one-peer-exponential"}), ("sgp", {"peers": 2}),
    ("prague-static", {"workers_per_node": 4, "cache_size": 2}),
    ("local-sgd", {"period": 4}), ("diloco", {"inner_steps": 3}),
]


@pytest.mark.parametrize(("algorithm", "options"), CASES,
                         ids=[f"{a}-{'-'.join(map(str, o.values()))}" for a, o in CASES])
@pytest.mark.parametrize("slowdown", ["none", "prob:5@0.2", "det:5@1,6", "trace"])
def test_lockstep_equals_the_event_path(tmp_path, algorithm, options, slowdown):
    if slowdown == "trace":
        slowdown = trace_file(tmp_path)
    c = config(algorithm, slowdown, options=options)
    # CPU time per message and a communicator set-up: every term of the cost formulas counts.
    net = NetworkModel(alpha_s=1e-3, beta_bytes_per_s=1e8, cpu_s=2e-4, group_setup_s=5e-3)
    assert Engine(c, SimModels(net, ComputeModel())).lockstep()
    for compute in (ComputeModel(), FITTED):
        for events in ("full", "workers"):
            out = tmp_path / f"{events}-{compute.fitted_from}"
            runs = played(c, SimModels(net, compute), out, events)
            assert runs[True][0] == runs[False][0]
            assert runs[True][1] == runs[False][1]
            assert runs[True][0]["status"] == "ok"
            if events == "workers":
                assert "workers.json" in runs[True][1]


def test_prague_static_lockstep_counts_the_same_cache_misses(tmp_path):
    # 16 workers, 4 per node, a cache of 2: the inter-node groups keep evicting each other.
    c = config("prague-static", options={"workers_per_node": 4, "cache_size": 2})
    net = NetworkModel(alpha_s=1e-3, beta_bytes_per_s=1e8, group_setup_s=5e-3)
    summary = played(c, SimModels(net, ComputeModel()), tmp_path, "workers")[True][0]
    assert summary["sim"]["preduce_cache_misses"] > 16
    assert summary["sim"]["preduce_cache_hits"] > 0


def test_what_is_played_event_by_event(tmp_path):
    plain = SimModels(NET, ComputeModel())
    assert Engine(config("allreduce"), plain).lockstep()
    # A wall-clock budget stops workers by time; shared cores make costs depend on how many
    # processes are in a step at each instant; asynchronous protocols are not lockstep.
    assert not Engine(config("allreduce", iterations=None, seconds=1.0), plain).lockstep()
    shared = SimModels(NetworkModel(alpha_s=1e-3, beta_bytes_per_s=1e8, cores=2),
                       ComputeModel())
    assert not Engine(config("allreduce"), shared).lockstep()
    for algorithm in ("hop", "adpsgd", "osgp", "ps-async", "allreduce-backup", "prague-smart"):
        assert not Engine(config(algorithm), plain).lockstep(), algorithm
    network = config("allreduce", network={"workers_per_node": 4, "intra_gbps": 10,
                                           "inter_gbps": 1})
    assert not Engine(network, plain).lockstep()
    assert not Engine(config("allreduce"), plain, lockstep=False).lockstep()


def test_a_dense_graph_is_played_event_by_event(tmp_path, monkeypatch):
    c = config("dpsgd", options={"topology": "ring"})
    models = SimModels(NET, ComputeModel())
    fast = simulate(c, models, tmp_path / "lockstep", events="workers").summary
    monkeypatch.setattr(DPSGDSim, "LOCKSTEP_EDGES", 16)  # a ring of 16 has 32 edges
    assert not Engine(c, models).lockstep()
    slow = simulate(c, models, tmp_path / "events", events="workers").summary
    assert {k: v for k, v in fast.items() if k not in WALL_CLOCK} == \
        {k: v for k, v in slow.items() if k not in WALL_CLOCK}


def test_an_interrupted_lockstep_run_keeps_what_it_played(tmp_path, monkeypatch):
    original = DPSGDSim.step_all

    def interrupted_at_10(self, k, t_sync, full):
        if k == 10:
            raise KeyboardInterrupt
        return original(self, k, t_sync, full)

    monkeypatch.setattr(DPSGDSim, "step_all", interrupted_at_10)
    c = config("dpsgd", iterations=40, options={"topology": "ring"})
    with pytest.raises(KeyboardInterrupt):
        simulate(c, SimModels(NET, ComputeModel()), tmp_path, events="workers")
    summary = json.loads((tmp_path / c.run_id / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert summary["iterations_per_worker"] == [10] * 16
    workers = json.loads((tmp_path / c.run_id / "workers.json").read_text())["workers"]
    assert [w["iterations"] for w in workers] == [10] * 16


def test_sync_tally_add_all_equals_add_one_by_one():
    peers = np.array([0, 3, 1, 0, 2, 2])
    for staleness in (None, 0.0, 0.1):
        one, many = SyncTally(), SyncTally()
        for p in peers.tolist():
            one.add(p, staleness)
        many.add_all(peers, staleness)
        assert vars(one) == vars(many)
        assert one.health() == many.health()
