"""Async DiLoCo's pure rules (issue 56): the server's outer step against torch's Nesterov SGD,
Delayed Nesterov against its meaning, and DyLU's H."""

import pytest
import torch

from hetbench.algorithms.async_diloco import (
    AsyncDiLoCoOptions,
    OuterState,
    dylu_local_steps,
    next_local_steps,
    outer_step,
)


def _pseudo_gradients(count: int, size: int = 50):
    g = torch.Generator().manual_seed(3)
    return [torch.randn(size, generator=g) for _ in range(count)]


@pytest.mark.parametrize("momentum", [0.9, 0.0])
def test_outer_step_with_dn_period_1_is_torchs_nesterov_sgd(momentum):
    config = AsyncDiLoCoOptions(outer_lr=0.7, outer_momentum=momentum, dn_period=1)
    start = torch.randn(50, generator=torch.Generator().manual_seed(1))
    outer, state = start.clone(), OuterState()
    reference = start.clone().requires_grad_(False)
    # DiLoCo's outer optimizer: Nesterov where there is momentum (torch refuses it without).
    optimizer = torch.optim.SGD([reference], lr=0.7, momentum=momentum,
                                nesterov=momentum > 0)
    for delta in _pseudo_gradients(6):
        outer_step(outer, delta, state, config)
        reference.grad = delta.clone()
        optimizer.step()
        assert torch.equal(outer, reference)  # the same operations: the same bits
    assert state.updates == 6


def test_delayed_nesterov_takes_one_nesterov_step_on_the_mean_every_dn_period():
    """Over each dn_period updates the outer model moves as torch's Nesterov SGD moves it with
    the mean of those pseudo-gradients; in between, plain SGD steps of delta / dn_period."""
    period, lr, beta = 3, 0.7, 0.9
    config = AsyncDiLoCoOptions(outer_lr=lr, outer_momentum=beta, dn_period=period)
    deltas = _pseudo_gradients(3 * period)
    outer, state = torch.zeros(50), OuterState()
    reference = torch.zeros(50)
    optimizer = torch.optim.SGD([reference], lr=lr, momentum=beta, nesterov=True)
    for block in range(3):
        for i, delta in enumerate(deltas[block * period:(block + 1) * period]):
            before = outer.clone()
            outer_step(outer, delta, state, config)
            if i < period - 1:  # no momentum: a plain step of delta / N
                torch.testing.assert_close(outer, before - lr * delta / period)
        reference.grad = torch.stack(deltas[block * period:(block + 1) * period]).mean(0)
        optimizer.step()
        torch.testing.assert_close(outer, reference, rtol=1e-5, atol=1e-6)
        assert not state.accumulated.any()


def test_dylu_scales_each_workers_steps_by_its_speed():
    seconds = [0.010, 0.050, 0.011, None]
    assert [dylu_local_steps(20, seconds, w) for w in range(4)] == [20, 4, 18, 20]
    assert dylu_local_steps(3, [0.01, 1.0], 1) == 1  # never fewer than one step
    assert next_local_steps(AsyncDiLoCoOptions(inner_steps=20), seconds, 1) == 20  # DyLU off
    assert next_local_steps(AsyncDiLoCoOptions(inner_steps=20, dylu=True), seconds, 1) == 4
