"""Batch balancing's rule and its simulated and learning halves (issue 56): batches in
proportion to measured speeds, integers summing to the global batch; the simulated straggler
gets the plan the same rule makes of its simulated measurements; the learner takes a worker's
batch across its minibatches, as a real worker's stream does."""

from __future__ import annotations

import pytest
import torch

from hetbench.algorithms.batch_balance import batch_floor, plan_batches, plan_from_window
from hetbench.core.config import RunConfig
from hetbench.core.store import read_jsonl
from hetbench.harness.work import SampleStream
from hetbench.sim.learn import Learner
from hetbench.sim.model import ComputeModel, NetworkModel, SimModels
from hetbench.sim.run import simulate

MODELS = SimModels(NetworkModel(alpha_s=1e-4, beta_bytes_per_s=1e9), ComputeModel())
RUN = dict(algorithm="batch-balance", workload="mlp-digits", workers=4, iterations=20,
           pace_ms=20, slowdown="det:5@1", algorithm_options={"window": 3})


def test_the_plan_is_proportional_integer_and_floored():
    assert plan_batches([1.0, 0.2, 1.0, 1.0], 128) == [40, 8, 40, 40]
    # 43.6, 8.7, 43.6: the largest remainders first, ties to the lower rank.
    assert plan_batches([1.0, 0.2, 1.0], 96) == [44, 9, 43]
    assert plan_batches([1.0, 1.0, 1.0], 100) == [34, 33, 33]
    # Below the floor: the floor, and the rest shared again in proportion.
    assert plan_batches([1.0, 1e-6, 1.0], 96, floor=3) == [47, 3, 46]
    assert plan_batches([1.0, float("inf"), 2.0], 96) == [32, 32, 32]  # nothing measured
    assert batch_floor(0.1, 30) == 3 and batch_floor(0.0, 32) == 1
    for speeds in ([3.0, 1.0, 7.5, 0.01, 2.2], [1e-9, 1e9, 1.0, 1.0, 5.0]):
        plan = plan_batches(speeds, 160, floor=2)
        assert sum(plan) == 160 and min(plan) >= 2
    with pytest.raises(ValueError):
        plan_batches([1.0, 1.0], 3, floor=2)


@pytest.mark.parametrize("lockstep", [True, False])
def test_the_simulated_straggler_gets_the_plan_of_the_same_rule(tmp_path, lockstep):
    result = simulate(RunConfig(**RUN), MODELS, tmp_path, lockstep=lockstep)
    assert result.summary["status"] == "ok", result.summary["cause"]
    events = {r: read_jsonl(result.run_dir / f"events.rank{r}.jsonl")[0] for r in range(4)}
    steps = list(zip(*(events[r] for r in range(4)), strict=True))
    assert [e["batch"] for e in steps[0]] == [32] * 4  # the even split until measured
    for k in range(1, len(steps)):  # every plan: the rule over the last `window` iterations
        window = [([e["samples"] for e in step], [e["compute_s"] + e["slowdown_s"]
                                                   for e in step])
                  for step in steps[max(0, k - 3):k]]
        assert [e["batch"] for e in steps[k]] == plan_from_window(window, 128, 1), k
    assert [e["batch"] for e in steps[-1]] == [40, 8, 40, 40]
    # Its compute, slowdown included, is the others': 8 samples 5x slower, 40 at pace.
    assert steps[-1][1]["compute_s"] + steps[-1][1]["slowdown_s"] == pytest.approx(
        steps[-1][0]["compute_s"])
    assert result.summary["batch_share_min"] == pytest.approx((32 + 19 * 8) / 20 / 32)
    allreduce = simulate(RunConfig(**{**RUN, "algorithm": "allreduce", "algorithm_options": {}}),
                         MODELS, tmp_path / "a").summary
    assert result.summary["throughput"] > 3 * allreduce["throughput"]


def test_the_learner_takes_a_batch_across_minibatches_as_a_real_worker_does(tmp_path):
    config = RunConfig(algorithm="batch-balance", learn=True, workload="mlp-digits", workers=2,
                       iterations=6)
    learner = Learner(config, tmp_path)
    learner.gradients(samples=[40, 8], stream=True)
    grads = learner.gradients(samples=[40, 8], stream=True)
    # By hand: each worker's second 40 (8) samples of its stream, taken as the real half's
    # Work takes them (samples 40-79 span its second and third minibatches of 32).
    workload = config.workload_class()(config.workload_config(), config.seed)
    torch.manual_seed(config.seed)
    model = workload.build_model()
    for w, count in enumerate([40, 8]):
        stream = SampleStream(workload.train_batches(w, 2))
        stream.skip(count)
        model.zero_grad()
        workload.loss(model, stream.take(count)).backward()
        for name, p in model.named_parameters():
            torch.testing.assert_close(grads[name][w], p.grad, rtol=1e-5, atol=1e-6)


def test_a_learned_run_learns(tmp_path):
    result = simulate(RunConfig(learn=True, **RUN), MODELS, tmp_path)
    assert result.summary["status"] == "ok", result.summary["cause"]
    assert result.summary["final_test_accuracy"] > 0.3


def test_batches_are_replanned_every_replan_every_iterations(tmp_path):
    run = {**RUN, "algorithm_options": {"window": 5, "replan_every": 5}}
    result = simulate(RunConfig(**run), MODELS, tmp_path)
    assert result.summary["status"] == "ok", result.summary["cause"]
    batches = [e["batch"] for e in read_jsonl(result.run_dir / "events.rank1.jsonl")[0]]
    # Planned at the ends of iterations 4, 9, 14: the even split holds until then.
    assert batches[:5] == [32] * 5 and len(set(batches[5:])) == 1 and batches[5] < 32
