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

The threshold rule (Prague, ASPLOS'20: w joins requester i's group only if c_w > c_i - delta_c)
comes in two forms. `threshold_rule = "requester"` (the default) is the paper's: a group division
made on i's request leaves out every worker at least delta_c requests behind i; workers ahead of
i are never left out. `"pairwise"` (hetbench's variant) applies the rule to every pair of members
of every generated group, |c_w - c_v| < delta_c, since with the Group Buffer each member of a
group later receives it as the answer to its own request. Pairwise keeps a transiently slowed
worker out of full groups, but it also separates workers that merely drifted apart: a worker left
alone steps faster, drifts further, and is never grouped again (measured in real 4-worker runs
without any slowdown: 66-78% of iterations alone with delta_c 2), so it is not the default.

delta_c must exceed the gap that Group Division itself creates. Divisions are made one at a time
and every worker runs one group of each: when the first worker of a division asks for the next
one (its count just went up), a worker still in the previous division's P-Reduce has not yet
asked for the current one, so it is 2 requests behind without being slow at all. With delta_c 2
such a worker counted as a straggler, was left out, and the requester ran alone; delta_c 4 (the
default) leaves a margin of two requests above that gap.

The buffer limit bounds how many peers a worker that has fallen behind can hold up: each queued
group commits group_size - 1 others to wait for it. Unbounded, a worker that stalled collects a
group from every division made meanwhile, and (while everyone waits for it) the counts stay
within delta_c of each other, so the threshold rule never separates it.

arrival_order (hetbench's addition, off by default; the paper draws groups uniformly at
random): a group is committed while most of its members are still computing, and every member
then waits for the last one, so random groups of workers at random points of their steps wait
about half a step each. With request times, the generator knows when each worker took its
current group and when that group was complete (its last member asked), hence when each worker
should ask next: that completion plus the median "work" time (completion to next request:
P-Reduce plus compute). The requester gets the partners expected soonest, and the division
groups workers expected at about the same time. A worker more than one work time past its
expected time (slowed, most likely), or waiting in a group with one, is late: it is never grouped
with workers on time (they would wait for it), only with other late ones; a requester with
nobody but late workers eligible runs alone. Expected times are coarsened to quarters of a work
time and ties keep the random shuffle's order, so groups keep mixing (strict ordering pinned the
same pairs forever). Group Division, the Group Buffer's global order and the threshold rule are
unchanged: groups still never conflict.
"""

from __future__ import annotations

import random
from collections import deque
from typing import NamedTuple


def _median(samples) -> float:
    """Median of a few numbers (0 for none); statistics.median's checks cost more than this."""
    ordered = sorted(samples)
    n = len(ordered)
    if n == 0:
        return 0.0
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


#: arrival_order: a worker more than this many of its work times past its expected request is
#: late (slowed, most likely). A smaller bound catches workers that are merely jittered and
#: leaves their requesters alone in runs without any slowdown; a 5x slowdown is four work
#: times late, so one work time still catches it.
LATE_AFTER = 1.0

#: "requester": the paper's c_w > c_i - delta_c; "pairwise": every pair within delta_c.
THRESHOLD_RULES = ("requester", "pairwise")


class Group(NamedTuple):
    """One P-Reduce: its place in the global order and its sorted members. (A named tuple:
    made once per group, a quarter of a million times in 30 iterations of a 16,384-worker
    simulation, where _add, which made a frozen dataclass, took a tenth of the profiled time.)"""

    id: int
    members: tuple[int, ...]


class GroupGenerator:
    """Smart (or, with delta_c=None and no division, plain random) group generation."""

    def __init__(self, workers: int, group_size: int, *, delta_c: int | None = 2,
                 group_division: bool = True, group_buffer: bool = True,
                 buffer_limit: int | None = None, arrival_order: bool = False,
                 threshold_rule: str = "requester", seed: int = 0):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if not 2 <= group_size <= workers:
            raise ValueError(f"group_size must be in 2..{workers}, got {group_size}")
        if delta_c is not None and delta_c < 1:
            raise ValueError(f"delta_c must be >= 1, got {delta_c}")
        if threshold_rule not in THRESHOLD_RULES:
            raise ValueError(f"threshold_rule must be one of {', '.join(THRESHOLD_RULES)}, "
                             f"got {threshold_rule!r}")
        if buffer_limit is not None and buffer_limit < 1:
            raise ValueError(f"buffer_limit must be >= 1 (or None: unbounded), got {buffer_limit}")
        self.workers = workers
        self.group_size = group_size
        self.delta_c = delta_c
        self.group_division = group_division
        self.arrival_order = arrival_order
        self.pairwise = threshold_rule == "pairwise"
        self.group_buffer = group_buffer
        #: Most groups a worker's buffer may hold (a new group needs room in every member's).
        self.buffer_limit = (1 if not group_buffer else
                             buffer_limit if buffer_limit is not None else float("inf"))
        self.counts = [0] * workers
        self.buffers: list[deque[Group]] = [deque() for _ in range(workers)]
        self.done: set[int] = set()
        self.generated = 0
        self._rng = random.Random(seed)
        # arrival_order's timing, kept only under arrival_order when requests come with a time
        # (nothing else reads it: keeping it cost every request about a tenth of a simulated
        # prague-smart step): the group each worker last took, each open group and who has
        # taken it when, when each group was complete (its last member asked), and the latest
        # "work" samples (from a group's completion to a member's next request: the P-Reduce
        # plus the next step's compute).
        self._now: float | None = None
        self._current: list[int | None] = [None] * workers
        self._open: dict[int, tuple[Group, dict[int, float]]] = {}
        self._completed: dict[int, float] = {}
        self._work: list[deque[float]] = [deque(maxlen=8) for _ in range(workers)]
        self._work_all: deque[float] = deque(maxlen=64)  # everybody's latest, for new workers

    def _check(self, worker: int) -> None:
        if not 0 <= worker < self.workers:
            raise ValueError(f"worker {worker} is out of range 0..{self.workers - 1}")

    def request(self, worker: int, now: float | None = None) -> Group | None:
        """The requester's next group; None once it is done and its buffer is drained.
        `now` (seconds on any clock common to all requests) enables arrival_order."""
        self._check(worker)
        self._now = now
        if worker in self.done:
            return self._take(worker) if self.buffers[worker] else None
        self.counts[worker] += 1
        if now is not None and self.arrival_order:
            previous = self._current[worker]
            if previous in self._completed:
                work = now - self._completed[previous]
                self._work[worker].append(work)
                self._work_all.append(work)
        if not self.buffers[worker]:
            self._generate(worker)
        return self._take(worker)

    def _take(self, worker: int) -> Group:
        """Pop the worker's next group, noting (with a time) when each member took it."""
        group = self.buffers[worker].popleft()
        if self._now is None or not self.arrival_order:
            return group
        self._current[worker] = group.id
        entry = self._open.get(group.id)
        if entry is None:
            entry = self._open[group.id] = (group, {})
        taken = entry[1]
        taken[worker] = self._now
        if len(taken) == len(group.members):
            self._completed[group.id] = max(taken.values())
            del self._open[group.id]
            if len(self._completed) > 4 * self.workers:  # keep what some worker still refers to
                live = set(self._current)
                self._completed = {g: t for g, t in self._completed.items() if g in live}
        return group

    def finish(self, worker: int) -> int:
        """The worker spent its budget: no new groups for it. Returns its queued groups."""
        self._check(worker)
        self.done.add(worker)
        return len(self.buffers[worker])

    def close(self, w: int, v: int) -> bool:
        """The pairwise threshold rule between two workers (either may be the requester)."""
        return self._within_threshold(*sorted((self.counts[w], self.counts[v])))

    def not_behind(self, w: int, requester: int) -> bool:
        """The paper's threshold rule: c_w > c_requester - delta_c."""
        return self.delta_c is None or self.counts[w] > self.counts[requester] - self.delta_c

    def _within_threshold(self, lowest: int, highest: int) -> bool:
        """The threshold rule over a set of workers, from their lowest and highest counts: it
        holds between every pair iff it holds between those two."""
        return self.delta_c is None or highest - lowest < self.delta_c

    def eligible(self, requester: int) -> list[int]:
        """Workers that may join a group generated for `requester` (itself excluded)."""
        rule = self.close if self.pairwise else self.not_behind
        return [
            w for w in range(self.workers)
            if w != requester and w not in self.done
            and len(self.buffers[w]) < self.buffer_limit and rule(w, requester)
        ]

    def work_time(self, worker: int | None = None) -> float:
        """Median time from a group's completion to a member's next request (P-Reduce plus the
        next step): the worker's own over its last 8 steps, or everybody's last 64; 0 when
        unknown."""
        samples = (self._work[worker] if worker is not None and self._work[worker]
                   else self._work_all)
        return _median(samples)

    def expected_arrivals(self, now: float, workers=None) -> dict[int, float]:
        """When each worker (of `workers`, default all) should next ask, seen at time `now`
        (arrival_order; needs request times): when the group it took last is complete (its
        last member asks; predicted the same way for members still to ask) plus its work time.
        +inf for a worker that is late (expected more than LATE_AFTER work times before now:
        slowed, most likely) or whose group waits on a late one."""
        memo: dict[int, float] = {}

        def completion(group_id: int) -> float:
            if group_id in self._completed:
                return self._completed[group_id]
            group, taken = self._open[group_id]
            # A member that has not taken the group is still in an earlier one (buffers are in
            # id order), so the recursion runs down the ids and ends.
            return max(taken[m] if m in taken else arrival(m) for m in group.members)

        def arrival(w: int) -> float:
            if w not in memo:
                group_id, work = self._current[w], self.work_time(w)
                expected = now if group_id is None else completion(group_id) + work
                memo[w] = expected if expected >= now - work * LATE_AFTER else float("inf")
            return memo[w]

        return {w: arrival(w) for w in (range(self.workers) if workers is None else workers)}

    def _eligible_for(self, requester: int):
        """eligible()'s test of one worker, as a function."""
        rule = self.close if self.pairwise else self.not_behind
        done, buffers, limit = self.done, self.buffers, self.buffer_limit

        def eligible(w: int) -> bool:
            return (w != requester and w not in done and len(buffers[w]) < limit
                    and rule(w, requester))
        return eligible

    def _draw_group(self, requester: int) -> list[int]:
        """The requester's group without Group Division: what _fill would take from the shuffled
        eligible workers, drawn lazily. Eligible workers come in the order of a uniformly random
        permutation of all workers, built one position at a time (Fisher-Yates, swaps kept in a
        dict), which is a uniformly random order of the eligible ones: the same distribution as
        shuffling them all, in O(group_size) draws instead of O(workers) per request (quadratic
        in prague-random at thousands of workers)."""
        rng, n, size = self._rng, self.workers, self.group_size
        counts, eligible = self.counts, self._eligible_for(requester)
        group = [requester]
        lo = hi = counts[requester]
        swapped: dict[int, int] = {}
        for i in range(n):
            if len(group) == size:
                break
            j = i + rng.randrange(n - i)
            w = swapped.get(j, j)
            swapped[j] = swapped.get(i, i)
            if not eligible(w):
                continue
            c = counts[w]
            c_lo, c_hi = min(lo, c), max(hi, c)
            if not self.pairwise or self._within_threshold(c_lo, c_hi):
                group.append(w)
                lo, hi = c_lo, c_hi
        return group

    def _generate(self, requester: int) -> None:
        if not self.group_division and not (self.arrival_order and self._now is not None):
            self._add(self._draw_group(requester))
            return
        pool = self.eligible(requester)
        self._rng.shuffle(pool)
        fits = fits_with = None
        if self.arrival_order and self._now is not None:
            # Whoever is in a group waits for its last member. So: the requester (here now)
            # gets the partners expected soonest, never a late one (it runs alone if only late
            # ones are eligible; it did so too when nobody was expected within one step, which
            # left homogeneous workers alone for asking at a different moment); the division
            # groups neighbours in expected time, late workers only with late ones. Times are
            # coarsened to quarters of a step, and stable sorts keep the shuffle's order among
            # equals, so that groups keep mixing. (A horizon inside the division too was
            # measured in bench sim: no better, and it leaves workers out of divisions.)
            now, step = self._now, self.work_time()
            when = self.expected_arrivals(now, pool)
            inf = float("inf")
            quarter = step / 4 or 1.0
            pool.sort(key=lambda w: when[w] if when[w] == inf else (when[w] - now) // quarter)

            def fits(w: int) -> bool:  # the requester's partners: never a late one
                return when[w] != inf

            def fits_with(leader: int):  # a division's groups: late only with late
                late = when[leader] == inf
                return lambda w: (when[w] == inf) == late

        # The pool left over is a linked list over `pool` (next_left[i]: the next position
        # still in it), so that taking a group's workers out of it never copies it.
        next_left = list(range(1, len(pool) + 1))
        group = [requester]
        head = self._fill(group, pool, next_left, 0, fits)
        self._add(group)
        if self.group_division:
            self._divide(pool, next_left, head, fits_with)

    def _divide(self, pool: list[int], next_left: list[int], head: int, fits_with=None) -> None:
        """Group Division: what is left of the linked pool from `head` on, in order, into
        groups of up to group_size (a leader and the first later workers that pass the
        threshold rule and `fits_with(leader)`); a leader nobody joins is left out. O(pool): a
        new list per group made a division O(pool^2 / group_size), 0.34 s at 16,384 workers."""
        end = len(pool)
        while head < end:
            leader = pool[head]
            group = [leader]
            head = self._fill(group, pool, next_left, next_left[head],
                              fits_with(leader) if fits_with else None)
            if len(group) > 1:
                self._add(group)

    def _fill(self, group: list[int], pool: list[int], next_left: list[int], i: int,
              fits=None) -> int:
        """Add to `group` the workers of the linked pool from position i on, in its (random)
        order, that pass `fits` and (pairwise rule) the threshold rule with every member so far,
        up to group_size, and unlink them; returns the first position left in the pool from i
        on (len(pool): none). (Under the paper's rule the pool holds only eligible workers.)"""
        # The rule is checked against the group's extreme counts, not every member: this runs
        # for every worker of every division (a hot path of 1024-worker simulations).
        counts, size, pairwise, end = self.counts, self.group_size, self.pairwise, len(pool)
        lo, hi = min(counts[m] for m in group), max(counts[m] for m in group)
        kept = None  # the last position scanned and left in the pool
        first_kept = end
        while i < end and len(group) < size:  # full: the rest is left unscanned
            w = pool[i]
            c = counts[w]
            c_lo, c_hi = (c, hi) if c < lo else (lo, c) if c > hi else (lo, hi)
            if (not pairwise or self._within_threshold(c_lo, c_hi)) and (fits is None or fits(w)):
                group.append(w)
                lo, hi = c_lo, c_hi
                if kept is not None:
                    next_left[kept] = next_left[i]
            else:
                if kept is None:
                    first_kept = i
                kept = i
            i = next_left[i]
        return i if kept is None else first_kept

    def _add(self, members: list[int]) -> None:
        group = Group(self.generated, tuple(sorted(members)))
        self.generated += 1
        for w in group.members:
            self.buffers[w].append(group)
