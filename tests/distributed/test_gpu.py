"""The CUDA/NCCL paths: skipped here (no GPU); run them on a machine with 2+ GPUs.

    .venv/bin/pytest -q -m gpu tests/distributed/test_gpu.py
"""

import numpy as np
import pytest
import torch

from tests.distributed.test_preduce import _values
from tests.helpers import final_models, on_ranks, run_config

pytestmark = pytest.mark.gpu


def _nccl_preduce(comm, members):
    assert comm.backend == "nccl"
    t = _values(comm.rank).to(comm.device)
    if comm.rank in members:
        comm.p_reduce_(t, members)  # an NCCL communicator made by the members only
        assert t.is_cuda  # reduced in place on the GPU, no copy to the host
    return t.cpu().tolist()


def test_preduce_on_nccl_member_groups_holds_the_group_mean():
    world = torch.cuda.device_count()
    members = [0, world - 1]
    results = [torch.tensor(t, dtype=torch.float64)
               for t in on_ranks(_nccl_preduce, world, members, device_type="cuda")]
    mean = torch.stack([_values(r) for r in members]).mean(0)
    for rank, t in enumerate(results):
        expected = mean if rank in members else _values(rank)
        assert torch.allclose(t, expected)


@pytest.mark.parametrize("algorithm", ["allreduce", "prague-static", "dpsgd"])
def test_cuda_run_matches_the_cpu_run(tmp_path, algorithm):
    workers = 2
    fields = dict(algorithm=algorithm, workload="mlp-digits", workers=workers, iterations=12,
                  warmup_iterations=2, save_models=True, seed=3)
    cpu = run_config(tmp_path / "cpu", device="cpu", **fields)
    cuda = run_config(tmp_path / "cuda", device="cuda", **fields)
    assert cpu["status"] == "ok" and cuda["status"] == "ok", (cpu["cause"], cuda["cause"])
    for a, b in zip(final_models(tmp_path / "cpu", workers),
                    final_models(tmp_path / "cuda", workers), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
