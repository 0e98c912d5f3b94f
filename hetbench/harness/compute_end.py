"""Where an iteration's compute ends: the pace floor and the injected slowdown apply there; and
when, on the device's clock, the iteration's parts began and ended.

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
launches, not compute. Earlier the harness waited for the device's stream at every boundary
(three times an iteration); each wait empties the GPU's queue, and the host's next launches
then find it idle: ResNet-18 at batch 128 ran at 0.905x a plain DDP loop on an H200 (issue 44).
Now the boundaries are CUDA events on the compute stream (`CudaClock`), read once they have
happened, an iteration or two later (`IterationTimes`): the event line of an iteration is
written then. Only an iteration that needs its compute time at once waits, and only for its own
compute (the end event, not the whole device): one with a pace floor (compute is padded up to
it) or one the slowdown slows (its sleep is (k - 1) x its compute). A slowed or paced GPU then
idles during the sleep in any case, as the slow worker it emulates; what the wait adds is the
restart's launch latency. Events are placed on the host's clock by an anchor, an event recorded
on the drained stream at a known host time, renewed every ANCHOR_S seconds (one stream wait a
second), so that event times stay within microseconds of the host's (the clocks drift apart at
parts per million).

An algorithm that owns its compute (Algorithm.compute, harness/work.py) takes it a micro-batch
at a time: each one ends with `micro_batch`, which pads it to its share of the pace floor and
sleeps its share of the slowdown, so a straggler that stops early stops its delay too; the
iteration's compute ends at `end_micro_batches`. On CUDA a micro-batch waits for its own end
event only when its time is needed at once: for its floor or its sleep, or when the algorithm
reads its clock (`wait_micro_batches`, Work.elapsed_s); otherwise the iteration's compute is
placed by events, as the one-batch path's.

Times recorded follow the synchronizing definition exactly: an iteration starts when the host
begins it or the stream finishes earlier work, whichever is later; compute ends when the host
called the end and the stream finished the compute; the step ends when the host returned from
it and the stream finished the step's own device work.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from hetbench.comm.clock import now_ns

#: Seconds between the anchors that place CUDA events on the host clock (CudaClock).
ANCHOR_S = 1.0


@dataclass
class IterationTimes:
    """One iteration's boundaries on the host clock (ns) and its compute and slowdown (s)."""

    t_start_ns: int
    t_sync_ns: int
    t_end_ns: int
    compute_s: float
    slowdown_s: float


class _Marks:
    """What the host knew at each boundary of one iteration: its clock there, and on CUDA the
    event recorded there (None on CPU, or where the host waited, which makes its clock the
    boundary itself)."""

    def __init__(self, host_start_ns: int, start_event):
        self.host_start_ns, self.start_event = host_start_ns, start_event
        self.host_compute_ns = self.compute_event = None
        #: Set when the host waited for compute (pace, slowdown): then exact already.
        self.compute_s: float | None = None
        self.t_start_ns: int | None = None
        self.slowdown_s = 0.0
        self.host_sync_ns: int | None = None
        self.host_end_ns = self.end_event = None


class CudaClock:
    """CUDA events on the current stream of `device`, placed on the host clock by anchors."""

    def __init__(self, device: torch.device):
        self.device = device
        self._anchor_event = None
        self._anchor_ns = 0

    def mark(self, host_ns: int, renew: bool = False):
        """An event recorded now on the stream; with `renew`, renews the anchor first when it
        is due (at an iteration's start, never inside one)."""
        if renew and (self._anchor_event is None
                      or host_ns - self._anchor_ns > ANCHOR_S * 1e9):
            torch.cuda.current_stream(self.device).synchronize()
            self._anchor_event = self._event()
            self._anchor_ns = now_ns()
        return self._event()

    def _event(self):
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def host_ns(self, event, anchor) -> int:
        """When `event` happened on the host clock (both events have happened)."""
        anchor_event, anchor_ns = anchor
        return anchor_ns + round(anchor_event.elapsed_time(event) * 1e6)

    @property
    def anchor(self):
        return self._anchor_event, self._anchor_ns


class ComputeEnd:
    """One per worker; begin() at each iteration's start, call it once compute is over, and
    step_done() after the step: its IterationTimes, resolved at once on CPU and once the
    device has reached them on CUDA (PendingTimes)."""

    def __init__(self, injector, rank: int, pace_s: float, device: torch.device | None = None):
        self._injector, self._rank, self._pace_s = injector, rank, pace_s
        # A kind's first draw may load what it draws with (scipy for normal draws: a fifth
        # of a second or more): here, before the run's clock starts, not in iteration 0.
        injector.factor(rank, 0, 0.0)
        device = device or torch.device("cpu")
        #: None on CPU, where an operation is done when it returns.
        self.clock = CudaClock(device) if device.type == "cuda" else None
        #: Iterations that waited for their compute at once (pace or slowdown).
        self.compute_waits = 0
        self._marks: _Marks | None = None
        self._ended = True

    def begin(self, iteration: int, elapsed_s: float) -> None:
        # Drawn before the iteration's clock starts: the draw is the harness's, not compute.
        self._factor = self._injector.factor(self._rank, iteration, elapsed_s)
        self._micro_slowdown_s = 0.0
        #: On CUDA, the end event of micro-batches queued and not yet waited for.
        self._unread = None
        host_ns = now_ns()
        event = None if self.clock is None else self.clock.mark(host_ns, renew=True)
        self._marks = _Marks(host_ns, event)
        self._anchor = None if self.clock is None else self.clock.anchor
        self._ended = False

    def __call__(self) -> None:
        """Pad compute to the pace floor, then sleep the slowdown; only the first call counts."""
        if self._ended:
            return
        self._ended = True
        marks, factor = self._marks, self._factor
        if self.clock is not None:
            marks.compute_event = self.clock.mark(now_ns())
            marks.host_compute_ns = now_ns()
            if self._pace_s <= 0 and factor == 1.0:
                return  # nothing needs the compute time now: read it when the event has happened
            marks.compute_event.synchronize()  # this iteration's compute, not the device
            self.compute_waits += 1
            marks.t_start_ns = max(marks.host_start_ns,
                                   self.clock.host_ns(marks.start_event, self._anchor))
        else:
            marks.t_start_ns = marks.host_start_ns
        compute_s = (now_ns() - marks.t_start_ns) / 1e9
        if compute_s < self._pace_s:
            time.sleep(self._pace_s - compute_s)
            compute_s = self._pace_s
        # A factor k turns compute c into k * c (Injector.delay_s).
        slowdown_s = (factor - 1.0) * compute_s
        if slowdown_s > 0:
            time.sleep(slowdown_s)
        marks.compute_s, marks.slowdown_s = compute_s, slowdown_s
        #: When communication may start; the slowdown is what lies between compute and this.
        marks.host_sync_ns = now_ns()

    def micro_batch_begin(self) -> tuple[int, object]:
        """A micro-batch of the algorithm's own compute begins: the host's clock, and on CUDA
        an event on the stream (the micro-batch may queue behind earlier work)."""
        host_ns = now_ns()
        return host_ns, None if self.clock is None else self.clock.mark(host_ns)

    def micro_batch(self, begun: tuple[int, object], share: float) -> None:
        """One micro-batch of an algorithm's own compute, `begun` by micro_batch_begin, `share`
        of a batch, has been queued or computed: pad it to that share of the pace floor, then
        sleep its slowdown ((k - 1) x its padded compute)."""
        host_ns, start_event = begun
        if self.clock is not None:
            end_event = self.clock.mark(now_ns())
            if self._pace_s <= 0 and self._factor == 1.0:
                self._unread = end_event  # nothing needs its time now
                return
            end_event.synchronize()  # its own compute, not the device
            host_ns = max(host_ns, self.clock.host_ns(start_event, self._anchor))
        compute_s = (now_ns() - host_ns) / 1e9
        floor_s = self._pace_s * share
        if compute_s < floor_s:
            time.sleep(floor_s - compute_s)
            compute_s = floor_s
        slowdown_s = (self._factor - 1.0) * compute_s
        if slowdown_s > 0:
            time.sleep(slowdown_s)
        self._micro_slowdown_s += slowdown_s

    def wait_micro_batches(self) -> None:
        """The algorithm reads its clock: on CUDA, wait for the micro-batches queued so far."""
        if self._unread is not None:
            self._unread.synchronize()
            self._unread = None

    def end_micro_batches(self) -> None:
        """The algorithm's own compute is over: the iteration's compute ends now. What lay
        between its micro-batches (its own decisions, drawing samples) counts as compute."""
        self._ended = True
        marks = self._marks
        if self._unread is not None:  # queued, never waited for: placed by events later
            self._unread = None
            marks.compute_event = self.clock.mark(now_ns())
            marks.host_compute_ns = now_ns()
            return
        marks.t_start_ns = marks.host_start_ns
        if self.clock is not None:  # waited for: every event so far has happened
            marks.t_start_ns = max(marks.host_start_ns,
                                   self.clock.host_ns(marks.start_event, self._anchor))
            self.compute_waits += 1
        marks.host_sync_ns = now_ns()
        marks.slowdown_s = self._micro_slowdown_s
        marks.compute_s = (marks.host_sync_ns - marks.t_start_ns) / 1e9 - marks.slowdown_s

    def step_done(self) -> PendingTimes:
        """The step returned: this iteration's times, to resolve once the device is there."""
        marks, self._marks = self._marks, None
        marks.host_end_ns = now_ns()
        if self.clock is not None:
            marks.end_event = self.clock.mark(marks.host_end_ns)
        return PendingTimes(marks, self.clock, self._anchor)


class PendingTimes:
    """An iteration's IterationTimes, ready() once the device has passed its step's end."""

    def __init__(self, marks: _Marks, clock: CudaClock | None, anchor):
        self._marks, self._clock, self._anchor = marks, clock, anchor
        self._times: IterationTimes | None = None

    def ready(self) -> bool:
        return self._times is not None or self._clock is None or self._marks.end_event.query()

    def resolve(self) -> IterationTimes:
        """The times (waits for the step's end event if it has not happened yet)."""
        if self._times is None:
            self._times = self._resolve()
        return self._times

    def _resolve(self) -> IterationTimes:
        m = self._marks
        if self._clock is None:
            return IterationTimes(m.t_start_ns, m.host_sync_ns, m.host_end_ns, m.compute_s,
                                  m.slowdown_s)
        m.end_event.synchronize()
        on_host = lambda event: self._clock.host_ns(event, self._anchor)  # noqa: E731
        if m.compute_s is None:  # nothing waited: compute ends where the stream finished it
            t_start = max(m.host_start_ns, on_host(m.start_event))
            t_sync = max(m.host_compute_ns, on_host(m.compute_event), t_start)
            compute_s = (t_sync - t_start) / 1e9
        else:
            t_start, t_sync, compute_s = m.t_start_ns, m.host_sync_ns, m.compute_s
        t_end = max(m.host_end_ns, on_host(m.end_event), t_sync)
        return IterationTimes(t_start, t_sync, t_end, compute_s, m.slowdown_s)
