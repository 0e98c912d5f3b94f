"""Batch balancing on real ranks (issue 56): a 5x straggler's batch falls to a fifth of the
others' and its compute ends with theirs, and every step is single-process SGD over the union of
the workers' samples of that step, unequal batches included."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hetbench.core.config import RunConfig
from hetbench.core.tensors import flat_params
from hetbench.harness.work import SampleStream
from tests.helpers import events, final_models, on_ranks, run_config

PACE_MS = 20
WORKERS = 3
RUN = dict(algorithm="batch-balance", workload="mlp-digits", workers=WORKERS, iterations=24,
           warmup_iterations=4, pace_ms=PACE_MS, slowdown="det:5@1", save_models=True,
           algorithm_options={"window": 3})


@pytest.fixture(scope="module")
def balanced(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("batch-balance")
    summary = run_config(run_dir, **RUN)
    assert summary["status"] == "ok", summary["cause"]
    return run_dir, summary, events(run_dir, WORKERS)


def test_the_straggler_takes_a_fifth_of_the_batch_and_ends_with_the_others(balanced):
    _, summary, by_rank = balanced
    batch = {r: np.median([e["batch"] for e in es[6:]]) for r, es in by_rank.items()}
    # Speeds 1 : 1/5 : 1 share the global batch of 96: about 9, 43 and 44.
    assert 0.12 <= batch[1] / batch[0] <= 0.3 and 0.12 <= batch[1] / batch[2] <= 0.3, batch
    assert all(e["samples"] == e["batch"] for es in by_rank.values() for e in es)
    assert all(sum(by_rank[r][i]["batch"] for r in range(WORKERS)) == WORKERS * 32
               for i in range(len(by_rank[0])))
    # Its compute, slowdown included, ends near the others' (each about 96 / 2.2 samples'
    # share of the pace: 27 ms), not 5 times later.
    busy = {r: np.median([e["compute_s"] + e["slowdown_s"] for e in es[6:]])
            for r, es in by_rank.items()}
    assert busy[1] < 2 * PACE_MS / 1e3 and busy[1] < 1.3 * max(busy[0], busy[2]), busy
    assert summary["batch_share_min"] < 0.4 and summary["facts"]["batch_min"] == "samples"


def test_every_step_is_sgd_over_the_union_of_the_workers_samples(balanced):
    run_dir, _, by_rank = balanced
    assert len({e["batch"] for e in by_rank[1]}) > 1  # the batches did change along the run
    config = RunConfig(**RUN)
    workload = config.workload_class()(config.workload_config(), config.seed)
    torch.manual_seed(config.seed)  # the workers' initial model
    model = workload.build_model()
    optimizer = workload.make_optimizer(model)
    streams = [SampleStream(workload.train_batches(w, WORKERS)) for w in range(WORKERS)]
    for i in range(config.iterations):
        xs, ys = zip(*(streams[w].take(by_rank[w][i]["batch"]) for w in range(WORKERS)),
                     strict=True)
        optimizer.zero_grad()
        workload.loss(model, (torch.cat(xs), torch.cat(ys))).backward()
        optimizer.step()
    reference = flat_params(model).detach().numpy()
    for final in final_models(run_dir, WORKERS):
        np.testing.assert_allclose(final, reference, rtol=1e-5, atol=1e-6)


def _average_carrying(comm, dtype):
    from hetbench.algorithms.dropcompute import average_by_samples_

    calls = []
    real = comm.all_reduce_

    def counted(tensor, *args, **kwargs):
        calls.append(tensor.numel())
        return real(tensor, *args, **kwargs)

    comm.all_reduce_ = counted
    ctx = SimpleNamespace(comm=comm, worker_ranks=None)
    rank = comm.rank
    params = [torch.nn.Parameter(torch.zeros(3, dtype=dtype)) for _ in range(2)]
    for i, p in enumerate(params):
        p.grad = torch.full((3,), float(rank + i), dtype=dtype)
    measured = torch.zeros(4, dtype=torch.float64)
    measured[rank], measured[2 + rank] = 10.0 + rank, 0.125 * (rank + 1)
    summed = average_by_samples_(ctx, [[params[0]], [params[1]]], 10.0 + rank,
                                 carried=measured)
    return calls, summed.tolist(), [p.grad.float().tolist() for p in params]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_measurements_ride_in_the_first_gradient_bucket(dtype):
    # Two workers of 10 and 11 samples: gradients 0 and 1 (bucket 0), 1 and 2 (bucket 1).
    for calls, summed, grads in on_ranks(_average_carrying, 2, dtype):
        # Float32 gradients carry the count and the measurements: one collective a bucket.
        # Half-precision ones would round them: the numbers take a collective of their own.
        assert calls == ([3 + 1 + 4, 3] if dtype == torch.float32 else [1 + 4, 3, 3]), calls
        assert summed == pytest.approx([10.0, 11.0, 0.125, 0.25])
        assert grads[0] == pytest.approx([11 / 21] * 3, rel=1e-2)
        assert grads[1] == pytest.approx([(10 + 22) / 21] * 3, rel=1e-2)
