"""bench sim's clock: simulated time and the callbacks due at each moment, kept the way SimPy's
Environment keeps them. It knows nothing of workers, protocols or networks: the simulated
worker loop (sim/engine.py) and the fair transport (network/transport.py) schedule on it.

Time is simulated seconds from the common start (t = 0), a float that only moves forward.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable


class Clock:
    """The current time (`now`) and the callbacks still to run, in time order."""

    def __init__(self):
        self.now = 0.0
        #: Pending events: the distinct times (a heap) and, per time, its callbacks in the
        #: order they were scheduled (see at()).
        self._times: list[float] = []
        self._at: dict[float, list] = {}

    def at(self, t: float, fn: Callable, *args) -> None:
        """Call fn(*args) at simulated time t (never before now); callbacks of the same time
        run in the order they were scheduled, those scheduled while it runs included.

        The heap holds each distinct time once, its callbacks a list: workers of equal
        compute reach their gradients, messages and meetings at the same instants, so at
        16,384 workers thousands of events share a time, and a heap of (t, seq, ...) tuples
        broke every tie by comparing both fields (its pops were the event path's largest
        single cost)."""
        events = self._at.get(t)
        if events is None:
            self._at[t] = [(fn, args)]
            heapq.heappush(self._times, t)
        else:
            events.append((fn, args))

    def drain(self, before: Callable[[float], None] | None = None) -> None:
        """Run every callback in time order until none is left. `before(t)`, if given, is
        called as the clock moves to t, before t's callbacks (a learned simulation's
        evaluations see the models as they are before that moment)."""
        times, at, pop = self._times, self._at, heapq.heappop
        while times:
            t = pop(times)
            self.now = t
            if before is not None:
                before(t)
            # A list iterator also yields what is appended meanwhile: callbacks that schedule
            # more at this same time.
            for fn, args in at[t]:
                fn(*args)
            del at[t]
