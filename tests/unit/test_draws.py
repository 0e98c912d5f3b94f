"""Vectorized stateless draws equal numpy's default_rng(key).random(), bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from hetbench.slowdown import parse_slowdown
from hetbench.slowdown.draws import SlowBlocks, first_uniform


def numpy_draw(*key) -> float:
    return np.random.default_rng([int(k) for k in key]).random()


@pytest.mark.parametrize("words", [1, 2, 3, 4])
def test_first_uniform_equals_numpy_on_random_keys(words):
    rng = np.random.default_rng(words)
    keys = [rng.integers(0, 2**32, 400, dtype=np.int64) for _ in range(words)]
    keys[0][:3] = [0, 1, 2**32 - 1]  # the edges of a word
    want = [numpy_draw(*key) for key in zip(*keys, strict=True)]
    assert first_uniform(*keys).tolist() == want


def test_first_uniform_broadcasts_and_falls_back_beyond_one_word():
    grid = first_uniform(7, np.arange(5)[:, None], np.arange(3)[None, :], 29)
    assert grid.shape == (5, 3)
    assert grid[4, 2] == numpy_draw(7, 4, 2, 29)
    # 2**32 takes two words in SeedSequence: numpy's own path, still the same draw.
    assert first_uniform(1, [2**32 + 5]).tolist() == [numpy_draw(1, 2**32 + 5)]


def test_slow_blocks_follow_the_scalar_rule_across_blocks():
    blocks = SlowBlocks(seed=3, rows=6, probability=0.3)
    for row in range(6):
        for column in (0, 1, 63, 64, 200):
            assert blocks(row, column) == (numpy_draw(3, row, column) < 0.3)


def test_probabilistic_injector_draws_as_before_in_and_out_of_its_grid():
    injector = parse_slowdown("prob:4@0.25", seed=11)
    injector.validate(8)
    for worker in (0, 7, 9):  # 9: outside the validated world, drawn one at a time
        for iteration in (0, 5, 64, 1000):
            slow = numpy_draw(11, worker, iteration) < 0.25
            assert injector.factor(worker, iteration, 0.0) == (4.0 if slow else 1.0)
    nic = parse_slowdown("netprob:3@0.5", seed=2)
    nic.validate(4)
    for rank in range(4):
        for t in (0.2, 1.5, 130.0):
            slow = numpy_draw(2, rank, int(t), 29) < 0.5
            assert nic.nic_factor(rank, t) == (3.0 if slow else 1.0)
