"""SGP and OSGP on real gloo ranks, checked against push-sum's math."""

import time

import numpy as np
import torch

from hetbench.algorithms import topologies
from hetbench.core.tensors import flat_grads, flat_params
from tests.distributed.test_dpsgd import make_worker
from tests.helpers import on_ranks


def drive(comm, algorithm: str, options: dict, steps: int, lr: float, sleep_s: float = 0.0):
    """`steps` iterations with seeded random gradients; rank r sleeps r * sleep_s (random up
    to it) before each step, so overlapped messages arrive late. Returns start, final model,
    gradients, per-step push-sum weights and peers, and finish()'s record."""
    ctx, model, optimizer, algo = make_worker(comm, algorithm, options, lr)
    start = flat_params(model).clone()
    g = torch.Generator().manual_seed(1000 + comm.rank)
    rng = np.random.default_rng(comm.rank)
    grads, weights, peers = [], [], []
    for _ in range(steps):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=g)
        grads.append(flat_grads(model))
        if sleep_s:
            time.sleep(rng.uniform(0, sleep_s) * (comm.rank % 2))
        info = algo.step(ctx, model, optimizer)
        weights.append(info.fields["ps_weight"])
        peers.append(info.peers)
    ctx.stopping = True
    record = algo.finish(ctx, model)
    return (start.numpy(), flat_params(model).numpy(), torch.stack(grads).numpy(),
            weights, peers, record, algo.x.numpy(), algo.w)


def test_sgp_matches_the_push_sum_reference_and_averages_each_round_exactly():
    # x^{k+1} = P_k (x^k - lr g^k), w^{k+1} = P_k w^k in float64: with one in-peer per
    # iteration (a shift) the weights stay 1, and the model is x itself.
    n, steps, lr = 8, 5, 0.1
    results = on_ranks(drive, n, "sgp", {}, steps, lr)
    starts, finals, grads = (np.stack([r[i] for r in results]) for i in range(3))
    x = starts.astype(np.float64)
    for k in range(steps):
        rows = topologies.time_varying_mixing(n, k)
        p = np.array([[rows[i].get(j, 0.0) for j in range(n)] for i in range(n)])
        x = p @ (x - lr * grads[:, k])
    np.testing.assert_allclose(finals, x, atol=1e-5)
    assert all(w == 1.0 for r in results for w in r[3])
    assert all(p == 1 for r in results for p in r[4])
    # lr = 0: each complete round of log2(8) = 3 iterations leaves every de-biased model at
    # the true mean of the starting models.
    results = on_ranks(drive, n, "sgp", {}, 3, 0.0)
    starts, finals = (np.stack([r[i] for r in results]) for i in range(2))
    np.testing.assert_allclose(finals, np.broadcast_to(starts.mean(axis=0), finals.shape),
                               atol=1e-6)


def test_sgp_with_two_peers_matches_its_reference():
    n, steps, lr = 8, 4, 0.05
    results = on_ranks(drive, n, "sgp", {"peers": 2}, steps, lr)
    starts, finals, grads = (np.stack([r[i] for r in results]) for i in range(3))
    x = starts.astype(np.float64)
    for k in range(steps):
        rows = topologies.time_varying_mixing(n, k, peers=2)
        p = np.array([[rows[i].get(j, 0.0) for j in range(n)] for i in range(n)])
        x = p @ (x - lr * grads[:, k])
    np.testing.assert_allclose(finals, x, atol=1e-5)
    assert all(p == 2 for r in results for p in r[4])


def test_osgp_conserves_push_sum_mass_while_messages_arrive_late():
    # Odd ranks lag by up to 30 ms a step, so their out-peers mix their messages an iteration
    # late (weights move away from 1). Push-sum must still lose nothing: after finish, the
    # weights sum to n and the numerators to the start sum less every gradient step.
    n, steps, lr = 4, 30, 0.05
    results = on_ranks(drive, n, "osgp", {"max_delay": 2}, steps, lr, 0.03)
    starts = np.stack([r[0] for r in results]).astype(np.float64)
    grads = np.stack([r[2] for r in results]).astype(np.float64)
    xs = np.stack([r[6] for r in results])
    ws = np.array([r[7] for r in results])
    assert abs(ws.sum() - n) < 1e-9
    np.testing.assert_allclose(xs.sum(axis=0), starts.sum(axis=0) - lr * grads.sum(axis=(0, 1)),
                               atol=1e-4)
    weights = [w for r in results for w in r[3]]
    assert any(abs(w - 1.0) > 0.1 for w in weights), "no message was ever late"
    assert all(w > 0 for w in weights)
    # Every message was mixed in: during training or by finish().
    mixed = sum(sum(r[4]) for r in results) + sum(r[5]["averagings_after_training"]
                                                  for r in results)
    assert mixed == n * steps
    # The de-biased models agree closely (lr = 0 would make them converge exactly).
    finals = np.stack([r[1] for r in results])
    assert np.abs(finals - finals.mean(axis=0)).max() < 0.5


def test_osgp_with_lr_zero_converges_to_the_true_mean():
    n = 4
    results = on_ranks(drive, n, "osgp", {}, 40, 0.0, 0.01)
    starts, finals = (np.stack([r[i] for r in results]) for i in range(2))
    np.testing.assert_allclose(finals, np.broadcast_to(starts.mean(axis=0), finals.shape),
                               atol=1e-5)
