"""The CUDA paths: skipped here (no GPU). On a machine with a GPU:

    .venv/bin/pytest -q -m gpu tests/distributed/test_gpu.py

(or benchmarks/gpu_check.py, which runs this file among its checks). With one GPU the ranks
share it over gloo; the NCCL tests (marked multi_gpu) need one GPU per rank and skip with the
GPU count as their reason.
"""

import time

import numpy as np
import pytest
import torch

from tests.distributed.test_preduce import _values
from tests.helpers import events, final_models, on_ranks, run_config

pytestmark = pytest.mark.gpu


def _nccl_preduce(comm, members):
    assert comm.backend == "nccl"
    t = _values(comm.rank).to(comm.device)
    if comm.rank in members:
        comm.p_reduce_(t, members)  # an NCCL communicator made by the members only
        assert t.is_cuda  # reduced in place on the GPU, no copy to the host
    return t.cpu().tolist()


@pytest.mark.multi_gpu
def test_preduce_on_nccl_member_groups_holds_the_group_mean():
    world = torch.cuda.device_count()
    members = [0, world - 1]
    results = [torch.tensor(t, dtype=torch.float64)
               for t in on_ranks(_nccl_preduce, world, members, device_type="cuda")]
    mean = torch.stack([_values(r) for r in members]).mean(0)
    for rank, t in enumerate(results):
        expected = mean if rank in members else _values(rank)
        assert torch.allclose(t, expected)


def _every_primitive_on_cuda(comm):
    """Each Comm primitive the algorithms use, on CUDA tensors."""
    out = {"backend": comm.backend, "staged": comm.stages_through_host}
    cuda = comm.device
    t = torch.full((5,), float(comm.rank + 1), device=cuda)
    comm.average_(t)
    out["average"] = t.tolist()
    b = torch.full((3,), float(comm.rank), device=cuda)
    comm.broadcast_(b, src=1)
    out["broadcast"] = b.tolist()
    comm.end_setup()
    p = _values(comm.rank).to(cuda)
    comm.p_reduce_(p, [0, 1])
    out["p_reduce"] = p.cpu().tolist()
    if comm.rank == 0:
        message = torch.arange(6.0, device=cuda)
        comm.isend(message, dst=1, tag=5).wait()
        comm.send(torch.tensor([4.0, 2.0], device=cuda), dst=1)
    else:
        first = torch.zeros(6, device=cuda)
        comm.irecv(first, src=0, tag=5).wait()
        second = torch.zeros(2, device=cuda)
        out["sender"] = comm.recv(second)
        assert first.device == second.device == cuda  # delivered into the caller's tensors
        out["first"], out["second"] = first.tolist(), second.tolist()
    # Large messages, isends in flight while the sender changes its tensor at once on the GPU:
    # what arrives is what the tensor held at isend (the staged copy was made before return).
    big = torch.empty(1 << 20, device=cuda)
    received = []
    for i in range(6):
        if comm.rank == 0:
            big.fill_(float(i))
            work = comm.isend(big, dst=1, tag=6)
            big.fill_(-1.0)
            work.wait()
        else:
            comm.irecv(big, src=0, tag=6).wait()
            received.append((big.min().item(), big.max().item()))
    out["received"] = received
    if comm.stages_through_host:
        free = [b for buffers in comm.staging._free.values() for b in buffers]
        out["pinned"] = bool(free) and all(b.is_pinned() for b in free)
        out["allocated"] = comm.staging.allocated
    return out


def test_two_ranks_run_every_comm_primitive_on_cuda_tensors():
    results = on_ranks(_every_primitive_on_cuda, 2, device_type="cuda")
    shared = torch.cuda.device_count() < 2
    for r in results:
        assert r["backend"] == ("gloo" if shared else "nccl")
        assert r["staged"] == shared
        assert r["average"] == [1.5] * 5
        assert r["broadcast"] == [1.0] * 3
        assert np.allclose(r["p_reduce"], ((_values(0) + _values(1)) / 2).tolist())
    assert results[1]["first"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert results[1]["received"] == [(float(i), float(i)) for i in range(6)]
    if shared:  # pinned, reused: one buffer per message size, however many messages
        assert all(r["pinned"] for r in results)
        assert all(r["allocated"] <= 4 for r in results), [r["allocated"] for r in results]
    assert results[1]["second"] == [4.0, 2.0]
    assert results[1]["sender"] == 0


def test_compute_time_waits_for_the_gpu():
    """ComputeEnd's compute time on a real GPU: at least the kernels' own time (CUDA events),
    though the host returns from launching them at once, and read without the host waiting
    for them (the device's events, resolved once the device has passed them)."""
    from hetbench.harness.compute_end import ComputeEnd
    from hetbench.slowdown import parse_slowdown

    device = torch.device("cuda", 0)
    a = torch.randn(4096, 4096, device=device)
    torch.cuda.synchronize(device)
    end = ComputeEnd(parse_slowdown("none", seed=1), rank=0, pace_s=0.0, device=device)
    start_event, end_event = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    end.begin(0, 0.0)
    launched = time.time_ns()
    start_event.record()
    for _ in range(50):
        a = (a @ a).clamp_(-1, 1)
    end_event.record()
    launch_s = (time.time_ns() - launched) / 1e9
    end()
    pending = end.step_done()
    returned_s = (time.time_ns() - launched) / 1e9
    times = pending.resolve()
    kernels_s = start_event.elapsed_time(end_event) / 1e3
    assert times.compute_s >= 0.95 * kernels_s, (times.compute_s, kernels_s, launch_s)
    assert times.compute_s <= 1.05 * kernels_s + 0.002, (times.compute_s, kernels_s)
    assert returned_s < 0.5 * kernels_s, (returned_s, kernels_s)  # the host did not wait
    assert end.compute_waits == 0


def _matmuls(a, times: int):
    for _ in range(times):
        a = (a @ a).clamp_(-1, 1)
    return a


@pytest.mark.parametrize("slowdown", ["none", "det:2@0"])
def test_micro_batches_wait_for_the_gpu_only_when_their_time_is_needed(slowdown):
    """An algorithm's own micro-batches on a real GPU: with nothing to pad or sleep, the host
    queues them all without waiting and the iteration's compute is placed by events; a slowed
    worker waits for each micro-batch (its sleep is (k - 1) x its compute), and the sleeps sum
    to (k - 1) x the compute."""
    from hetbench.harness.compute_end import ComputeEnd
    from hetbench.slowdown import parse_slowdown

    device = torch.device("cuda", 0)
    a = _matmuls(torch.randn(4096, 4096, device=device), 2)  # cuBLAS set up before the clock
    torch.cuda.synchronize(device)
    end = ComputeEnd(parse_slowdown(slowdown, seed=1), rank=0, pace_s=0.0, device=device)
    start_event, end_event = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    end.begin(0, 0.0)
    launched = time.time_ns()
    start_event.record()
    for _ in range(4):
        begun = end.micro_batch_begin()
        a = _matmuls(a, 12)
        end.micro_batch(begun, 0.25)
    end_event.record()
    queued_s = (time.time_ns() - launched) / 1e9
    end.end_micro_batches()
    times = end.step_done().resolve()
    # The span of the events: the kernels, and the sleeps between micro-batches (GPU idle).
    span_s = start_event.elapsed_time(end_event) / 1e3
    assert times.compute_s + times.slowdown_s >= 0.95 * span_s, (times, span_s)
    assert times.compute_s + times.slowdown_s <= 1.05 * span_s + 0.002, (times, span_s)
    if slowdown == "none":
        assert queued_s < 0.5 * span_s, (queued_s, span_s)  # the host did not wait
        assert end.compute_waits == 0 and times.slowdown_s == 0.0
    else:  # each micro-batch slept as long as it computed
        assert end.compute_waits == 1
        assert times.slowdown_s == pytest.approx(times.compute_s, rel=0.05, abs=0.002)


CUDA_RUN_OPTIONS = {
    "prague-static": {"workers_per_node": 2},
    # Never dropping, never replanning: the same samples as the CPU run, in micro-batches
    # whose clock is read (dropcompute) or not (batch-balance's even plan).
    "dropcompute": {"threshold_ms": 1e9, "micro_batches": 4},
    "batch-balance": {"replan_every": 1000},
}


@pytest.mark.parametrize("algorithm", ["allreduce", "prague-static", "dpsgd", "sgp",
                                       "dropcompute", "batch-balance"])
def test_cuda_run_matches_the_cpu_run(tmp_path, algorithm):
    workers = 2
    fields = dict(algorithm=algorithm, workload="mlp-digits", workers=workers, iterations=12,
                  warmup_iterations=2, save_models=True, seed=3)
    if algorithm in CUDA_RUN_OPTIONS:
        fields["algorithm_options"] = CUDA_RUN_OPTIONS[algorithm]
    cpu = run_config(tmp_path / "cpu", device="cpu", **fields)
    cuda = run_config(tmp_path / "cuda", device="cuda", **fields)
    assert cpu["status"] == "ok" and cuda["status"] == "ok", (cpu["cause"], cuda["cause"])
    shared = torch.cuda.device_count() < workers
    assert cuda["backend"] == ("gloo, point to point via host" if shared else "nccl")
    assert all(d.startswith("cuda") for d in cuda["devices"])
    assert cpu["backend"] == "gloo" and cpu["devices"] == ["cpu"] * workers
    for a, b in zip(final_models(tmp_path / "cpu", workers),
                    final_models(tmp_path / "cuda", workers), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    # Each line's loss is read from a host copy queued before the step's end (no stream
    # synchronize): the values are the CPU run's, not a buffer read before its copy landed.
    on_cpu, on_cuda = events(tmp_path / "cpu", workers), events(tmp_path / "cuda", workers)
    for rank in range(workers):
        np.testing.assert_allclose([e["loss"] for e in on_cuda[rank]],
                                   [e["loss"] for e in on_cpu[rank]], rtol=1e-4, atol=1e-5)
