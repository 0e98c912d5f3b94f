"""The event line of each step, written once its times are known, in batches.

On CPU a step's times are known when it returns. On CUDA they are events the device reaches
later (compute_end.py), and so is the loss: a line waits in order until the device has passed
its step, usually one iteration, so that the worker loop never stalls the GPU's queue to read a
clock. A line is written whole, in order, and none is lost: the loop writes what is left when
training ends, and when it fails.

Lines are written in batches, one write(2) each: once the oldest line has waited FLUSH_S, or
BATCH_LINES are waiting. Encoding and writing each line as its step ended cost ~90 us of a
~1.1 ms iteration of mlp-digits on 2 ranks (thread CPU; a syscall and JSON encoding with cold
caches each iteration), and made the harness measurably slower than a plain loop (issue 44).
A batch is encoded (~10-20 us a line in the loop) between one step's end and the next one's
start, outside every step's times. A loop stuck in a step (a
hung peer, a long wait) does not hold its lines back: a thread writes those waiting longer
than STUCK_S, so what a launcher reads of a stalled run (the ranks' last iterations) is at
most that old. A rank killed outright (SIGKILL) loses at most its last FLUSH_S of lines.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

import torch

from hetbench.comm.comm import StepRecord
from hetbench.core.algorithm import StepInfo
from hetbench.core.config import RunConfig
from hetbench.core.record import logged_peer_ranks, step_event
from hetbench.core.store import EventLog
from hetbench.harness.compute_end import PendingTimes


def peer_ranks_of(info: StepInfo, met: set[int], rank: int, workers: int) -> list[int] | None:
    """The ranks a step met, as the step says (StepInfo.peer_ranks) or else as Comm recorded
    them (`met`), as the event line holds them (core.record.logged_peer_ranks: none for a
    step that met every other worker, which the reports read from its peers)."""
    return logged_peer_ranks(info.peer_ranks if info.peer_ranks is not None else met, rank,
                             workers)


def cluster_fields(fields: dict[str, Any], dilation: float) -> dict[str, Any]:
    """An algorithm's own event fields, its `*_s` seconds (host time) in cluster time."""
    if dilation == 1.0:
        return fields
    return {key: value / dilation if key.endswith("_s") and isinstance(value, float | int)
            and not isinstance(value, bool) else value for key, value in fields.items()}


def loss_for_line(loss: torch.Tensor) -> torch.Tensor:
    """The step's loss, for its event line: on CUDA a copy to pinned host memory queued on the
    stream now, before the step's end event, so that once the line is ready (the device passed
    that event) reading it waits for nothing. `.item()` of the CUDA tensor would synchronize
    the whole stream: the next iteration's work already queued behind the step included."""
    loss = loss.detach()
    if loss.device.type != "cuda":
        return loss
    host = torch.empty_like(loss, device="cpu", pin_memory=True)
    return host.copy_(loss, non_blocking=True)


class StepLines:
    """A worker's steps waiting for their times, written to its event log in order, in batches.
    close() writes what is left and stops the thread that writes for a stuck loop."""

    #: Seconds the oldest waiting line may wait before the loop writes the batch.
    FLUSH_S = 0.2
    #: Lines that make a batch however young they are (bounds the memory they hold).
    BATCH_LINES = 1024
    #: Seconds after which the writer thread writes lines the loop has not (the loop is stuck).
    STUCK_S = 2 * FLUSH_S

    def __init__(self, config: RunConfig, rank: int, log: EventLog, t0_ns: int,
                 batch_size: int):
        self._config, self._rank, self._log, self._t0_ns = config, rank, log, t0_ns
        self._batch_size = batch_size
        # A network model's dilation: modeled times last `dilation` times longer on this
        # host, and every time recorded is cluster time, the host's divided by it, from t0.
        self._dilation = config.dilation
        self._waiting: deque[tuple] = deque()
        #: time.monotonic() when the oldest waiting line was added (None: none waits).
        self._oldest_s: float | None = None
        # The loop and the writer thread take turns: one writes at a time, lines in order.
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._writer = threading.Thread(target=self._write_when_stuck, daemon=True,
                                        name=f"step-lines-{rank}")
        self._writer.start()

    def cluster_ns(self, host_ns: int) -> int:
        if self._dilation == 1.0:
            return host_ns
        return self._t0_ns + round((host_ns - self._t0_ns) / self._dilation)

    def ended_s(self, times: PendingTimes):
        """When the step ended, in seconds from t0 (cluster time), once it is known: a call."""
        return lambda: (self.cluster_ns(times.resolve().t_end_ns) - self._t0_ns) / 1e9

    def add(self, times: PendingTimes, iteration: int, loss: torch.Tensor | None,
            info: StepInfo, did: StepRecord, process_cpu_s: float, snapshot_s: float) -> None:
        with self._lock:
            if self._oldest_s is None:
                self._oldest_s = time.monotonic()
            self._waiting.append((times, iteration, loss, info, did, process_cpu_s, snapshot_s))

    def write_ready(self) -> None:
        """The loop's call after each step: write the lines whose times the device has reached,
        in order, once they make a batch."""
        oldest_s = self._oldest_s
        if oldest_s is None or (len(self._waiting) < self.BATCH_LINES
                                and time.monotonic() - oldest_s < self.FLUSH_S):
            return
        with self._lock:
            self._write_ready()

    def close(self) -> None:
        """Stop the writer thread and write every line left (waiting for the device where it
        must): the end of training, and its failure."""
        self._closed.set()
        self._writer.join()
        with self._lock:
            self._write_lines(len(self._waiting))

    def _write_when_stuck(self) -> None:
        while not self._closed.wait(self.FLUSH_S):
            oldest_s = self._oldest_s
            if oldest_s is not None and time.monotonic() - oldest_s >= self.STUCK_S:
                try:
                    with self._lock:
                        self._write_ready()
                except Exception:  # a failed write: the loop's next one raises it, as the cause
                    return

    def _write_ready(self) -> None:
        ready = 0
        for pending in self._waiting:
            if not pending[0].ready():
                break
            ready += 1
        self._write_lines(ready)

    def _write_lines(self, count: int) -> None:
        """Write the first `count` waiting lines, in one write."""
        if count == 0:
            return
        lines = [self._event(*self._waiting.popleft()) for _ in range(count)]
        self._oldest_s = time.monotonic() if self._waiting else None
        self._log.append_many(lines)

    def _event(self, pending: PendingTimes, iteration: int, loss, info: StepInfo,
               did: StepRecord, process_cpu_s: float, snapshot_s: float) -> dict[str, Any]:
        config, dilation = self._config, self._dilation
        times = pending.resolve()
        t_start, t_sync, t_end = (self.cluster_ns(t) for t in
                                  (times.t_start_ns, times.t_sync_ns, times.t_end_ns))
        compute_s = times.compute_s / dilation
        step_s = (t_end - t_sync) / 1e9
        # The algorithm's own measure of its waiting, else the seconds its point-to-point
        # operations blocked (Comm's record; collectives' waits are inferred in reports).
        waited_s = did.blocked_s if info.wait_s is None else info.wait_s
        wait_s = min(waited_s / dilation, step_s)
        return step_event(
            config.run_id, self._rank, iteration, t_start, t_end, compute_s,
            (t_sync - t_start) / 1e9 - compute_s, step_s - wait_s, wait_s,
            self._batch_size if info.samples is None else info.samples,
            loss=float("nan") if loss is None else loss.item(), snapshot_s=snapshot_s,
            measured={"process_cpu_s": process_cpu_s}, peers=info.peers,
            staleness=info.staleness,
            peer_ranks=peer_ranks_of(info, did.met, self._rank, config.workers),
            discarded=info.discarded,
            waited_on=info.waited_on and {r: s / dilation for r, s in info.waited_on.items()},
            fields=cluster_fields(info.fields, dilation))
