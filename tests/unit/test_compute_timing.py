"""Compute is timed on the device's clock: on CUDA the harness waits for the queued kernels at
each compute boundary before reading the host clock (harness/compute_end.py).

No GPU here: a fake CUDA stream stands in for one. Like a GPU, it accepts work at once
("launches") and finishes it later; its synchronize() blocks until the work is done.
"""

import time

import torch

from hetbench.harness.compute_end import ComputeEnd
from hetbench.slowdown import parse_slowdown


class FakeStream:
    def __init__(self):
        self.busy_until = 0.0
        self.syncs = 0

    def launch(self, seconds: float) -> None:
        self.busy_until = max(self.busy_until, time.monotonic()) + seconds

    def synchronize(self) -> None:
        self.syncs += 1
        time.sleep(max(0.0, self.busy_until - time.monotonic()))


def _compute_end(monkeypatch, pace_s=0.0, slowdown="none"):
    stream = FakeStream()
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: stream)
    end = ComputeEnd(parse_slowdown(slowdown, seed=1), rank=0, pace_s=pace_s,
                     device=torch.device("cuda", 0))
    return end, stream


def test_compute_on_cuda_counts_the_kernels_still_running_when_the_host_returns(monkeypatch):
    end, stream = _compute_end(monkeypatch)
    end.begin(0, 0.0)
    stream.launch(0.2)  # forward + backward queued; the host is free at once
    end()
    assert stream.syncs == 2
    assert 0.19 <= end.compute_s < 1.0


def test_work_queued_before_an_iteration_is_not_its_compute(monkeypatch):
    end, stream = _compute_end(monkeypatch)
    stream.launch(0.2)  # the previous step's update, still running
    end.begin(1, 0.0)
    stream.launch(0.05)
    end()
    assert 0.04 <= end.compute_s < 0.15


def test_a_slowdown_multiplies_the_devices_compute_not_the_launch_time(monkeypatch):
    end, stream = _compute_end(monkeypatch, slowdown="det:3@0")
    end.begin(0, 0.0)
    stream.launch(0.1)
    end()
    # det:3 sleeps 2x compute after it: communication may start 3x the GPU's time after begin.
    assert (end.t_end_ns - end.t_start_ns) / 1e9 >= 0.29


def test_on_cpu_nothing_is_synchronized(monkeypatch):
    def no_stream(device=None):
        raise AssertionError("a CPU run asked for a CUDA stream")

    monkeypatch.setattr(torch.cuda, "current_stream", no_stream)
    end = ComputeEnd(parse_slowdown("none", seed=1), rank=0, pace_s=0.0)
    end.begin(0, 0.0)
    end()
    assert end.compute_s >= 0.0
