"""Straggler presets and building blocks: each draws what its documentation says, replays
exactly for a seed, and rejects bad parameters by name."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hetbench.core.config import RunConfig
from hetbench.errors import UserError
from hetbench.sim.model import ComputeModel, NetworkModel, SimModels
from hetbench.sim.run import simulate
from hetbench.slowdown import parse_slowdown
from hetbench.slowdown.presets import PRESETS


def grid(spec: str, workers: int, iterations: int, seed: int = 3) -> np.ndarray:
    injector = parse_slowdown(spec, seed=seed)
    injector.validate(workers)
    return np.array([injector.factors(k, np.zeros(workers)) for k in range(iterations)]).T


def test_persistent_slows_a_fixed_share_by_k_and_every_worker_alike_over_seeds():
    factors = grid("preset:osdi-p90", 1000, 20)
    slow = factors[:, 0] > 1
    assert slow.sum() == 100 and set(np.unique(factors)) == {1.0, 1.271}
    assert (factors == factors[:, :1]).all()  # steady over the run
    # Which workers: any of 16 equally likely over seeds (2 of 16 each seed).
    hits = sum(grid("compose:persistent(frac=0.125;k=2)", 16, 1, seed=s)[:, 0] > 1
               for s in range(800))
    assert hits.sum() == 1600
    assert np.abs(hits / 800 - 0.125).max() < 0.05  # about 4 standard errors


def test_jitter_is_a_clipped_lognormal_of_the_documented_sigma():
    sigma = 0.094
    factors = grid("preset:seqlen", 1000, 200).ravel()
    assert abs((factors > 1).mean() - 0.5) < 0.005
    assert np.quantile(factors, 0.9) == pytest.approx(math.exp(sigma * 1.2815516), rel=0.003)
    assert np.quantile(factors, 0.99) == pytest.approx(math.exp(sigma * 2.3263479), rel=0.005)
    log_above = np.log(factors[factors > 1])
    assert log_above.mean() == pytest.approx(sigma * math.sqrt(2 / math.pi), rel=0.01)


def test_faulty_is_one_worker_three_times_slower():
    factors = grid("preset:faulty", 64, 50)
    assert (np.sort(factors[:, 0]) == [1.0] * 63 + [3.0]).all()
    assert (factors == factors[:, :1]).all()
    chosen = [int(np.argmax(grid("preset:faulty", 8, 1, seed=s)[:, 0])) for s in range(800)]
    assert np.abs(np.bincount(chosen, minlength=8) / 800 - 1 / 8).max() < 0.05


def test_failslow_episodes_have_the_documented_length_and_share():
    on, gap = 67, 3283
    slow = grid("preset:failslow", 1000, 4000) > 1
    assert slow.mean() == pytest.approx(on / (on + gap), rel=0.1)
    # Lengths of the episodes that start and end inside the window: geometric, mean `on`.
    lengths = []
    for row in slow:
        edges = np.flatnonzero(np.diff(row.astype(np.int8)))
        starts, ends = edges[::2] + 1, edges[1::2] + 1
        if row[0]:  # the first edge ends an episode begun before the window
            starts, ends = edges[1::2] + 1, edges[2::2] + 1
        lengths += (ends - starts[:len(ends)]).tolist()
    assert len(lengths) > 800
    assert np.mean(lengths) == pytest.approx(on, rel=0.08)
    assert set(np.unique(grid("preset:failslow", 50, 300))) <= {1.0, 2.0}


def test_gpuvar_is_a_static_spread_with_rare_outliers():
    factors = grid("preset:gpuvar", 20000, 3)
    assert (factors == factors[:, :1]).all()
    column = factors[:, 0]
    outliers = column == 1.5
    assert outliers.mean() == pytest.approx(0.01, abs=0.003)
    ordinary = column[~outliers]
    assert ordinary.min() >= 1.0 and ordinary.max() < 1.08
    assert ordinary.mean() == pytest.approx(1.04, abs=0.001)


def test_gc_pauses_each_worker_once_per_period_at_its_own_phase():
    factors = grid("preset:gc", 500, 200)
    pauses = factors > 1
    assert set(np.unique(factors)) == {1.0, 1.5}
    assert (pauses.sum(axis=1) == 4).all()  # 200 iterations, one pause every 50
    phases = np.argmax(pauses, axis=1)
    assert len(np.unique(phases)) > 40  # unsynchronized: the phases spread over the period
    assert np.abs(np.bincount(phases // 10, minlength=5) / 500 - 0.2).max() < 0.07


def test_a_composition_multiplies_its_blocks_draws():
    parts = ["gpuvar(spread=0.08;outlier_p=0.01;outlier_k=1.5)", "jitter(sigma=0.094)",
             "gc(every=50;pause=0.5)", "persistent(frac=0.1;k=1.085)"]
    product = np.prod([grid(f"compose:{p}", 32, 120) for p in parts], axis=0)
    assert np.allclose(grid("preset:production", 32, 120), product, rtol=1e-12)


@pytest.mark.parametrize("spec", [f"preset:{name}" for name in PRESETS]
                         + ["compose:jitter(sigma=0.2)+jitter(sigma=0.2)",
                            "compose:failslow(k=3,on=5,gap=20)+faulty"])
def test_same_seed_replays_identically_and_factors_match_factor(spec):
    a, b, other = (parse_slowdown(spec, seed=s) for s in (5, 5, 6))
    for injector in (a, b, other):
        injector.validate(24)
    ks = (0, 1, 63, 64, 700)
    draws = [a.factors(k, np.zeros(24)) for k in ks]
    assert all(np.array_equal(d, b.factors(k, np.zeros(24))) for d, k in zip(draws, ks,
                                                                              strict=True))
    for d, k in zip(draws, ks, strict=True):
        assert d.dtype == np.float64 and (d >= 1).all()
        assert d.tolist() == [a.factor(w, k, 9.0) for w in range(24)]
    if spec not in ("preset:gc",):  # gc draws only phases: another seed may repeat a column
        assert any(not np.array_equal(d, other.factors(k, np.zeros(24)))
                   for d, k in zip(draws, ks, strict=True))


def test_two_blocks_of_one_kind_draw_apart():
    factors = grid("compose:jitter(sigma=0.2)+jitter(sigma=0.2)", 200, 50)
    single = grid("compose:jitter(sigma=0.2)", 200, 50)
    assert not np.allclose(factors, single ** 2)


@pytest.mark.parametrize("spec, fragment", [
    ("preset:osdi-p42", "unknown preset 'osdi-p42'"),
    ("compose:wobble(k=2)", "unknown block 'wobble(k=2)'"),
    ("compose:jitter(sigma=-1)", "sigma must be a number in [0, 3]"),
    ("compose:jitter(cv=0.1)", "unknown parameter(s) cv"),
    ("compose:persistent(frac=0.1;k=0.5)", "k must be a number in [1, 100]"),
    ("compose:faulty(n=1.5)", "n must be an integer"),
    ("compose:gc(every=abc)", "every='abc' is not a number"),
    ("compose:gc(every)", "write parameters as key=value"),
    ("compose:jitter(sigma=0.1;sigma=0.2)", "sets sigma twice"),
    ("netfailslow:k=0.5", "k must be a number in [1, 100]"),
    ("netfailslow:on=abc", "on='abc' is not a number"),
    ("netfailslow:k", "expected key=value"),
])
def test_bad_blocks_name_the_parameter(spec, fragment):
    with pytest.raises(UserError) as err:
        RunConfig(algorithm="allreduce", workload="mlp-digits", workers=4, slowdown=spec,
                  iterations=20)
    assert fragment in str(err.value)


def test_the_seqlen_preset_slows_allreduce_by_its_mean_per_iteration_maximum(tmp_path):
    models = SimModels(NetworkModel(alpha_s=1e-6, beta_bytes_per_s=1e11), ComputeModel())
    runs = {}
    for slowdown in ("none", "preset:seqlen"):
        config = RunConfig(algorithm="allreduce", workload="mlp-digits", workers=16,
                           slowdown=slowdown, iterations=205, pace_ms=20)
        runs[slowdown] = simulate(config, models, tmp_path / config.run_id).summary["throughput"]
    expected = grid("preset:seqlen", 16, 205, seed=1)[:, 5:].max(axis=0).mean()
    assert runs["none"] / runs["preset:seqlen"] == pytest.approx(expected, rel=0.05)
