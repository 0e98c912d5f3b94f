"""bench sim --learn (sim/learn.py): the simulated workers train real models, and the same events
give the same math as real runs."""

import json

import numpy as np
import pytest
import torch

from hetbench.core.config import RunConfig
from hetbench.sim.engine import simulate
from hetbench.sim.model import ComputeModel, NetworkModel, SimModels
from tests.helpers import final_models, run_config

MODELS = SimModels(NetworkModel(alpha_s=20e-6, beta_bytes_per_s=1.25e9), ComputeModel())


@pytest.mark.parametrize("algorithm, options", [
    ("allreduce", {}), ("local-sgd", {"period": 3}), ("ps-sync", {}),
    ("prague-static", {"workers_per_node": 2}), ("dpsgd", {}),
    ("dpsgd", {"topology": "one-peer-exponential"}), ("sgp", {}),
    ("diloco", {"inner_steps": 4})])
def test_a_learned_simulation_ends_with_the_real_runs_models(tmp_path, algorithm, options):
    """The lockstep protocols' order of events is fixed by their iterations: the simulation
    applies the same steps to the same minibatches (momentum on) as 4 real ranks did."""
    fields = dict(algorithm=algorithm, workload="mlp-digits", workers=4, iterations=30,
                  warmup_iterations=2, pace_ms=5, seed=2, save_models=True,
                  algorithm_options=options, workload_options={"momentum": 0.9})
    real = run_config(tmp_path / "real", **fields)
    assert real["status"] == "ok", real["cause"]
    simulated = simulate(RunConfig(learn=True, **fields), MODELS, tmp_path / "sim")
    assert simulated.summary["learned"] is True
    for a, b in zip(final_models(tmp_path / "real", 4), final_models(simulated.run_dir, 4),
                    strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_learned_all_reduce_is_single_process_sgd_on_the_union_of_the_minibatches(tmp_path):
    config = RunConfig(algorithm="allreduce", workload="mlp-digits", workers=8, iterations=25,
                       warmup_iterations=2, pace_ms=5, seed=4, save_models=True, learn=True)
    simulated = simulate(config, MODELS, tmp_path)
    workload = config.workload_class()(config.workload_config(), config.seed)
    torch.manual_seed(config.seed)
    model = workload.build_model()
    optimizer = workload.make_optimizer(model)
    streams = [workload.train_batches(w, 8) for w in range(8)]
    for _ in range(25):
        batches = [next(stream) for stream in streams]
        x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
        optimizer.zero_grad()
        workload.loss(model, (x, y)).backward()
        optimizer.step()
    reference = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    for learned in final_models(simulated.run_dir, 8):
        np.testing.assert_allclose(learned, reference, rtol=1e-4, atol=1e-5)


def test_a_report_labels_learned_simulations(tmp_path, bench):
    out = tmp_path / "sim"
    ran = bench("sim", "--learn", "--algorithms", "allreduce,dpsgd", "--workloads", "mlp-digits",
                "--workers", "4", "--iterations", "40", "--pace-ms", "5", "--out", out)
    assert ran.returncode == 0, ran.stderr
    assert bench("report", out).returncode == 0
    md = (out / "report.md").read_text()
    assert "2 of them simulated (learned)" in md
    assert "## Time to target" in md and "not reached" not in md.split("## Time to target")[1][:50]


def test_learned_runs_are_evaluated_like_real_ones(tmp_path):
    config = RunConfig(algorithm="dpsgd", workload="svm", workers=16, iterations=60,
                       warmup_iterations=2, pace_ms=10, seed=1, learn=True,
                       eval_interval_s=0.1, target="accuracy:0.6")
    result = simulate(config, MODELS, tmp_path)
    summary = result.summary
    assert summary["final_test_accuracy"] > 0.6
    assert summary["final_consensus_distance"] > 0  # gossip leaves the models apart
    assert summary["mean_consensus_distance"] > 0
    # The target timed to the iteration: no later than the first evaluation that met it.
    records = [json.loads(line) for line in (result.run_dir / "eval.jsonl").open()]
    (target,) = [r for r in records if r["kind"] == "target"]
    assert target["exact"] and target["test_accuracy"] >= 0.6
    first_met = next(r for r in records if r["kind"] == "snapshot"
                     and r["test_accuracy"] >= 0.6)
    assert 0 < target["wall_s"] <= first_met["wall_s"]


@pytest.mark.parametrize("flags, message", [
    (["--algorithms", "hop"], "no learning half yet"),
    (["--algorithms", "allreduce", "--workloads", "transformer"], "trains mlp-digits, svm"),
    (["--algorithms", "allreduce", "--cores", "2"], "no shared --cores"),
])
def test_what_cannot_learn_is_refused_in_one_line(tmp_path, bench, flags, message):
    args = ["--workloads", "mlp-digits", *flags] if "--workloads" not in flags else flags
    result = bench("sim", "--learn", "--workers", "4", "--iterations", "10", "--pace-ms", "5",
                   *args, "--out", tmp_path / "out")
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines


def test_bench_run_refuses_a_learning_matrix(tmp_path, bench):
    matrix = tmp_path / "m.toml"
    matrix.write_text('algorithms = ["allreduce"]\nworkloads = ["mlp-digits"]\nworkers = [2]\n'
                      "iterations = 10\nlearn = true\n")
    result = bench("run", matrix, "--out", tmp_path / "out")
    assert result.returncode == 2 and "learn = true" in result.stderr
