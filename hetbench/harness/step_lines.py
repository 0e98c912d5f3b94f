"""The event line of each step, written once its times are known.

On CPU a step's times are known when it returns, and its line is written at once. On CUDA they
are events the device reaches later (compute_end.py), and so is the loss: the line waits in
order until the device has passed the step, usually one iteration, so that the worker loop never
stalls the GPU's queue to read a clock. A line is written whole, in order, and none is lost:
the loop writes what is left when training ends, and when it fails.
"""

from __future__ import annotations

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
    """A worker's steps waiting for their times, written to its event log in order."""

    def __init__(self, config: RunConfig, rank: int, log: EventLog, t0_ns: int,
                 batch_size: int):
        self._config, self._rank, self._log, self._t0_ns = config, rank, log, t0_ns
        self._batch_size = batch_size
        # A network model's dilation: modeled times last `dilation` times longer on this
        # host, and every time recorded is cluster time, the host's divided by it, from t0.
        self._dilation = config.dilation
        self._waiting: deque[tuple] = deque()

    def cluster_ns(self, host_ns: int) -> int:
        if self._dilation == 1.0:
            return host_ns
        return self._t0_ns + round((host_ns - self._t0_ns) / self._dilation)

    def ended_s(self, times: PendingTimes):
        """When the step ended, in seconds from t0 (cluster time), once it is known: a call."""
        return lambda: (self.cluster_ns(times.resolve().t_end_ns) - self._t0_ns) / 1e9

    def add(self, times: PendingTimes, iteration: int, loss: torch.Tensor | None,
            info: StepInfo, did: StepRecord, process_cpu_s: float, snapshot_s: float) -> None:
        self._waiting.append((times, iteration, loss, info, did, process_cpu_s, snapshot_s))

    def write_ready(self) -> None:
        """Write the lines whose times the device has reached, in order."""
        while self._waiting and self._waiting[0][0].ready():
            self._write(*self._waiting.popleft())

    def write_all(self) -> None:
        """Write every line left (waiting for the device where it must)."""
        while self._waiting:
            self._write(*self._waiting.popleft())

    def _write(self, pending: PendingTimes, iteration: int, loss, info: StepInfo,
               did: StepRecord, process_cpu_s: float, snapshot_s: float) -> None:
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
        self._log.append(step_event(
            config.run_id, self._rank, iteration, t_start, t_end, compute_s,
            (t_sync - t_start) / 1e9 - compute_s, step_s - wait_s, wait_s, self._batch_size,
            loss=float("nan") if loss is None else loss.item(), snapshot_s=snapshot_s,
            measured={"process_cpu_s": process_cpu_s}, peers=info.peers,
            staleness=info.staleness,
            peer_ranks=peer_ranks_of(info, did.met, self._rank, config.workers),
            discarded=info.discarded,
            waited_on=info.waited_on and {r: s / dilation for r, s in info.waited_on.items()},
            fields=cluster_fields(info.fields, dilation)))
