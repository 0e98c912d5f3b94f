"""D-PSGD on real gloo ranks, checked against the math it claims to do."""

import time

import numpy as np
import torch
from torch import nn

from hetbench.algorithms import topologies
from hetbench.core.context import WorkerContext
from hetbench.core.options import build_config
from hetbench.core.registry import ALGORITHMS
from hetbench.core.tensors import flat_grads, flat_params
from tests.helpers import on_ranks


def make_worker(comm, algorithm: str, options: dict, lr: float):
    """A tiny model whose start differs per rank, its SGD optimizer, a context and a set-up
    algorithm: the pieces the harness would hand the algorithm."""
    cls = ALGORITHMS.get(algorithm)
    torch.manual_seed(100 + comm.rank)
    model = nn.Linear(6, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    ctx = WorkerContext(rank=comm.rank, world_size=comm.world_size, workers=comm.world_size,
                        device=torch.device("cpu"), comm=comm, seed=1,
                        rng=np.random.default_rng([1, comm.rank, 17]))
    algo = cls(build_config(cls.Config, options, algorithm))
    algo.setup(ctx, model, optimizer)
    comm.barrier()
    return ctx, model, optimizer, algo


def drive(comm, algorithm: str, options: dict, steps: int, lr: float, pause_s: float = 0.0):
    """`steps` iterations of an algorithm with seeded random gradients, as the worker loop runs
    them, each followed by `pause_s` of sleep (a stand-in for compute that keeps asynchronous
    ranks progressing at about the same rate on a loaded host); returns (start model, final
    model, the gradient of each step) on this rank."""
    ctx, model, optimizer, algo = make_worker(comm, algorithm, options, lr)
    start = flat_params(model).clone()
    g = torch.Generator().manual_seed(1000 + comm.rank)
    grads = []
    iteration = 0
    while iteration < steps:
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=g)
        grads.append(flat_grads(model))
        info = algo.step(ctx, model, optimizer)
        iteration = info.next_iteration if info.next_iteration is not None else iteration + 1
        time.sleep(pause_s)
    ctx.stopping = True
    algo.finish(ctx, model)
    return start.numpy(), flat_params(model).numpy(), torch.stack(grads).numpy()


def spread(models: np.ndarray) -> float:
    """Largest distance of a worker's model from the mean model."""
    return float(np.abs(models - models.mean(axis=0)).max())


def _results(results):
    starts, finals, grads = (np.stack(part) for part in zip(*results, strict=True))
    return starts, finals, grads


def test_with_lr_zero_the_average_is_kept_and_models_reach_consensus():
    starts, finals, _ = _results(on_ranks(drive, 5, "dpsgd", {}, 40, 0.0))
    assert spread(starts) > 0.1  # the ranks really start apart
    np.testing.assert_allclose(finals.mean(axis=0), starts.mean(axis=0), atol=1e-6)
    assert spread(finals) < 1e-4 * spread(starts)


def test_matches_a_single_process_reference_on_every_step():
    # x^{k+1} = W x^k - lr g^k for the whole stack of models (Metropolis weights, exponential
    # graph), computed in float64 in one process.
    options = {"topology": "exponential", "weights": "metropolis"}
    steps, lr, n = 6, 0.1, 6
    starts, finals, grads = _results(on_ranks(drive, n, "dpsgd", options, steps, lr))
    rows = topologies.mixing_weights(topologies.exponential(n), "metropolis")
    w = np.array([[rows[i].get(j, 0.0) for j in range(n)] for i in range(n)])
    x = starts.astype(np.float64)
    for k in range(steps):
        x = w @ x - lr * grads[:, k]
    np.testing.assert_allclose(finals, x, atol=1e-5)
    assert spread(finals) > 1e-3  # gradients differ per rank: not trivially equal


def _one_step_against_all_reduce(comm, steps: int, lr: float):
    ctx, model, optimizer, algo = make_worker(
        comm, "dpsgd", {"topology": "complete", "weights": "uniform"}, lr)
    g = torch.Generator().manual_seed(7 + comm.rank)
    worst = 0.0
    for _ in range(steps):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=g)
        expected = comm.average_(flat_params(model)) - lr * flat_grads(model)
        algo.step(ctx, model, optimizer)
        worst = max(worst, float((flat_params(model) - expected).abs().max()))
    return worst


def test_complete_graph_with_uniform_weights_is_all_reduce_model_averaging():
    assert max(on_ranks(_one_step_against_all_reduce, 4, 5, 0.1)) < 1e-6


def test_one_peer_exponential_matches_the_time_varying_reference():
    # x^{k+1} = W_k x^k - lr g^k with W_k the one-peer exponential graph's matrix of iteration
    # k; with lr = 0 and 8 workers, 3 iterations average exactly.
    n, steps, lr = 8, 5, 0.1
    starts, finals, grads = _results(
        on_ranks(drive, n, "dpsgd", {"topology": "one-peer-exponential"}, steps, lr))
    x = starts.astype(np.float64)
    for k in range(steps):
        rows = topologies.time_varying_mixing(n, k)
        w = np.array([[rows[i].get(j, 0.0) for j in range(n)] for i in range(n)])
        x = w @ x - lr * grads[:, k]
    np.testing.assert_allclose(finals, x, atol=1e-5)
    starts, finals, _ = _results(
        on_ranks(drive, n, "dpsgd", {"topology": "one-peer-exponential"}, 3, 0.0))
    np.testing.assert_allclose(finals, np.broadcast_to(starts.mean(axis=0), finals.shape),
                               atol=1e-6)
