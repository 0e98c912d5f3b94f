"""The work a simulated worker does follows the real half's rule (issue 56): DropCompute's
straggler computes the micro-batches a real one does, throughput counts the samples computed,
the learner's gradient covers a worker's first micro-batches only, and the engine refuses a
step that ends before its gradient is ready."""

from __future__ import annotations

import pytest
import torch

from hetbench.api import Protocol, UserError
from hetbench.core.config import RunConfig
from hetbench.core.store import read_jsonl
from hetbench.sim.model import ComputeModel, NetworkModel, SimModels
from hetbench.sim.run import simulate
from tests.helpers import sim_only_algorithm

MODELS = SimModels(NetworkModel(alpha_s=1e-4, beta_bytes_per_s=1e9), ComputeModel())
DROP = dict(workload="mlp-digits", workers=4, iterations=20, pace_ms=20, slowdown="det:5@1",
            algorithm_options={"micro_batches": 10, "threshold_ms": 20})


@pytest.mark.parametrize("lockstep", [True, False])
def test_dropcompute_straggler_computes_a_fifth_and_throughput_counts_it(tmp_path, lockstep):
    config = RunConfig(algorithm="dropcompute", **DROP)
    result = simulate(config, MODELS, tmp_path, lockstep=lockstep)
    assert result.summary["status"] == "ok", result.summary["cause"]
    events = {r: read_jsonl(result.run_dir / f"events.rank{r}.jsonl")[0] for r in range(4)}
    # As the real test's straggler: 5x slower micro-batches, the 2nd one reaches tau.
    assert {e["micro_batches"] for e in events[1]} == {2}
    assert {e["micro_batches"] for e in events[0]} == {10}
    sizes = [4, 4, 3, 3, 3, 3, 3, 3, 3, 3]  # mlp-digits' batch of 32 in 10
    assert {e["samples"] for e in events[1]} == {sum(sizes[:2])}
    # Its compute and slowdown are those of 2 micro-batches: near the others' compute.
    straggler = events[1][5]
    assert straggler["compute_s"] + straggler["slowdown_s"] == pytest.approx(
        0.020 * 8 / 32 * 5)
    assert result.summary["samples"] == 20 * (3 * 32 + 8)
    assert result.summary["dropped_micro_batches"] == 20 * 8
    allreduce = simulate(RunConfig(algorithm="allreduce", **{**DROP, "algorithm_options": {}}),
                         MODELS, tmp_path / "a").summary
    assert result.summary["throughput"] > 3 * allreduce["throughput"]


def test_learned_dropcompute_uses_the_first_micro_batches_gradient(tmp_path):
    result = simulate(RunConfig(algorithm="dropcompute", learn=True, **DROP), MODELS, tmp_path)
    assert result.summary["status"] == "ok", result.summary["cause"]
    from hetbench.sim.learn import Learner

    def learner(name):  # seeded alike: the same models and the same batches
        return Learner(RunConfig(algorithm="allreduce", learn=True, workload="mlp-digits",
                                 workers=2, iterations=6), tmp_path / name)

    grads = learner("a").gradients(samples=[32, 7])
    # Worker 1's gradient by hand: the mean loss over the first 7 samples of its next batch.
    fresh = learner("b")
    index = fresh._streams[1].next_indices()
    x, y = fresh._gather[0][index][:7], fresh._gather[1][index][:7]
    fresh.model.zero_grad()
    fresh.workload.loss(fresh.model, (x, y)).backward()
    for name, p in fresh.model.named_parameters():
        torch.testing.assert_close(grads[name][1], p.grad, rtol=1e-5, atol=1e-6)
    whole = learner("c").gradients()
    for name in grads:  # worker 0 computed its whole batch: the plain gradient
        torch.testing.assert_close(grads[name][0], whole[name][0], rtol=1e-6, atol=1e-7)



def test_simulated_dropcompute_on_a_cluster_calibrates_with_the_all_reduces_duration(tmp_path):
    # On a [network] cluster the threshold is chosen with what the all-reduce lasts (tens of
    # ms for ResNet-50's gradients), not its end on the clock after ten iterations (about a
    # second, against which cutting the trace's 2.25x slower workers gains nothing).
    config = RunConfig(algorithm="dropcompute", workload="resnet50", workers=8, iterations=30,
                       slowdown="replay:bytedance-ar", network={"preset": "prague"},
                       workload_options={"compute": "emulated", "compute_preset": "h200",
                                         "batch_size": 64})
    result = simulate(config, SimModels(), tmp_path)
    assert result.summary["status"] == "ok", result.summary["cause"]
    events = {r: read_jsonl(result.run_dir / f"events.rank{r}.jsonl")[0] for r in range(8)}
    after = {r: {e["micro_batches"] for e in es[10:]} for r, es in events.items()}
    # The trace's slowed workers (0 and 4 of 8) stop early; the others compute every one.
    assert max(after[0] | after[4]) < 4 and after[1] == {4}, after
    tau_ms = events[0][-1]["threshold_ms"]
    assert 2.25 * 32.55 / 4 < tau_ms < 2.25 * 2 * 32.55 / 4, tau_ms  # its 1st and 2nd ends

class EarlyEndSim(Protocol):
    def ready(self, w):
        self.engine.end_step(w, self.engine.t_start[w], 0.0, peers=0)


def test_a_step_ending_before_its_gradient_is_refused_in_one_line(tmp_path, monkeypatch):
    name = sim_only_algorithm(monkeypatch, "test-early-end", EarlyEndSim)
    config = RunConfig(algorithm=name, workload="mlp-digits", workers=2,
                       iterations=8, pace_ms=5)
    with pytest.raises(UserError) as refused:
        simulate(config, MODELS, tmp_path)
    text = str(refused.value)
    assert "EarlyEndSim" in text and "ended worker 0's step 0" in text and "\n" not in text
