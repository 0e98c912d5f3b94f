"""Hop's decision rules as pure functions (shared by hop.py and the simulator)."""

from collections import deque

from hetbench.algorithms.hop import (
    Entry,
    drop_before,
    newest_usable,
    skip_target,
    tokens_ready,
    updates_ready,
)


def queues(**spans):
    return {int(j[1:]): deque(Entry(lo, hi) for lo, hi in s) for j, s in spans.items()}


def test_newest_usable_respects_the_staleness_window():
    q = deque([Entry(3, 3), Entry(4, 4), Entry(6, 6)])
    assert newest_usable(q, 5, staleness=0) is None  # 6 is from the future, 4 too stale
    assert newest_usable(q, 5, staleness=1).hi == 4
    assert newest_usable(q, 6, staleness=2).hi == 6
    # A SKIP entry stands for every iteration it covers.
    assert newest_usable(deque([Entry(2, 7)]), 5, staleness=0).hi == 7


def test_backup_workers_are_not_waited_for_but_finished_neighbours_never_block():
    q = queues(n1=[(5, 5)], n2=[(5, 5)], n3=[])
    assert not updates_ready(q, set(), 5, backup_workers=0, staleness=0)
    assert updates_ready(q, set(), 5, backup_workers=1, staleness=0)
    # n3 finished: it will never send, so waiting for all three would never end.
    assert updates_ready(q, {3}, 5, backup_workers=0, staleness=0)
    assert not updates_ready(queues(n1=[(5, 5)], n2=[], n3=[]), set(), 5,
                             backup_workers=1, staleness=0)


def test_tokens_bound_the_iteration_gap_to_running_neighbours():
    entered = {1: 2, 2: 6}
    assert tokens_ready(entered, set(), 6, max_iteration_gap=4)
    assert not tokens_ready(entered, set(), 7, max_iteration_gap=4)
    assert tokens_ready(entered, {1}, 9, max_iteration_gap=4)


def test_skip_jumps_to_the_furthest_neighbour_within_the_gap_of_the_slowest():
    assert skip_target({1: 6, 2: 5}, set(), 4, skip_threshold=2, max_iteration_gap=4) is None
    assert skip_target({1: 8, 2: 5}, set(), 4, skip_threshold=2, max_iteration_gap=4) == 8
    # Neighbour 2 is at 3: jumping past 3 + gap would break its token bound.
    assert skip_target({1: 12, 2: 3}, set(), 4, skip_threshold=2, max_iteration_gap=4) == 7
    # ...unless it finished.
    assert skip_target({1: 12, 2: 3}, {2}, 4, skip_threshold=2, max_iteration_gap=4) == 12


def test_drop_before_keeps_only_what_a_later_iteration_can_use():
    q = queues(n1=[(1, 1), (2, 2), (3, 5)], n2=[(4, 4)])
    drop_before(q, 4, staleness=1)
    assert [(e.lo, e.hi) for e in q[1]] == [(3, 5)]
    assert [(e.lo, e.hi) for e in q[2]] == [(4, 4)]
