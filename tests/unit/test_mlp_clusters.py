"""mlp-clusters' data (workloads/mlp_clusters.py): make_classification's clusters from the seed,
every class equally common, not linearly separable, and enough of it for 1,024 workers' shards
at a batch of 16."""

import numpy as np
import pytest
import torch

from hetbench.core.config import RunConfig
from hetbench.workloads.mlp_clusters import MLPClusters, MLPClustersOptions, cluster_data


def test_the_default_data_gives_1024_workers_distinct_shards_of_four_batches_of_16():
    config = RunConfig(algorithm="allreduce", workload="mlp-clusters", workers=1024,
                       iterations=10, workload_options={"batch_size": 16})
    workload = MLPClusters(config.workload_config(), seed=1)
    x, _, x_test, _ = workload._data
    assert x.shape == (65536, 32) and x_test.shape == (8192, 32)
    first, last = workload.train_batches(0, 1024), workload.train_batches(1023, 1024)
    assert len(first._shard) == len(last._shard) == 64
    assert not set(first._shard) & set(last._shard)
    assert config.synthetic


def test_every_class_has_the_same_share_and_the_seed_fixes_the_data():
    options = MLPClustersOptions(samples=20000, test_samples=2000)
    x, y, _, _ = cluster_data(options, seed=5)
    shares = np.bincount(y.numpy(), minlength=10) / len(y)
    assert shares.min() > 0.09 and shares.max() < 0.11, shares
    again, other = cluster_data(options, seed=5), cluster_data(options, seed=6)
    assert torch.equal(x, again[0]) and torch.equal(y, again[1])
    assert not torch.equal(x, other[0])


def test_a_linear_classifier_falls_far_short_of_the_mlp():
    """A class is several clusters far apart: logistic regression on 20,000 samples stays near
    half the test set, where a small MLP trained briefly on the same samples passes 70%. One
    thread each: a fit this small gains nothing from more, and BLAS's and torch's threads
    contending for a loaded machine's cores took it from a second to minutes."""
    from sklearn.linear_model import LogisticRegression
    from threadpoolctl import threadpool_limits

    torch.manual_seed(0)
    options = MLPClustersOptions(samples=20000, test_samples=4000)
    x, y, x_test, y_test = cluster_data(options, seed=1)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with threadpool_limits(1):
            linear = LogisticRegression(max_iter=300).fit(x.numpy(), y.numpy())
        assert linear.score(x_test.numpy(), y_test.numpy()) < 0.6
        model = MLPClusters(options, seed=1).build_model()
        sgd = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(2000):
            batch = slice(16 * step % 20000, 16 * step % 20000 + 16)
            loss = torch.nn.functional.cross_entropy(model(x[batch]), y[batch])
            sgd.zero_grad()
            loss.backward()
            sgd.step()
        with torch.no_grad():
            assert (model(x_test).argmax(1) == y_test).float().mean() > 0.7
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("field, value", [("classes", 1), ("samples", 0), ("hidden", 0),
                                          ("informative", 40)])
def test_bad_options_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        MLPClustersOptions(**{field: value})
