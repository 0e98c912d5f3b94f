"""Throughput and time accounting from event logs: pure functions of the records."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np


def throughput_window(events_by_rank: dict[int, list[dict[str, Any]]],
                      warmup_iterations: int) -> tuple[int, int] | None:
    """The steady-state window [t0, t1] (ns) in which every worker was past warm-up and running.

    t0 = the latest end of any worker's warm-up; t1 = the earliest end of any worker's last
    iteration. Asynchronous algorithms let fast workers finish early; counting only while all
    run keeps one lucky worker from inflating (or idling workers from deflating) the rate.
    """
    starts, ends = [], []
    for events in events_by_rank.values():
        if len(events) <= warmup_iterations:
            return None
        starts.append(events[warmup_iterations - 1]["t_end"] if warmup_iterations else
                      events[0]["t_start"])
        ends.append(events[-1]["t_end"])
    t0, t1 = max(starts), min(ends)
    return (t0, t1) if t1 > t0 else None


def throughput(events_by_rank: dict[int, list[dict[str, Any]]], warmup_iterations: int) -> float:
    """Samples processed by all workers per second inside the steady-state window, from event
    logs: throughput_of_columns over each worker's events."""
    ranks = list(events_by_rank.values())
    return throughput_of_columns([[e["t_start"] for e in events] for events in ranks],
                                 [[e["t_end"] for e in events] for events in ranks],
                                 [[e["samples"] for e in events] for events in ranks],
                                 warmup_iterations)


def throughput_of_columns(starts: Sequence, ends: Sequence, samples: Sequence,
                          warmup_iterations: int) -> float:
    """Samples processed by all workers per second inside the steady-state window (see
    throughput_window), from each worker's columns of step starts and ends (ns) and samples:
    the one implementation real runs (their event logs) and simulated ones (the columns the
    simulator keeps, millions of steps at scale) share.

    An iteration counts in proportion to its overlap with the window, so the rate does not jump
    with where iteration boundaries fall. Without a common window (an asynchronous run whose
    fastest worker finished before the slowest one left warm-up) it is the sum of each worker's
    own post-warm-up rate; 0 only if some worker never got past warm-up. The sum runs term by
    term in Python's arithmetic (exact integer products, one rounding per division, a running
    sum in worker and step order), so every caller gets the same float.
    """
    warmup = warmup_iterations
    if any(len(s) <= warmup for s in starts):
        return 0.0
    first = [(e[warmup - 1] if warmup else s[0]) for s, e in zip(starts, ends, strict=True)]
    t0, t1 = max(first), min(e[-1] for e in ends)
    if t1 <= t0:
        return _sum_of_own_rates(starts, ends, samples, warmup)
    total = 0.0
    for s, e, n in zip(starts, ends, samples, strict=True):
        a = np.asarray(s, dtype=np.int64)
        b = np.asarray(e, dtype=np.int64)
        overlap = np.minimum(b, t1) - np.maximum(a, t0)
        keep = overlap > 0
        if not keep.any():
            continue
        for samples_e, over, span in zip(np.asarray(n)[keep].tolist(), overlap[keep].tolist(),
                                         (b - a)[keep].tolist(), strict=True):
            total += samples_e * over / span
    return total / ((t1 - t0) / 1e9)


def _sum_of_own_rates(starts: Sequence, ends: Sequence, samples: Sequence, warmup: int) -> float:
    total = 0.0
    for s, e, n in zip(starts, ends, samples, strict=True):
        t0 = int(e[warmup - 1]) if warmup else int(s[0])
        span_ns = int(e[-1]) - t0
        if span_ns <= 0:
            return 0.0
        total += sum(np.asarray(n)[warmup:].tolist()) / (span_ns / 1e9)
    return total


#: The seconds of a step that a summary totals: compute, injected slowdown, communication and
#: waiting (real runs from their events, time_breakdown; simulated ones from the sink's arrays).
TIME_KEYS = ("compute_s", "slowdown_s", "comm_s", "wait_s")


def time_breakdown(events: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Total seconds of compute, injected slowdown, communication and waiting."""
    totals = dict.fromkeys(TIME_KEYS, 0.0)
    for e in events:
        for key in totals:
            totals[key] += e.get(key, 0.0)
    return totals


def sync_health(events: Iterable[dict[str, Any]]) -> dict[str, float | None]:
    """How much the workers synchronized, from the events' standard fields (StepInfo.peers and
    .staleness): the share of iterations that averaged with at least one peer, the mean group
    size (the worker plus the peers it mixed in), and the mean staleness of what was mixed in.
    None where no event says (an algorithm that does not report peers)."""
    tally = SyncTally()
    for e in events:
        tally.add(e.get("peers"), e.get("staleness"))
    return tally.health()


class SyncTally:
    """sync_health's sums, one step at a time (the simulator adds its steps as it plays them)."""

    def __init__(self):
        self.steps = self.synced = self.peers_total = 0
        self.stale_total, self.stale_count = 0.0, 0

    def add(self, peers: int | None, staleness: float | None) -> None:
        if peers is None:
            return
        self.steps += 1
        self.peers_total += peers
        if peers > 0:
            self.synced += 1
            if staleness is not None:
                self.stale_total += staleness
                self.stale_count += 1

    def add_all(self, peers, staleness: float | None) -> None:
        """add(p, staleness) for every p of the integer array `peers`, in order."""
        self.steps += len(peers)
        self.peers_total += int(peers.sum())
        synced = int((peers > 0).sum())
        self.synced += synced
        if staleness is not None and synced:
            self.stale_count += synced
            if staleness != 0.0:  # a running sum in order, as add() keeps it
                for _ in range(synced):
                    self.stale_total += staleness

    def health(self) -> dict[str, float | None]:
        steps = self.steps
        return {
            "sync_share": self.synced / steps if steps else None,
            "mean_group_size": 1 + self.peers_total / steps if steps else None,
            "mean_staleness": self.stale_total / self.stale_count if self.stale_count else None,
        }
