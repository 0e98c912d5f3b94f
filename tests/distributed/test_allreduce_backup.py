"""Synchronous SGD with backup workers on real processes, replayed in a single process."""

import numpy as np
import torch

from hetbench.core.config import RunConfig
from hetbench.core.store import read_json
from hetbench.core.tensors import flat_params
from tests.helpers import events, final_models, run_config

WORKERS, ITERATIONS = 4, 16


def replay(config: RunConfig, logs: dict, update_workers: list[list[int]]) -> np.ndarray:
    """The aggregator's model after its updates, recomputed in one process: update u averages
    the gradient that each worker of update_workers[u] computed on version u (on the batch of
    that iteration), as the events say which version each gradient was computed on."""
    workload = config.workload_class()(config.workload_config(), config.seed)
    torch.manual_seed(config.seed)
    model = workload.build_model()
    optimizer = workload.make_optimizer(model)
    batches = {w: [] for w in range(config.workers)}
    computed_on = {w: [] for w in range(config.workers)}
    for w in range(config.workers):
        stream = workload.train_batches(w, config.workers)
        version = 0
        for e in logs[w]:
            batches[w].append(next(stream))
            computed_on[w].append(version)
            version = e["version"]
    for u, workers in enumerate(update_workers):
        optimizer.zero_grad()
        for w in workers:
            k = next(k for k, v in enumerate(computed_on[w])
                     if v == u and not logs[w][k]["dropped"])
            (workload.loss(model, batches[w][k]) / len(workers)).backward()
        optimizer.step()
    return flat_params(model).numpy()


def test_each_update_is_the_mean_of_the_first_n_minus_b_gradients(tmp_path):
    # Worker 3 computes 5x slower: with one backup worker the three others fill every step,
    # and each of worker 3's gradients arrives after its step closed. It ends its budget about
    # 3 s after the others, longer than the 2 s a collective may wait: the others must not
    # start the final evaluation's collectives without it (they would time out).
    fields = dict(algorithm="allreduce-backup", workload="mlp-digits", workers=WORKERS,
                  iterations=ITERATIONS, warmup_iterations=2, save_models=True, seed=3,
                  slowdown="det:5@3", pace_ms=50, comm_timeout_s=2.0,
                  workload_options={"lr": 0.2, "momentum": 0.9})
    summary = run_config(tmp_path, **fields)
    assert summary["status"] == "ok", summary["cause"]
    logs = events(tmp_path, WORKERS)
    aggregator = read_json(tmp_path / f"done.rank{WORKERS}.json")
    update_workers = aggregator["update_workers"]
    assert all(len(ws) == WORKERS - 1 for ws in update_workers)
    # Every dropped gradient is on record, with its samples out of the throughput.
    dropped = {w: sum(e["dropped"] for e in logs[w]) for w in logs}
    assert dropped[3] == ITERATIONS, dropped
    assert all(e["samples"] == 0 and e["samples_discarded"] > 0 for e in logs[3])
    assert summary["gradients_dropped"] == sum(dropped.values()) == aggregator[
        "gradients_dropped"]
    assert summary["updates"] == len(update_workers)
    assert all(3 not in ws for ws in update_workers)
    # Used gradients = updates x (n - b).
    used = sum(len(logs[w]) - dropped[w] for w in logs)
    assert used == len(update_workers) * (WORKERS - 1)
    reference = replay(RunConfig(**fields), logs, update_workers)
    start = replay(RunConfig(**fields), logs, [])
    assert not np.allclose(reference, start)
    models = final_models(tmp_path, WORKERS)
    newest = [w for w in range(WORKERS) if logs[w][-1]["version"] == len(update_workers)]
    assert newest
    for w in newest:
        np.testing.assert_allclose(models[w], reference, rtol=1e-4, atol=2e-5)


def test_without_backup_workers_every_gradient_is_used(tmp_path):
    summary = run_config(tmp_path, algorithm="allreduce-backup", workload="mlp-digits",
                         workers=3, iterations=10, pace_ms=5,
                         algorithm_options={"backup_workers": 0})
    assert summary["status"] == "ok", summary["cause"]
    assert summary["gradients_dropped"] == 0
    assert summary["updates"] == 10
