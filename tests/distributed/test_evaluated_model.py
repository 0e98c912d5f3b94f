"""The model a run evaluates is the one its algorithm produces (Algorithm.evaluated_model): a
parameter server's, DiLoCo's outer model, else the workers' average; in real runs and in
learned simulations, named in the summary and the report's metadata."""

import json

import numpy as np
import pytest
import torch

from hetbench.core.config import RunConfig
from hetbench.core.registry import ALGORITHMS
from hetbench.core.tensors import set_flat_state
from hetbench.reports.load import load_runs
from hetbench.reports.notes import metadata
from hetbench.sim.model import ComputeModel, NetworkModel, SimModels
from hetbench.sim.run import simulate
from tests.helpers import final_models, run_config

MODELS = SimModels(NetworkModel(alpha_s=20e-6, beta_bytes_per_s=1.25e9), ComputeModel())
WORKERS = 3


def _records(run_dir):
    return [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]


def _scores(config: RunConfig, flat: np.ndarray) -> dict:
    """The workload's evaluation of a flat model (flat_state's layout)."""
    workload = config.workload_class()(config.workload_config(), config.seed)
    model = workload.build_model()
    set_flat_state(model, torch.from_numpy(flat))
    return workload.evaluate(model)


def test_each_built_in_declares_its_model():
    assert ALGORITHMS.get("allreduce").evaluated_model_name() == "workers' average"
    assert ALGORITHMS.get("ps-sync").evaluated_model_name() == "server"
    assert ALGORITHMS.get("ps-async").evaluated_model_name() == "server"
    assert ALGORITHMS.get("diloco").evaluated_model_name() == "outer model"


@pytest.mark.parametrize("algorithm", ["ps-sync", "ps-async"])
def test_a_parameter_server_run_scores_the_servers_model(tmp_path, algorithm):
    fields = dict(algorithm=algorithm, workload="mlp-digits", workers=WORKERS, iterations=20,
                  pace_ms=5, seed=3, save_models=True, eval_interval_s=0.05,
                  target="accuracy:0.3")
    real = run_config(tmp_path / "real", **fields)
    assert real["status"] == "ok", real["cause"]
    assert real["evaluated_model"] == "server"
    run_dir = tmp_path / "real"
    server = np.load(run_dir / f"model.rank{WORKERS}.npy")  # the server rank's final model
    evaluated = np.load(run_dir / "model.evaluated.npy")
    assert np.array_equal(evaluated, server)
    config = RunConfig(**fields)
    final = next(r for r in _records(run_dir) if r["kind"] == "final")
    scores = _scores(config, server)
    assert final["test_accuracy"] == scores["test_accuracy"]
    assert final["test_loss"] == pytest.approx(scores["test_loss"], rel=1e-12)
    # The time to target is searched over the server's updates, which it kept while serving.
    records = _records(run_dir)
    (target,) = [r for r in records if r["kind"] == "target"]
    assert target["moment"] == "server update" and target["exact"]
    first_met = next(r for r in records if r["test_accuracy"] >= 0.3)
    assert 0 < target["wall_s"] <= first_met["wall_s"]
    if algorithm == "ps-async":  # its workers hold stale copies: their average is another model
        mean = np.mean(final_models(run_dir, WORKERS), axis=0)
        assert np.abs(mean - server).max() > 1e-3
        return
    # The learned simulation scores the server's model too, which every worker takes.
    simulated = simulate(RunConfig(learn=True, **fields), MODELS, tmp_path / "sim")
    assert simulated.summary["evaluated_model"] == "server"
    np.testing.assert_allclose(np.load(simulated.run_dir / "model.evaluated.npy"), server,
                               rtol=1e-4, atol=1e-5)
    # The report's run metadata names the model.
    runs = load_runs(tmp_path)
    assert sorted(metadata(runs)["evaluated_model"]) == ["server", "server"]


def test_learned_ps_async_scores_the_servers_model(tmp_path):
    """3 workers in phase: the server takes their gradients in rank order (as in
    test_learn.py's reference); the evaluated model is the server's, not the workers'."""
    config = RunConfig(algorithm="ps-async", workload="mlp-digits", workers=3, iterations=6,
                       pace_ms=5, seed=3, save_models=True, learn=True)
    simulated = simulate(config, MODELS, tmp_path)
    workload = config.workload_class()(config.workload_config(), config.seed)
    torch.manual_seed(config.seed)
    server = workload.build_model()
    optimizer = workload.make_optimizer(server)
    held = [torch.nn.utils.parameters_to_vector(server.parameters()).detach().clone()] * 3
    streams = [workload.train_batches(w, 3) for w in range(3)]
    for _ in range(config.iterations):
        for w in range(3):
            worker = workload.build_model()
            torch.nn.utils.vector_to_parameters(held[w], worker.parameters())
            workload.loss(worker, next(streams[w])).backward()
            for p, q in zip(server.parameters(), worker.parameters(), strict=True):
                p.grad = q.grad
            optimizer.step()
            held[w] = torch.nn.utils.parameters_to_vector(server.parameters()).detach().clone()
    reference = torch.nn.utils.parameters_to_vector(server.parameters()).detach().numpy()
    evaluated = np.load(simulated.run_dir / "model.evaluated.npy")
    np.testing.assert_allclose(evaluated, reference, rtol=1e-5, atol=1e-6)
    mean = np.mean(final_models(simulated.run_dir, 3), axis=0)
    assert np.abs(mean - reference).max() > 1e-4
    final = next(r for r in _records(simulated.run_dir) if r["kind"] == "final")
    assert final["test_loss"] == pytest.approx(_scores(config, evaluated)["test_loss"])


def test_diloco_scores_its_outer_model(tmp_path):
    """20 iterations of H = 6: the last outer step is at iteration 18, so the workers' own
    models have taken two inner steps since and their average is not the outer model."""
    fields = dict(algorithm="diloco", workload="mlp-digits", workers=WORKERS, iterations=20,
                  pace_ms=5, seed=2, save_models=True, algorithm_options={"inner_steps": 6},
                  workload_options={"momentum": 0.9})
    real = run_config(tmp_path / "real", **fields)
    assert real["status"] == "ok", real["cause"]
    assert real["evaluated_model"] == "outer model"
    evaluated = np.load(tmp_path / "real" / "model.evaluated.npy")
    mean = np.mean(final_models(tmp_path / "real", WORKERS), axis=0)
    assert np.abs(mean - evaluated).max() > 1e-3
    # The learned simulation's outer model, kept by its own code (DiLoCoSim), is the same
    # model, and it is what the simulation scores.
    simulated = simulate(RunConfig(learn=True, **fields), MODELS, tmp_path / "sim")
    assert simulated.summary["evaluated_model"] == "outer model"
    outer = np.load(simulated.run_dir / "model.evaluated.npy")
    np.testing.assert_allclose(evaluated, outer, rtol=1e-4, atol=1e-5)
    config = RunConfig(**fields)
    final = next(r for r in _records(tmp_path / "real") if r["kind"] == "final")
    assert final["test_loss"] == pytest.approx(_scores(config, evaluated)["test_loss"],
                                               rel=1e-12)
    assert simulated.summary["final_test_loss"] == pytest.approx(final["test_loss"], rel=1e-4)
    # The consensus distance is still the workers' own models' (apart after inner steps).
    assert final["consensus_distance"] > 0
