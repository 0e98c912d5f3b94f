"""The smart Group Generator's decisions: pure code, no gRPC, no processes (service.py serves it).

State: c_w, the number of requests of each worker; one FIFO Group Buffer per worker; the set of
workers that are done. On a request from worker i (c_i counted first):
  - if i's buffer holds a group, i gets the first one;
  - otherwise a new group is generated for i from the eligible workers: i itself, and every
    other worker w that is not done, passes the threshold rule c_w > c_i - delta_c (a straggler
    is left out until it catches up), and, without `group_buffer`, has an empty buffer;
  - with `group_division`, one request partitions all eligible workers into disjoint random
    groups of `group_size` at once (a trailing single worker is left for its own request);
    without it, only i's group is drawn (i plus group_size - 1 random eligible workers).
New groups are appended to every member's buffer. Groups get increasing ids and each buffer is in
id order, so every worker runs its groups in one global order: no two workers can wait on each
other in a cycle, i.e. groups never conflict, however they overlap across generations.
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
                 group_division: bool = True, group_buffer: bool = True, seed: int = 0):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if not 2 <= group_size <= workers:
            raise ValueError(f"group_size must be in 2..{workers}, got {group_size}")
        if delta_c is not None and delta_c < 1:
            raise ValueError(f"delta_c must be >= 1, got {delta_c}")
        self.workers = workers
        self.group_size = group_size
        self.delta_c = delta_c
        self.group_division = group_division
        self.group_buffer = group_buffer
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

    def eligible(self, requester: int) -> list[int]:
        """Workers that may join a group generated for `requester` (itself excluded)."""
        c_i = self.counts[requester]
        return [
            w for w in range(self.workers)
            if w != requester and w not in self.done
            and (self.delta_c is None or self.counts[w] > c_i - self.delta_c)
            and (self.group_buffer or not self.buffers[w])
        ]

    def _generate(self, requester: int) -> None:
        others = self.eligible(requester)
        self._rng.shuffle(others)
        k = self.group_size - 1
        self._add((requester, *others[:k]))
        if self.group_division:
            rest = others[k:]
            for start in range(0, len(rest), self.group_size):
                chunk = rest[start:start + self.group_size]
                if len(chunk) > 1:
                    self._add(tuple(chunk))

    def _add(self, members: tuple[int, ...]) -> None:
        group = Group(self.generated, tuple(sorted(members)))
        self.generated += 1
        for w in group.members:
            self.buffers[w].append(group)
