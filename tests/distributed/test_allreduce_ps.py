"""All-Reduce and Parameter Server on real worker processes against single-process references."""

import numpy as np
import pytest
import torch

from hetbench.core.config import RunConfig
from hetbench.core.tensors import flat_params
from tests.helpers import events, final_models, run_config

WORKERS = 4
ITERATIONS = 12


def single_process_sgd(config: RunConfig) -> np.ndarray:
    """SGD on the concatenation of every worker's batch: what synchronous data parallelism
    computes when each worker's loss is the mean over its (equal-sized) batch."""
    workload = config.workload_class()(config.workload_config(), config.seed)
    torch.manual_seed(config.seed)
    model = workload.build_model()
    optimizer = workload.make_optimizer(model)
    streams = [workload.train_batches(w, config.workers) for w in range(config.workers)]
    for _ in range(config.iterations):
        batches = [next(s) for s in streams]
        x = torch.cat([b[0] for b in batches])
        y = torch.cat([b[1] for b in batches])
        optimizer.zero_grad()
        workload.loss(model, (x, y)).backward()
        optimizer.step()
    return flat_params(model).numpy()


@pytest.mark.parametrize("algorithm,options", [
    ("allreduce", {}), ("allreduce", {"bucket_mb": 0.01}), ("allreduce", {"impl": "ddp"}),
    ("ps-sync", {})], ids=["allreduce", "allreduce-small-buckets", "ddp", "ps-sync"])
def test_synchronous_algorithms_match_single_process_sgd(tmp_path, algorithm, options):
    fields = dict(algorithm=algorithm, workload="mlp-digits", workers=WORKERS,
                  iterations=ITERATIONS, warmup_iterations=2, save_models=True, seed=3,
                  workload_options={"lr": 0.2, "momentum": 0.9}, algorithm_options=options)
    summary = run_config(tmp_path, **fields)
    assert summary["status"] == "ok", summary["cause"]
    assert summary["iterations_per_worker"] == [ITERATIONS] * WORKERS
    reference = single_process_sgd(RunConfig(**fields))
    start = single_process_sgd(RunConfig(**{**fields, "workload_options": {"lr": 0.0}}))
    assert not np.allclose(reference, start), "the reference must have moved for this to test"
    for rank, params in enumerate(final_models(tmp_path, WORKERS)):
        np.testing.assert_allclose(params, reference, rtol=1e-4, atol=2e-5,
                                   err_msg=f"{algorithm} rank {rank} diverged from SGD")
    if options.get("impl") == "ddp":  # DDP all-reduces past Comm: its hook counts the bytes
        model_mb = reference.size * 4 / 1e6
        assert summary["collective_mb_per_iteration"] == pytest.approx(model_mb, rel=1e-6)


def test_ps_async_converges_on_svm(tmp_path):
    summary = run_config(tmp_path, algorithm="ps-async", workload="svm", workers=3,
                         iterations=150, seed=2)
    assert summary["status"] == "ok", summary["cause"]
    assert summary["world_size"] == 4  # 3 workers + the server
    # The synthetic SVM problem flips 10% of labels, so ~0.9 is the ceiling; chance is 0.5.
    assert summary["final_test_accuracy"] > 0.8
    assert summary["throughput"] > 0


def _ddp_run(tmp_path, name, **options):
    fields = dict(algorithm="allreduce", workload="mlp-digits", workers=3, iterations=8,
                  warmup_iterations=2, save_models=True, seed=5,
                  workload_options={"lr": 0.2, "momentum": 0.9},
                  algorithm_options={"impl": "ddp", **options})
    summary = run_config(tmp_path / name, **fields)
    assert summary["status"] == "ok", summary["cause"]
    return summary, final_models(tmp_path / name, 3)


def test_powersgd_at_full_rank_reproduces_uncompressed_allreduce(tmp_path):
    # mlp-digits' weight matrices are 128x64 and 10x128: rank 64 is full for both, so the
    # power iteration reconstructs every gradient (min_compression_rate 0 makes the hook
    # compress them anyway; from iteration 2 on, as torch's hook allows).
    _, plain = _ddp_run(tmp_path, "plain")
    summary, full = _ddp_run(tmp_path, "full", compression="powersgd", powersgd_rank=64,
                             powersgd_min_compression_rate=0.0)
    for a, b in zip(plain, full, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-4)
    # The hook did compress: at full rank P and Q outweigh the matrices themselves.
    assert summary["powersgd_compression_rate"] < 1.0
    summary, low = _ddp_run(tmp_path, "low", compression="powersgd", powersgd_rank=1)
    assert summary["powersgd_compression_rate"] > 10
    assert np.abs(low[0] - plain[0]).max() > 1e-3, "rank 1 should not reproduce the full average"
    for params in low[1:]:
        np.testing.assert_allclose(params, low[0], atol=1e-6)  # still one model everywhere


@pytest.mark.parametrize("compression", ["none", "powersgd"])
def test_ddp_times_the_wait_for_a_straggler_as_communication_not_compute(tmp_path, compression):
    # DDP blocks inside backward on the last bucket's all-reduce. Were that wait timed as
    # compute, the fast workers' compute would be the straggler's 5x, and a prob:k slowdown
    # would multiply waits already spent on other stragglers (the compounding delays that
    # timed out the 8-worker PowerSGD baseline under prob:5).
    pace_s = 0.04
    fields = dict(algorithm="allreduce", workload="mlp-digits", workers=3, iterations=10,
                  warmup_iterations=2, seed=5, pace_ms=pace_s * 1000, slowdown="det:5@0",
                  algorithm_options={"impl": "ddp", "compression": compression})
    summary = run_config(tmp_path, **fields)
    assert summary["status"] == "ok", summary["cause"]
    logs = events(tmp_path, 3)
    for rank in (1, 2):
        steps = logs[rank][2:]
        compute = np.median([e["compute_s"] for e in steps])
        waited = np.median([e["comm_s"] + e["wait_s"] for e in steps])
        assert compute < 2 * pace_s, f"rank {rank} timed its wait as compute ({compute:.3f} s)"
        assert waited > 2 * pace_s, f"rank {rank}'s wait for the straggler is missing ({waited})"
    straggler = logs[0][2:]
    for e in straggler:  # its own 4 x compute, nothing of anyone's wait
        assert e["compute_s"] < 2 * pace_s
        assert e["slowdown_s"] == pytest.approx(4 * e["compute_s"], rel=0.25)
