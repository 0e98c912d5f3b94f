"""Compute is timed on the device's clock (harness/compute_end.py): on CUDA by events on the
compute stream, read once the device has passed them, so that the loop waits for the device
only where a value is needed at once (a pace floor, a slowdown of this iteration's compute).

No GPU here: a fake CUDA stream and events stand in for one (tests/fake_cuda.py, the
`fake_cuda` fixture).
"""

import itertools
import time

import pytest
import torch

from hetbench.harness.compute_end import ComputeEnd
from hetbench.slowdown import parse_slowdown
from tests.fake_cuda import FakeEvent


def _compute_end(pace_s=0.0, slowdown="none"):
    return ComputeEnd(parse_slowdown(slowdown, seed=1), rank=0, pace_s=pace_s,
                      device=torch.device("cuda", 0))


def test_compute_on_cuda_counts_the_kernels_still_running_when_the_host_returns(fake_cuda):
    end = _compute_end()
    end.begin(0, 0.0)
    fake_cuda.launch(0.2)  # forward + backward queued; the host is free at once
    end()
    times = end.step_done().resolve()
    assert 0.19 <= times.compute_s < 0.5
    assert times.t_sync_ns - times.t_start_ns >= 0.19e9
    assert times.slowdown_s == 0.0


def test_a_cuda_run_reads_compute_times_without_waiting_when_nothing_needs_them(fake_cuda):
    """Neither pace nor slowdown: no stream wait but the clock's anchor, no event waited on,
    and the times come out right an iteration later, once the device has passed them."""
    end = _compute_end()
    pending = []
    for iteration in range(5):
        end.begin(iteration, 0.0)
        started = time.monotonic()
        fake_cuda.launch(0.05)  # compute
        end()
        fake_cuda.launch(0.01)  # the step's own device work (its update)
        pending.append(end.step_done())
        assert time.monotonic() - started < 0.03  # the host never waited for the device
    assert fake_cuda.syncs == 1  # the one anchor of the clock (renewed once a second)
    assert FakeEvent.waits == 0
    assert not pending[-1].ready()  # the device is still at it
    fake_cuda.synchronize()
    all_times = [p.resolve() for p in pending]
    for times in all_times:
        assert 0.045 <= times.compute_s < 0.08
        assert times.t_start_ns <= times.t_sync_ns <= times.t_end_ns
        # The step's end is where the device finished its update, 10 ms after compute.
        assert (times.t_end_ns - times.t_sync_ns) / 1e9 >= 0.009
    # Queued back to back, each iteration starts where the device finished the previous one.
    for before, after in itertools.pairwise(all_times):
        assert abs(after.t_start_ns - before.t_end_ns) < 3e6


def test_work_queued_before_an_iteration_is_not_its_compute(fake_cuda):
    end = _compute_end()
    fake_cuda.launch(0.2)  # the previous step's update, still running
    end.begin(1, 0.0)
    fake_cuda.launch(0.05)
    end()
    assert 0.04 <= end.step_done().resolve().compute_s < 0.15


def test_a_slowdown_multiplies_the_devices_compute_not_the_launch_time(fake_cuda):
    end = _compute_end(slowdown="det:3@0")
    end.begin(0, 0.0)
    fake_cuda.launch(0.1)
    started = time.monotonic()
    end()
    # det:3 sleeps 2x compute after it: communication may start 3x the GPU's time after begin.
    assert time.monotonic() - started >= 0.29
    assert FakeEvent.waits == 1  # only this iteration's compute was waited for
    times = end.step_done().resolve()
    assert (times.t_sync_ns - times.t_start_ns) / 1e9 >= 0.29
    assert times.slowdown_s == pytest.approx(2 * times.compute_s)


def test_a_pace_floor_waits_for_the_compute_it_pads(fake_cuda):
    end = _compute_end(pace_s=0.1)
    end.begin(0, 0.0)
    fake_cuda.launch(0.03)
    end()
    assert FakeEvent.waits == 1 and end.compute_waits == 1
    times = end.step_done().resolve()
    assert times.compute_s == pytest.approx(0.1)
    assert (times.t_sync_ns - times.t_start_ns) / 1e9 >= 0.099


def test_on_cpu_nothing_is_synchronized(monkeypatch):
    def no_stream(device=None):
        raise AssertionError("a CPU run asked for a CUDA stream")

    monkeypatch.setattr(torch.cuda, "current_stream", no_stream)
    end = ComputeEnd(parse_slowdown("none", seed=1), rank=0, pace_s=0.0)
    end.begin(0, 0.0)
    end()
    pending = end.step_done()
    assert pending.ready()
    times = pending.resolve()
    assert times.compute_s >= 0.0 and times.t_start_ns <= times.t_sync_ns <= times.t_end_ns


class _SlowFirstDraw:
    """A slowdown whose first draw takes 0.3 s, as the first normal draw did while it
    imported scipy; 2x slower at every iteration."""

    def __init__(self):
        self.draws = 0

    def factor(self, worker, iteration, elapsed_s):
        self.draws += 1
        if self.draws == 1:
            time.sleep(0.3)
        return 2.0


@pytest.mark.parametrize("micro_batches", [False, True])
def test_drawing_the_slowdown_is_not_compute(micro_batches):
    injector = _SlowFirstDraw()
    end = ComputeEnd(injector, rank=0, pace_s=0.0)
    end.begin(0, 0.0)
    if micro_batches:
        begun = end.micro_batch_begin()
        time.sleep(0.02)
        end.micro_batch(begun, 1.0)
        end.end_micro_batches()
    else:
        time.sleep(0.02)
        end()
    times = end.step_done().resolve()
    # 20 ms of compute and 20 ms of slowdown: the 0.3 s draw is in neither (it was made
    # before the run, and the iteration's own draw before its clock started).
    assert 0.019 <= times.compute_s < 0.15 and 0.019 <= times.slowdown_s < 0.15, times
    assert injector.draws == 2
