"""DiLoCo on real gloo ranks against the paper's update rule computed in one process."""

import numpy as np
import torch
from torch import nn

from hetbench.core.context import WorkerContext
from hetbench.core.options import build_config
from hetbench.core.registry import ALGORITHMS
from hetbench.core.tensors import flat_grads, flat_params
from tests.helpers import on_ranks


def drive(comm, options: dict, steps: int, lr: float):
    """`steps` DiLoCo iterations from a common start with seeded random gradients per rank;
    returns (start, final model, gradients, per-step peers)."""
    cls = ALGORITHMS.get("diloco")
    torch.manual_seed(7)  # the harness seeds every rank's model alike
    model = nn.Linear(5, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    ctx = WorkerContext(rank=comm.rank, world_size=comm.world_size, workers=comm.world_size,
                        device=torch.device("cpu"), comm=comm, seed=1,
                        rng=np.random.default_rng(comm.rank))
    algo = cls(build_config(cls.Config, options, "diloco"))
    algo.setup(ctx, model, optimizer)
    start = flat_params(model).clone()
    g = torch.Generator().manual_seed(500 + comm.rank)
    grads, peers = [], []
    for _ in range(steps):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=g)
        grads.append(flat_grads(model))
        peers.append(algo.step(ctx, model, optimizer).peers)
    return start.numpy(), flat_params(model).numpy(), torch.stack(grads).numpy(), peers


def test_outer_steps_are_nesterov_steps_on_the_mean_pseudo_gradient():
    n, steps, lr, h = 3, 7, 0.1, 3
    outer_lr, mu = 0.7, 0.9
    results = on_ranks(drive, n, {"inner_steps": h, "outer_lr": outer_lr,
                                  "outer_momentum": mu}, steps, lr)
    start = results[0][0].astype(np.float64)
    grads = np.stack([r[2] for r in results]).astype(np.float64)
    # The paper's Algorithm 1 with plain SGD inside and Nesterov SGD outside, by hand.
    outer, buf = start.copy(), np.zeros_like(start)
    local = np.stack([start] * n)
    for k in range(steps):
        local -= lr * grads[:, k]
        if (k + 1) % h == 0:
            delta = (outer - local).mean(axis=0)
            buf = mu * buf + delta
            outer = outer - outer_lr * (delta + mu * buf)
            local = np.stack([outer] * n)
    for rank, r in enumerate(results):
        np.testing.assert_allclose(r[1], local[rank], atol=1e-5)
        assert r[3] == [0, 0, n - 1, 0, 0, n - 1, 0]
    assert np.abs(local[0] - local[1]).max() > 1e-3  # the last inner step left them apart
