"""The smart Group Generator's decisions: pure code, no gRPC, no processes (service.py serves it).

State: c_w, the number of requests of each worker; one FIFO Group Buffer per worker; the set of
workers that are done. On a request from worker i (c_i counted first):
  - if i's buffer holds a group, i gets the first one;
  - otherwise a new group is generated for i from the eligible workers: every other worker w
    that is not done, has room in its buffer (fewer than `buffer_limit` queued groups; one, i.e.
    an empty buffer, without `group_buffer`) and passes the threshold rule with i;
  - with `group_division`, one request partitions all eligible workers into disjoint random
    groups of up to `group_size` at once (a worker that fits no group is left for its own
    request); without it, only i's group is drawn (i plus up to group_size - 1 random workers).
New groups are appended to every member's buffer. Groups get increasing ids and each buffer is in
id order, so every worker runs its groups in one global order: no two workers can wait on each
other in a cycle, i.e. groups never conflict, however they overlap across generations.

The threshold rule (Prague: w joins requester i's group only if c_w > c_i - delta_c) is applied
to every pair of members of every generated group: |c_w - c_v| < delta_c. Why pairwise: with the
Group Buffer, a group made on i's request is later handed to each of its members as the answer
to *their* request, so each of them is a requester of it. One-sided, the rule kept a straggler s
out of fast requesters' groups but put fast workers into s's own groups and into the divisions
its requests make; a transiently slowed worker then waited in full groups instead of catching up
alone, which is what the rule is for (measured in bench sim and real runs: docs/bench-prague.md).

The buffer limit bounds how many peers a worker that has fallen behind can hold up: each queued
group commits group_size - 1 others to wait for it. Unbounded, a worker that stalled collects a
group from every division made meanwhile, and (while everyone waits for it) the counts stay
within delta_c of each other, so the threshold rule never separates it.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Group:
    """One P-Reduce: its place in the global order and its sorted members."""

    id: int
    members: tuple[int, ...]


class GroupGenerator:
    """Smart (or, with delta_c=None and no division, plain random) group generation."""

    def __init__(self, workers: int, group_size: int, *, delta_c: int | None = 2,
                 group_division: bool = True, group_buffer: bool = True,
                 buffer_limit: int | None = None, seed: int = 0):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if not 2 <= group_size <= workers:
            raise ValueError(f"group_size must be in 2..{workers}, got {group_size}")
        if delta_c is not None and delta_c < 1:
            raise ValueError(f"delta_c must be >= 1, got {delta_c}")
        if buffer_limit is not None and buffer_limit < 1:
            raise ValueError(f"buffer_limit must be >= 1 (or None: unbounded), got {buffer_limit}")
        self.workers = workers
        self.group_size = group_size
        self.delta_c = delta_c
        self.group_division = group_division
        self.group_buffer = group_buffer
        #: Most groups a worker's buffer may hold (a new group needs room in every member's).
        self.buffer_limit = (1 if not group_buffer else
                             buffer_limit if buffer_limit is not None else float("inf"))
        self.counts = [0] * workers
        self.buffers: list[deque[Group]] = [deque() for _ in range(workers)]
        self.done: set[int] = set()
        self.generated = 0
        self._rng = random.Random(seed)

    def _check(self, worker: int) -> None:
        if not 0 <= worker < self.workers:
            raise ValueError(f"worker {worker} is out of range 0..{self.workers - 1}")

    def request(self, worker: int) -> Group | None:
        """The requester's next group; None once it is done and its buffer is drained."""
        self._check(worker)
        if worker in self.done:
            return self.buffers[worker].popleft() if self.buffers[worker] else None
        self.counts[worker] += 1
        if not self.buffers[worker]:
            self._generate(worker)
        return self.buffers[worker].popleft()

    def finish(self, worker: int) -> int:
        """The worker spent its budget: no new groups for it. Returns its queued groups."""
        self._check(worker)
        self.done.add(worker)
        return len(self.buffers[worker])

    def close(self, w: int, v: int) -> bool:
        """The threshold rule between two workers (either may be the requester)."""
        return self.delta_c is None or abs(self.counts[w] - self.counts[v]) < self.delta_c

    def eligible(self, requester: int) -> list[int]:
        """Workers that may join a group generated for `requester` (itself excluded)."""
        return [
            w for w in range(self.workers)
            if w != requester and w not in self.done
            and len(self.buffers[w]) < self.buffer_limit and self.close(w, requester)
        ]

    def _generate(self, requester: int) -> None:
        others = self.eligible(requester)
        self._rng.shuffle(others)
        group, rest = self._fill([requester], others)
        self._add(group)
        if self.group_division:
            while rest:
                group, rest = self._fill([rest[0]], rest[1:])
                if len(group) > 1:
                    self._add(group)

    def _fill(self, group: list[int], pool: list[int]) -> tuple[list[int], list[int]]:
        """Add workers from `pool`, in its (random) order, that pass the threshold rule with
        every member so far, up to group_size; returns the group and the pool left over."""
        rest = []
        for w in pool:
            if len(group) < self.group_size and all(self.close(w, m) for m in group):
                group.append(w)
            else:
                rest.append(w)
        return group, rest

    def _add(self, members: list[int]) -> None:
        group = Group(self.generated, tuple(sorted(members)))
        self.generated += 1
        for w in group.members:
            self.buffers[w].append(group)
