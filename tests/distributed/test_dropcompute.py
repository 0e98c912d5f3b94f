"""DropCompute on real ranks: the straggler stops at the threshold, so its slowdown stops with
it, and with nothing dropped it is All-Reduce (issue 56)."""

import math

import numpy as np

from hetbench.algorithms.dropcompute import choose_threshold, micro_batches_within
from tests.helpers import events, final_models, run_config

PACE_MS = 20


def test_the_straggler_computes_a_fifth_and_ends_with_the_others(tmp_path):
    summary = run_config(tmp_path, algorithm="dropcompute", workload="mlp-digits", workers=3,
                         iterations=30, warmup_iterations=5, pace_ms=PACE_MS,
                         slowdown="det:5@1",
                         algorithm_options={"micro_batches": 10, "threshold_ms": PACE_MS})
    assert summary["status"] == "ok", summary["cause"]
    by_rank = events(tmp_path, 3)
    computed = {r: np.mean([e["micro_batches"] for e in es[5:]]) / 10
                for r, es in by_rank.items()}
    # 5x slower micro-batches: the second one ends at the threshold (one fifth of ten).
    assert 0.1 <= computed[1] <= 0.3, computed
    assert computed[0] >= 0.8 and computed[2] >= 0.8, computed
    # Its slowdown stopped with its compute: its iterations' compute (slowdown included)
    # ends near the others', not 5 times later.
    busy = {r: np.median([e["compute_s"] + e["slowdown_s"] for e in es[5:]])
            for r, es in by_rank.items()}
    assert busy[1] < 1.6 * PACE_MS / 1e3 and busy[1] < 1.6 * max(busy[0], busy[2]), busy
    # Throughput counts the samples used: the straggler's step says how many it computed.
    assert all(e["samples"] == sum((4, 4, 3, 3, 3, 3, 3, 3, 3, 3)[:e["micro_batches"]])
               for e in by_rank[1])
    assert summary["dropped_micro_batches"] > 0 and summary["facts"]["dropped_share"] == "share"


def test_with_every_micro_batch_computed_it_is_allreduce(tmp_path):
    common = dict(workload="mlp-digits", workers=3, iterations=10, warmup_iterations=2,
                  save_models=True, workload_options={"lr": 0.2})
    assert run_config(tmp_path / "a", algorithm="allreduce", **common)["status"] == "ok"
    dropped = run_config(tmp_path / "d", algorithm="dropcompute",
                         algorithm_options={"micro_batches": 4, "threshold_ms": 1e9}, **common)
    assert dropped["status"] == "ok", dropped["cause"]
    assert dropped["dropped_micro_batches"] == 0
    for a, d in zip(final_models(tmp_path / "a", 3), final_models(tmp_path / "d", 3),
                    strict=True):
        np.testing.assert_allclose(d, a, rtol=1e-5, atol=1e-6)


def test_the_automatic_threshold_cuts_a_straggler_and_spares_equal_workers():
    rng = np.random.default_rng(0)
    micro = 0.01 * (1 + 0.05 * rng.random((10, 4, 8)))  # 8 micro-batches of ~10 ms
    micro[:, 1, :] *= 5  # worker 1 is 5x slower
    ends = np.cumsum(micro, axis=2)
    comm = np.full(10, 0.005)
    tau = choose_threshold(ends, comm)

    def rate(threshold):  # micro-batches per second: the paper's effective speedup's measure
        stops = [[micro_batches_within(ends[i, w], threshold) for w in range(4)]
                 for i in range(10)]
        seconds = sum(max(ends[i, w, s - 1] for w, s in enumerate(row)) + comm[i]
                      for i, row in enumerate(stops))
        return sum(map(sum, stops)) / seconds

    # The straggler is cut well before its whole batch, and that beats waiting for it.
    assert tau <= ends[:, [0, 2, 3], -1].max() and micro_batches_within(ends[0, 1], tau) <= 2
    assert rate(tau) > 2 * rate(math.inf)
    assert all(rate(tau) >= rate(t) for t in ends.ravel())
    # Choosing among a large simulation's recorded ends stays quick and applies the same rule.
    many = np.cumsum(0.01 * (1 + rng.random((10, 1024, 4))), axis=2)
    chosen = choose_threshold(many, comm)
    assert math.isfinite(chosen) and micro_batches_within(many[0, 0], chosen) >= 1
    # Equal workers: no threshold gains anything, and none is set.
    equal = np.cumsum(np.full((10, 4, 8), 0.01), axis=2)
    assert math.isinf(choose_threshold(equal, comm))


def test_the_automatic_threshold_is_not_on_a_quantized_end():
    # Paced micro-batches of 5 ms: the unslowed workers' ends are 5, 10, 15, 20 ms, the
    # straggler's (5x) 25, 50, 75, 100. Every tau in (15, 25] cuts the straggler after its
    # first micro-batch and nobody else; the top, 25 ms, is the straggler's end itself.
    quantized = np.cumsum(np.full((10, 4, 4), 0.005), axis=2)
    quantized[:, 1, :] *= 5
    tau = choose_threshold(quantized, np.full(10, 0.005))
    assert 0.015 + 1e-3 < tau < 0.025 - 1e-3
    # Later iterations' ends a hair off the recorded ones stop where calibration did.
    for jitter in (-1e-4, 1e-4):
        assert micro_batches_within((quantized[0, 1] + jitter).tolist(), tau) == 1
        assert micro_batches_within((quantized[0, 0] + jitter).tolist(), tau) == 4
