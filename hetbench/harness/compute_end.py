"""Where an iteration's compute ends: the pace floor and the injected slowdown apply there.

A slowdown factor k turns a worker's compute time c into k * c, so c must be compute alone.
Most algorithms communicate after backward, and the harness ends compute right after it. torch
DDP communicates inside backward: its last bucket's all-reduce starts once every gradient is
computed, and backward then blocks until the all-reduce is done. Timing the whole backward as
compute would count the wait for other workers as compute and multiply it by k: under prob:5
each straggler's sleep would be k times the wait it had just spent on another straggler, and
the delays compounded (1 s, 4.5 s, 18 s, then a 30 s gloo timeout, in the 8-worker PowerSGD
baseline run). Such an algorithm calls ctx.end_compute() from its communication hook, before
the last communication starts; the harness's own call after backward then does nothing.

On a GPU, kernels run after the host has queued them: a host clock read at a boundary measures
launches, not compute, unless the host first waits for the queued work. Both boundaries wait for
the device's compute stream (`synchronize`), so compute time, the pace floor and the slowdown
(k times compute) hold on CUDA as on CPU. The stream, not the whole device: communication on
a stream of its own (NCCL's, inside DDP's backward) may still be waiting for a peer, and that
is not compute.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def stream_synchronizer(device: torch.device) -> Callable[[], None]:
    """A call that returns once the work queued on `device`'s current stream is done; a no-op
    on CPU, where an operation is done when it returns."""
    if device.type != "cuda":
        return lambda: None
    return lambda: torch.cuda.current_stream(device).synchronize()


class ComputeEnd:
    """One per worker; begin() at each iteration's start, then call it once compute is over."""

    def __init__(self, injector, rank: int, pace_s: float, device: torch.device | None = None):
        self._injector, self._rank, self._pace_s = injector, rank, pace_s
        #: Waits for the device's queued work (stream_synchronizer): before every clock read.
        self.synchronize = stream_synchronizer(device or torch.device("cpu"))
        self._ended = True

    def begin(self, iteration: int, elapsed_s: float) -> None:
        self._iteration, self._elapsed_s = iteration, elapsed_s
        self.synchronize()  # what was queued before is not this iteration's compute
        self.t_start_ns = time.time_ns()
        self._ended = False

    def __call__(self) -> None:
        """Pad compute to the pace floor, then sleep the slowdown; only the first call counts."""
        if self._ended:
            return
        self._ended = True
        self.synchronize()
        compute_s = (time.time_ns() - self.t_start_ns) / 1e9
        if compute_s < self._pace_s:
            time.sleep(self._pace_s - compute_s)
            compute_s = self._pace_s
        slowdown_s = self._injector.delay_s(self._rank, self._iteration, self._elapsed_s,
                                            compute_s)
        if slowdown_s > 0:
            time.sleep(slowdown_s)
        self.compute_s = compute_s
        #: When communication may start; the slowdown is what lies between compute and this.
        self.t_end_ns = time.time_ns()
