"""bench sim's clock (sim/clock.py): callbacks in time order, ties in the order scheduled."""

from hetbench.sim.clock import Clock


def test_callbacks_run_in_time_order_and_ties_in_the_order_scheduled():
    clock, ran = Clock(), []

    def note(name):
        ran.append((clock.now, name))

    def schedules_more(name):
        note(name)
        clock.at(clock.now, note, f"{name}+now")  # the same instant: after what is queued
        clock.at(clock.now + 1.0, note, f"{name}+1")

    clock.at(2.0, note, "b")
    clock.at(1.0, schedules_more, "a")
    clock.at(2.0, note, "c")
    clock.at(1.0, note, "a2")
    clock.drain()
    assert ran == [(1.0, "a"), (1.0, "a2"), (1.0, "a+now"), (2.0, "b"), (2.0, "c"),
                   (2.0, "a+1")]
    assert clock.now == 2.0


def test_before_is_called_once_per_distinct_time_ahead_of_its_callbacks():
    clock, seen = Clock(), []
    for t in (3.0, 1.0, 3.0, 2.0):
        clock.at(t, lambda: seen.append(("event", clock.now)))
    clock.drain(before=lambda t: seen.append(("before", t, clock.now)))
    assert seen == [("before", 1.0, 1.0), ("event", 1.0), ("before", 2.0, 2.0), ("event", 2.0),
                    ("before", 3.0, 3.0), ("event", 3.0), ("event", 3.0)]
