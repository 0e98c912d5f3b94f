"""Topologies and mixing weights: pure integer code, checked without any process group."""

import itertools

import numpy as np
import pytest

from hetbench.algorithms import topologies as topo

SIZES = range(2, 17)


def _matrix(rows):
    n = len(rows)
    w = np.zeros((n, n))
    for i, row in enumerate(rows):
        for j, value in row.items():
            w[i, j] = value
    return w


@pytest.mark.parametrize(("name", "n"), list(itertools.product(topo.TOPOLOGIES, SIZES)))
def test_graphs_are_undirected_connected_and_loop_free(name, n):
    graph = topo.build(name, n)
    assert len(graph) == n
    assert topo.is_connected(graph)
    for i, peers in enumerate(graph):
        assert i not in peers
        assert list(peers) == sorted(set(peers))
        for j in peers:
            assert i in graph[j]


@pytest.mark.parametrize(("name", "n"), list(itertools.product(topo.TOPOLOGIES, SIZES)))
@pytest.mark.parametrize("kind", ["uniform", "metropolis"])
def test_mixing_weights_are_doubly_stochastic_and_follow_edges(name, n, kind):
    graph = topo.build(name, n)
    w = _matrix(topo.mixing_weights(graph, kind))
    np.testing.assert_allclose(w.sum(axis=1), 1.0)
    np.testing.assert_allclose(w.sum(axis=0), 1.0)
    assert (w >= 0).all()
    for i, j in itertools.product(range(n), range(n)):
        assert (w[i, j] > 0) == (i == j or j in graph[i])
    if kind == "metropolis":
        np.testing.assert_allclose(w, w.T)


def test_degrees_of_each_topology():
    assert topo.degrees(topo.ring(8)) == [2] * 8
    assert topo.degrees(topo.ring(2)) == [1, 1]
    assert topo.degrees(topo.double_ring(8)) == [4] * 8
    assert topo.degrees(topo.double_ring(4)) == [3] * 4  # i+2 and i-2 are one worker
    assert topo.degrees(topo.complete(6)) == [5] * 6
    assert topo.degrees(topo.exponential(8)) == [5] * 8  # +-1, +-2 and 4 (= -4)
    assert topo.exponential(8)[0] == (1, 2, 4, 6, 7)
    assert topo.degrees(topo.exponential(16)) == [7] * 16
    assert topo.torus_shape(12) == (3, 4)
    assert topo.degrees(topo.torus(16)) == [4] * 16
    assert topo.torus(9)[4] == (1, 3, 5, 7)  # the middle of a 3x3 grid
    assert topo.torus(7) == topo.ring(7)  # a prime number of workers is one row


def test_ring_neighbours():
    assert topo.ring(5)[0] == (1, 4)
    assert topo.ring(5)[3] == (2, 4)


def test_uniform_weights_on_a_ring_are_a_third_each():
    assert topo.mixing_weights(topo.ring(6), "uniform")[2] == {1: 1 / 3, 2: 1 / 3, 3: 1 / 3}


def test_metropolis_weights_on_an_irregular_graph():
    star = ((1, 2, 3), (0,), (0,), (0,))  # not one of ours; Metropolis must still work
    w = _matrix(topo.mixing_weights(star, "metropolis"))
    np.testing.assert_allclose(w.sum(axis=0), 1.0)
    assert w[0, 1] == pytest.approx(1 / 4)
    assert w[1, 1] == pytest.approx(3 / 4)


def test_mixing_reaches_consensus_on_every_topology():
    # A connected graph with a doubly stochastic W drives any start to the mean.
    rng = np.random.default_rng(0)
    for name in topo.TOPOLOGIES:
        w = _matrix(topo.mixing_weights(topo.build(name, 8), "uniform"))
        x = rng.normal(size=8)
        y = np.linalg.matrix_power(w, 300) @ x
        np.testing.assert_allclose(y, x.mean(), atol=1e-8)


@pytest.mark.parametrize("n", SIZES)
def test_bipartite_split_keeps_only_active_passive_edges(n):
    active, passive = topo.bipartite_split(n)
    assert sorted(active + passive) == list(range(n))
    graph = topo.bipartite(topo.ring(n))
    assert topo.is_connected(graph)
    for i, peers in enumerate(graph):
        assert peers  # every worker has someone to average with
        for j in peers:
            assert (i in active) != (j in active)
            assert i in graph[j]


def test_bad_names_and_sizes_are_rejected():
    with pytest.raises(ValueError, match="unknown topology"):
        topo.build("star", 4)
    with pytest.raises(ValueError, match="at least 2"):
        topo.build("ring", 1)
    with pytest.raises(ValueError, match="unknown mixing"):
        topo.mixing_weights(topo.ring(4), "max-degree")


def _matrix(rows):
    n = len(rows)
    return np.array([[rows[i].get(j, 0.0) for j in range(n)] for i in range(n)])


def test_one_peer_exponential_visits_the_powers_of_two_in_turn():
    assert [topo.exponential_offsets(8, k) for k in range(4)] == [(1,), (2,), (4,), (1,)]
    assert topo.exponential_offsets(2, 5) == (1,)
    assert topo.exponential_offsets(6, 2) == (4,)  # powers below 6: 1, 2, 4
    assert topo.exponential_offsets(8, 1, peers=2) == (4, 1)
    with pytest.raises(ValueError, match=r"peers must be in 1\.\.3"):
        topo.exponential_offsets(8, 0, peers=4)


@pytest.mark.parametrize("n", [2, 3, 5, 6, 8, 16])
def test_time_varying_mixing_is_doubly_stochastic(n):
    for k in range(6):
        w = _matrix(topo.time_varying_mixing(n, k))
        np.testing.assert_allclose(w.sum(axis=0), 1.0)
        np.testing.assert_allclose(w.sum(axis=1), 1.0)


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_one_peer_rounds_average_exactly_on_a_power_of_two(n):
    product = np.eye(n)
    for k in range(topo.one_peer_rounds(n)):
        product = _matrix(topo.time_varying_mixing(n, k)) @ product
    np.testing.assert_allclose(product, np.full((n, n), 1.0 / n), atol=1e-12)


def test_one_peer_rounds_do_not_average_exactly_otherwise():
    product = np.eye(6)
    for k in range(topo.one_peer_rounds(6)):
        product = _matrix(topo.time_varying_mixing(6, k)) @ product
    assert np.abs(product - 1 / 6).max() > 1e-3
