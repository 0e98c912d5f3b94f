"""Async DiLoCo's three halves (issue 56): a real run, its simulation and its learned
simulation each equal the rule replayed in one process along the order its server took the
pushes, score the server's outer model, and under DyLU give a 5x straggler shorter rounds."""

import copy

import numpy as np
import pytest
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from hetbench.algorithms.async_diloco import AsyncDiLoCo, OuterState, outer_step
from hetbench.core.config import RunConfig
from hetbench.sim.model import ComputeModel, NetworkModel, SimModels
from hetbench.sim.run import simulate
from tests.helpers import events, final_models, run_config

MODELS = SimModels(NetworkModel(alpha_s=20e-6, beta_bytes_per_s=1.25e9), ComputeModel())
WORKERS = 3
#: Worker 1 computes 5x slower; DyLU (H = 4) should give it rounds of one step.
FIELDS = dict(algorithm="async-diloco", workload="mlp-digits", workers=WORKERS, iterations=20,
              pace_ms=10, seed=2, slowdown="det:5@1", save_models=True,
              workload_options={"momentum": 0.9},
              algorithm_options={"inner_steps": 4, "dn_period": 2, "dylu": True})


def replay(run_dir, config: RunConfig):
    """The rule in one process, following the server's order and each round's H as the run's
    push events log them (outer_step: the server's update count; local_steps: the round's H):
    each worker's inner steps with its own optimizer and minibatch stream, its pseudo-gradient
    against the outer model it started from, the outer step, the worker taking the outer model;
    then the inner steps after each worker's last push. Returns (outer, worker models)."""
    logged = events(run_dir, config.workers)
    pushes = sorted((e["outer_step"], e["rank"], e["local_steps"])
                    for rank_events in logged.values() for e in rank_events
                    if "outer_step" in e)
    assert [v for v, _, _ in pushes] == list(range(1, len(pushes) + 1))
    workload = config.workload_class()(config.workload_config(), config.seed)
    torch.manual_seed(config.seed)  # every rank's initial model
    initial = workload.build_model()
    models = [copy.deepcopy(initial) for _ in range(config.workers)]
    optimizers = [workload.make_optimizer(m) for m in models]
    streams = [workload.train_batches(w, config.workers) for w in range(config.workers)]
    outer = parameters_to_vector(initial.parameters()).detach().clone()
    started = [outer.clone() for _ in range(config.workers)]
    state, options, taken = OuterState(), config.algorithm_config(), [0] * config.workers

    def inner(w, steps):
        for _ in range(steps):
            optimizers[w].zero_grad()
            workload.loss(models[w], next(streams[w])).backward()
            optimizers[w].step()
        taken[w] += steps

    for _, w, steps in pushes:
        inner(w, steps)
        with torch.no_grad():
            outer_step(outer, started[w] - parameters_to_vector(models[w].parameters()), state,
                       options)
            vector_to_parameters(outer.clone(), models[w].parameters())
        started[w] = outer.clone()
    for w in range(config.workers):
        inner(w, config.iterations - taken[w])
    return outer.numpy(), [parameters_to_vector(m.parameters()).detach().numpy() for m in models]


def mean_local_steps(run_dir) -> dict[int, float]:
    return {rank: np.mean([e["local_steps"] for e in es if "outer_step" in e])
            for rank, es in events(run_dir, WORKERS).items()}


def check_dylu(run_dir, summary) -> None:
    """The straggler's rounds are shorter than every other worker's, as its events and the
    summary's facts say."""
    steps = mean_local_steps(run_dir)
    assert steps[1] < min(steps[0], steps[2]), steps
    assert summary["mean_local_steps"] == pytest.approx([steps[w] for w in range(WORKERS)])
    assert summary["facts"] == AsyncDiLoCo.fact_units
    assert summary["outer_steps"] == sum(
        sum("outer_step" in e for e in es) for es in events(run_dir, WORKERS).values())
    assert summary["staleness_max"] >= summary["staleness_mean"] >= 0


def test_a_real_run_is_the_rule_and_scores_the_servers_model(tmp_path):
    summary = run_config(tmp_path, **FIELDS)
    assert summary["status"] == "ok", summary["cause"]
    assert summary["evaluated_model"] == "server"
    check_dylu(tmp_path, summary)
    server = np.load(tmp_path / f"model.rank{WORKERS}.npy")  # the server rank's final model
    assert np.array_equal(np.load(tmp_path / "model.evaluated.npy"), server)
    outer, workers = replay(tmp_path, RunConfig(**FIELDS))
    np.testing.assert_allclose(server, outer, rtol=1e-5, atol=1e-6)
    for real, expected in zip(final_models(tmp_path, WORKERS), workers, strict=True):
        np.testing.assert_allclose(real, expected, rtol=1e-5, atol=1e-6)


def test_a_simulated_run_gives_the_straggler_shorter_rounds(tmp_path):
    result = simulate(RunConfig(**FIELDS), MODELS, tmp_path)
    assert result.summary["status"] == "ok", result.summary["cause"]
    check_dylu(result.run_dir, result.summary)
    # The fast workers never wait for the straggler: they end their budgets long before it.
    ends = {rank: es[-1]["t_end"] for rank, es in events(result.run_dir, WORKERS).items()}
    assert ends[1] > 2 * max(ends[0], ends[2]), ends


def test_a_learned_run_is_the_rule_and_scores_the_servers_model(tmp_path):
    result = simulate(RunConfig(learn=True, **FIELDS), MODELS, tmp_path)
    assert result.summary["status"] == "ok", result.summary["cause"]
    assert result.summary["evaluated_model"] == "server"
    check_dylu(result.run_dir, result.summary)
    outer, workers = replay(result.run_dir, RunConfig(**FIELDS))
    evaluated = np.load(result.run_dir / "model.evaluated.npy")
    np.testing.assert_allclose(evaluated, outer, rtol=1e-5, atol=1e-6)
    for learned, expected in zip(final_models(result.run_dir, WORKERS), workers, strict=True):
        np.testing.assert_allclose(learned, expected, rtol=1e-5, atol=1e-6)
    # The workers' own models are not the server's (their average neither): it is the one
    # scored.
    assert np.abs(np.mean(final_models(result.run_dir, WORKERS), axis=0) - evaluated).max() > 1e-4
    assert result.summary["final_test_accuracy"] > 0.3
