"""The cluster's transport as it is (issue 58): flows that share links max-min fairly, and
messages above an eager threshold that move only once their receiver has posted a receive.

Pure: no clock, no process, no torch. Every time is the caller's (simulated seconds in the
simulator, host seconds in the emulator); the caller asks when the next flow completes, moves
its clock there and handles it. model.py's Ledger (each NIC port reserved first come, first
served for a transfer's whole busy time) is the model this one is to replace.

FlowNetwork, the flow-level model SimGrid uses for TCP (Velho, Schnorr, Casanova and Legrand,
"On the validity of flow-level TCP network models for grid and cloud simulations", ACM TOMACS
23(4), 2013): a message in flight is a fluid flow over the NIC ports it crosses (model.py's
numbering, egress(rank) = 2 rank, ingress(rank) = 2 rank + 1), and at every moment the flows
share each port's bandwidth max-min fairly (no flow can get more without taking from one that
has no more than it), computed by progressive filling. A flow's own rate limit (`cap`: the
inter-node link, a rank's intra-node bandwidth) bounds it besides its ports. What the model
leaves out: TCP's bias toward flows with short round trips (SimGrid's RTT-weighted sharing;
every flow here weighs the same, as every round trip inside one cluster is about the same),
slow start and the congestion window's saw-tooth (a flow is at its fair rate from its first
byte, so short messages are a little optimistic), and latency, which the caller adds (a
message arrives a link latency after its last byte leaves).

Rendezvous, the matching gloo (TCP pairs) and NCCL do: a message of at most `eager_bytes` is
copied into the receiver's buffers as soon as it is sent; a larger one waits until its
receiver has posted a matching receive (rendezvous), so a receiver that posts late delays the
sender's bytes.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

#: A flow's remaining bytes within this share of its size count as none (float round-off of
#: rate x time); a flow whose remainder is that small is complete.
REL_TOLERANCE = 1e-9

#: A pool's service past which its members' targets are rebased to it (see _Pool): float
#: round-off in target - service stays far below REL_TOLERANCE of any message's size.
POOL_REBASE_BYTES = 2.0**30


class _Flow:
    """One flow's state. Progress is kept lazily: `left` bytes at time `at`, moving at `rate`
    since, so that moving the clock costs nothing for flows whose rate does not change."""

    __slots__ = ("at", "bound", "cap", "fid", "left", "nbytes", "pool", "ports", "rate", "seq",
                 "target", "tol", "version")

    def __init__(self, fid: Hashable, seq: int, ports: tuple[int, ...], nbytes: float,
                 t: float, cap: float, bound: float):
        self.fid = fid
        self.seq = seq  # start order: breaks ties, orders every iteration (determinism)
        self.ports = ports
        self.nbytes = nbytes
        self.cap = cap
        self.bound = bound  # its rate alone on its ports: its narrowest port, or its cap
        self.left = nbytes
        self.at = t
        self.rate = -1.0  # not yet computed: any real rate differs, so the first one is set
        self.version = 0  # renewed at every rate change: older completion entries are stale
        self.tol = REL_TOLERANCE * nbytes
        #: The _Pool that keeps this flow's progress (then `left`, `at`, `rate` and `version`
        #: are unused), or None.
        self.pool: _Pool | None = None
        #: In a pool: the pool's service at which this flow is complete.
        self.target = 0.0

    def left_at(self, t: float) -> float:
        """Bytes still to move at time t (>= self.at), 0 within tolerance."""
        pool = self.pool
        if pool is not None:
            left = self.target - pool.service_at(t)
        elif self.rate < 0:
            return self.left
        elif self.rate == math.inf:  # no bound at all (no ports, no cap): done at once
            return 0.0
        else:
            left = self.left - self.rate * (t - self.at)
        return 0.0 if left <= self.tol else left

    def finish_time(self) -> float:
        pool = self.pool
        if pool is not None:
            return pool.at + (self.target - pool.service) / pool.rate
        if self.left == 0.0 or self.rate == math.inf:
            return self.at
        return self.at + self.left / self.rate


class _Pool:
    """The flows of a port p that share nothing else: each crosses p and ports that carry it
    alone, and none is bounded elsewhere below p's even share. Max-min gives them all that
    share, capacity / n, so their progress is one number: `service`, the bytes each has moved
    since the pool began (at `rate` since `at`). A member is complete when the service reaches
    its `target`. A flow joining or leaving changes only the rate: O(log n), where progressive
    filling would recompute all n flows. That is an incast (pushes to a server) and a server's
    concurrent replies, which otherwise cost O(n^2) per round.

    Invariant: while a pool exists at p, every flow on p is a member, and every other port of a
    member carries that member alone. A change that would break it dissolves the pool (its
    members become ordinary flows at the pool's rate) before rates are recomputed."""

    __slots__ = ("at", "bounds", "capacity", "members", "port", "rate", "service", "targets",
                 "version")

    def __init__(self, port: int, capacity: float, t: float):
        self.port, self.capacity = port, capacity
        self.members = 0
        self.service, self.at, self.rate = 0.0, t, 0.0
        self.version = 0
        # Lazy heaps, (value, start order, flow): an entry is stale once its flow has left.
        self.targets: list[tuple[float, int, _Flow]] = []
        self.bounds: list[tuple[float, int, _Flow]] = []

    def service_at(self, t: float) -> float:
        return self.service + self.rate * (t - self.at)

    def bank(self, t: float) -> None:
        """Fold the service up to t into `service`, before the rate changes at t."""
        self.service = self.service_at(t)
        self.at = t

    def head(self) -> _Flow | None:
        """The member that completes first (the earliest started among equals)."""
        targets = self.targets
        while targets:
            target, _, f = targets[0]
            if f.pool is self and f.target == target:
                return f
            heapq.heappop(targets)
        return None

    def min_bound(self) -> float:
        """The lowest of the members' own bounds (cap and other ports) below the port's
        capacity, else inf (a bound at or above it is at or above every even share)."""
        bounds = self.bounds
        while bounds:
            if bounds[0][2].pool is self:
                return bounds[0][0]
            heapq.heappop(bounds)
        return math.inf


class FlowNetwork:
    """Flows sharing ports max-min fairly, on the caller's clock.

    `capacities[p]`: port p's bandwidth, bytes per second (> 0; inf for a port that limits
    nothing). The network's time starts at 0 and only moves forward (advance, or start and
    finish with a time).

    The caller's loop: start flows as messages begin; at `next_completion()`'s time, advance
    there, handle the flow and `finish` it, then ask again (a flow that is complete but not
    finished still holds its share of its ports, so finish each at its completion).

    Cost: a start or finish recomputes the rates of the flows connected to the changed one
    through shared ports (its connected component), not the whole network's: for a component
    of F flows over P ports with d ports a flow, O((F d + P) log(F + P)) for progressive filling
    with a heap of the ports' fair shares, plus O(log n) a changed rate for the completion heap
    of all n flows. advance() is O(1): flows keep their progress lazily. Flows that start or
    finish at the same instant (a collective's step, a server's replies) are best started with
    start_many and finished with due() and finish_many: one recompute for all, where n single
    calls on one component would cost n recomputes of it. Flows that share only one port and
    are bounded there (an incast, a server's replies) are kept as a _Pool: a start or finish
    among them costs O(log n) (`pools=False` recomputes them as any others: the reference the
    pools are tested against). A caller that starts flows one at a time within an instant
    (the transport: each message as its receive is posted) gets start_many's single recompute
    with start_later. A caller may keep a flow that is alone on its ports outside the network
    and hand it over when another comes (reserve, adopt).
    """

    def __init__(self, capacities: Sequence[float], pools: bool = True):
        for p, c in enumerate(capacities):
            if not c > 0:  # also rejects NaN
                raise ValueError(f"port {p}'s capacity must be > 0, got {c}")
        self._capacity = [float(c) for c in capacities]
        #: Per port, the flows crossing it, in start order (a dict: ordered, O(1) removal).
        #: Callers read it (is a port idle?) and never change it.
        self.on_port: list[dict[Hashable, _Flow]] = [{} for _ in capacities]
        self._flows: dict[Hashable, _Flow] = {}
        self._now = 0.0
        #: The start order's next number, for a flow starting now (also one the caller keeps
        #: outside while it is alone on its ports). A C call: the transport takes one for
        #: every message it moves.
        self.reserve = itertools.count().__next__
        #: Version numbers for flows and pools alike, so that no two entries share one.
        self._stamps = itertools.count(1)
        self._pooling = pools
        self._pools: dict[int, _Pool] = {}  # by port
        # Completion times, (time, start order, version, flow); entries whose flow is gone or
        # whose rate changed since are stale and skipped (lazy deletion).
        self._done: list[tuple[float, int, int, _Flow]] = []
        #: Flows whose rates the last start or finish set one by one (a recompute's component,
        #: a flow alone, a pool's new members); a pool's rate change counts none.
        self.last_recompute = 0
        #: Flows started by start_later at the network's time, on their ports, their rates
        #: not yet set, and pools whose completion entry is stale (a member extended, or
        #: members joined: n replies joining at one instant renew it once): settle()'s.
        self._unplaced: list[_Flow] = []
        self._renew: dict[int, _Pool] = {}

    @property
    def now(self) -> float:
        """The time the network was last advanced to."""
        return self._now

    def __len__(self) -> int:
        return len(self._flows)

    def __contains__(self, flow_id: Hashable) -> bool:
        return flow_id in self._flows

    def advance(self, t: float) -> None:
        """Move the network's time to t: every flow progresses at its rate (lazily: nothing is
        computed until a flow is inspected or its rate changes). No flow is completed or
        removed here; a flow advanced past its completion stays, with nothing left, until
        finish()."""
        if not t >= self._now:
            raise ValueError(f"time {t} is before the network's time {self._now}")
        if t > self._now and (self._unplaced or self._renew):
            self.settle()
        self._now = t

    def start(self, flow_id: Hashable, ports: Sequence[int], nbytes: float, t: float,
              cap: float = math.inf) -> None:
        """Begin a flow of nbytes over `ports` at time t, limited to `cap` bytes per second
        besides its ports' shares. The other flows of its component slow down from t on."""
        self.start_many(t, [(flow_id, ports, nbytes, cap)])

    def start_many(self, t: float, flows: Iterable[tuple]) -> None:
        """Begin several flows at time t, each (flow_id, ports, nbytes) or (flow_id, ports,
        nbytes, cap), with one recompute of rates for them all: n flows that share a port
        (a server's replies, an incast) cost one recompute, not n of a growing component.
        All are checked before any starts."""
        new: list[tuple[Hashable, tuple[int, ...], float, float]] = []
        ids: set = set()
        for flow_id, ports, nbytes, *rest in flows:
            cap = rest[0] if rest else math.inf
            if flow_id in self._flows or flow_id in ids:
                raise ValueError(f"flow {flow_id!r} has already started")
            if not (nbytes >= 0 and math.isfinite(nbytes)):
                raise ValueError(f"flow {flow_id!r}: nbytes must be >= 0 and finite, got "
                                 f"{nbytes}")
            if not cap > 0:
                raise ValueError(f"flow {flow_id!r}: cap must be > 0, got {cap}")
            unique = tuple(dict.fromkeys(ports))  # a port crossed twice is shared once
            for p in unique:
                if not 0 <= p < len(self._capacity):
                    raise ValueError(f"flow {flow_id!r}: no port {p} (ports 0..."
                                     f"{len(self._capacity) - 1})")
            ids.add(flow_id)
            new.append((flow_id, unique, float(nbytes), float(cap)))
        self.start_checked(t, new)

    def start_checked(self, t: float, flows: list[tuple]) -> None:
        """start_many for flows its caller has made valid: each (flow_id, ports, nbytes, cap)
        with a new id, distinct existing ports, finite nbytes >= 0 and cap > 0 (the simulator's
        transport, which starts a flow for every message it moves)."""
        self.advance(t)
        if self._unplaced or self._renew:
            self.settle()
        self.last_recompute = 0
        on_port, moving = self.on_port, []
        for flow_id, ports, nbytes, cap in flows:
            flow = self._new_flow(flow_id, ports, nbytes, cap)
            if nbytes == 0:
                # Nothing to move: complete at once, holding no share meanwhile, so the
                # others' rates do not change for an instant.
                flow.rate = 0.0
                self._push(flow, flow.version)
                continue
            for p in ports:
                on_port[p][flow_id] = flow
            moving.append(flow)
        self._place_all(moving)

    def _place_all(self, moving: list[_Flow]) -> None:
        """Set the rates of flows that have just started together, on their ports."""
        others: list[_Flow] = []  # neither alone nor pooled: progressive filling, once
        for flow in moving:
            if flow.pool is not None:  # a pool formed by an earlier one of the batch
                continue
            if not self._placed(flow):
                others.append(flow)
        if others:
            self._recompute([p for f in others for p in f.ports], others)

    def start_later(self, t: float, flow_id: Hashable, ports: tuple[int, ...], nbytes: float,
                    cap: float) -> None:
        """One flow with bytes to move (nbytes > 0), checked by its caller as start_checked's,
        its rate set together with those of the other flows started at t at the network's
        next question about rates or times (or settle()): the transport starts each message
        as its receive is posted, and n flows into one port at one instant (a server's
        replies, pushes from workers in step) then cost one recompute, as start_many's."""
        self.advance(t)
        flow = self._new_flow(flow_id, ports, nbytes, cap)
        on_port = self.on_port
        for p in ports:
            on_port[p][flow_id] = flow
        self._unplaced.append(flow)

    def settle(self) -> None:
        """Set the rates of the flows start_later began, and renew the completion entries of
        the pools whose members joined or were extended (each query does this first)."""
        if self._unplaced:
            moving, self._unplaced = self._unplaced, []
            self.last_recompute = 0
            self._place_all(moving)
        if self._renew:
            pools, self._renew = self._renew, {}
            for port, pool in pools.items():
                if self._pools.get(port) is pool:
                    self._push_pool(pool)

    def _new_flow(self, flow_id: Hashable, ports: tuple[int, ...], nbytes: float,
                  cap: float) -> _Flow:
        """A flow starting now, in the network but not yet on its ports."""
        flow = _Flow(flow_id, self.reserve(), ports, nbytes, self._now, cap,
                     self.bound(ports, cap))
        self._flows[flow_id] = flow
        return flow

    def bound(self, ports: tuple[int, ...], cap: float) -> float:
        """A flow's rate alone on its ports: its narrowest port, or its cap."""
        bound, capacity = cap, self._capacity
        for p in ports:
            if capacity[p] < bound:
                bound = capacity[p]
        return bound

    # -- flows kept outside while alone ---------------------------------------------------------
    # A flow alone on its ports moves at its bound until another flow starts on one of them,
    # so a caller that knows it is alone may time it itself (its end is known at its start)
    # and hand it over only when another flow comes: reserve() gives it its place in the
    # start order (which breaks ties) at its start, adopt() takes it in, in the state the
    # network would have kept it in.

    def adopt(self, flow_id: Hashable, seq: int, ports: tuple[int, ...], nbytes: float,
              left: float, at: float, cap: float, rate: float | None = None) -> None:
        """Take in a flow of nbytes (reserve()'s `seq`) kept outside, `left` bytes still to
        move at time `at` (<= now), moving at `rate` since: as a start and extend() would
        have left it. `rate` None: it has moved alone on its ports, at its bound, and its
        ports must carry no other flow. A caller that kept flows sharing a port hands them
        over together, each with its max-min rate among them."""
        if self._unplaced or self._renew:
            self.settle()
        on_port = self.on_port
        if flow_id in self._flows:
            raise ValueError(f"flow {flow_id!r} has already started")
        if rate is None and any(on_port[p] for p in ports):
            raise ValueError(f"flow {flow_id!r} is not alone on its ports")
        flow = _Flow(flow_id, seq, ports, nbytes, at, cap, self.bound(ports, cap))
        flow.left = left
        flow.rate = flow.bound if rate is None else rate
        flow.version = next(self._stamps)
        self._flows[flow_id] = flow
        for p in ports:
            on_port[p][flow_id] = flow
        self._push(flow, flow.version)

    def _placed(self, flow: _Flow) -> bool:
        """Set a new flow's rate where no progressive filling is needed: alone on its ports
        (the commonest start: no other flow's rate changes), or joining the pool of its one
        shared port. False: its component is for _recompute."""
        on_port = self.on_port
        shared = [p for p in flow.ports if len(on_port[p]) > 1]
        if not shared:
            self.last_recompute += 1
            self._set_rate(flow, flow.bound)
            return True
        return self._pooling and len(shared) == 1 and self._pool_at(shared[0], flow)

    def finish(self, flow_id: Hashable, t: float | None = None) -> None:
        """Remove a flow (at time t if given, else at the network's time): complete, or
        cancelled with bytes left. Its ports' share goes to the flows still on them."""
        self.finish_many([flow_id], t)

    def finish_many(self, flow_ids: Iterable[Hashable], t: float | None = None) -> None:
        """Remove several flows (due(): those complete at once) with one recompute."""
        if t is not None:
            self.advance(t)
        flow_ids = list(flow_ids)
        for flow_id in flow_ids:
            if flow_id not in self._flows:
                raise KeyError(flow_id)  # before removing any: all or none
        self.finish_checked(flow_ids)

    def finish_checked(self, flow_ids: list) -> None:
        """finish_many at the network's time for flows its caller knows are in it (due()'s)."""
        if self._unplaced or self._renew:
            self.settle()
        freed: list[int] = []
        left: dict[int, _Pool] = {}  # the pools members left, by port
        on_port = self.on_port
        for flow_id in flow_ids:
            flow = self._flows.pop(flow_id)
            pool = flow.pool
            for p in flow.ports if flow.nbytes else ():
                del on_port[p][flow_id]
                if pool is None:
                    freed.append(p)
            if pool is not None:  # its other ports carried it alone: only the pool changes
                flow.pool = None
                pool.members -= 1
                left[pool.port] = pool
        self.last_recompute = 0
        for port, pool in left.items():
            if not pool.members:
                del self._pools[port]
            elif pool.min_bound() >= pool.capacity / pool.members:
                self._pool_rate(pool)
            else:  # a member is now bounded elsewhere: the share is no longer even
                self._dissolve(pool)
                freed.append(port)
        # Removing flows may split their components; recomputing from each freed port reaches
        # every piece, and progressive filling over disjoint components is each one's own.
        freed = [p for p in freed if on_port[p]]  # ports left with flows to speed up
        if freed:
            self._recompute(freed, [])

    def extend(self, flow_id: Hashable, nbytes: float) -> None:
        """Give a flow in the network nbytes more to move, at its rate: every port keeps the
        same flows, so no rate changes and nothing is recomputed (a message whose sender's
        send returned before its last bytes left goes on as the same flow)."""
        if self._unplaced:  # its rate must be set (pools extended before may wait)
            self.settle()
        flow = self._flows[flow_id]
        if not nbytes >= 0 or not flow.nbytes:
            raise ValueError(f"flow {flow_id!r}: can extend a flow with bytes by nbytes >= 0, "
                             f"got {nbytes}")
        left = flow.left_at(self._now) + nbytes
        flow.nbytes += nbytes
        flow.tol = REL_TOLERANCE * flow.nbytes
        pool = flow.pool
        if pool is not None:
            flow.target = pool.service_at(self._now) + left
            heapq.heappush(pool.targets, (flow.target, flow.seq, flow))
            # Its head may have changed: the pool's entry is renewed once, at settle(), for
            # all of its members extended at this instant.
            self._renew[pool.port] = pool
            return
        flow.left, flow.at = left, self._now
        flow.version = next(self._stamps)  # its old completion entry is stale
        self._push(flow, flow.version)

    def due(self) -> list[Hashable]:
        """The flows complete at the network's time (next_completion's order), for
        finish_many: flows that finish together (a server's replies) are handled at once."""
        return self.take_due(keep=True)

    def take_due(self, keep: bool = False) -> list[Hashable]:
        """due(); without `keep`, for a caller that finishes or extends every flow it returns
        at once (the transport), their completion entries leave the heap here rather than
        going back into it to be skipped as stale later."""
        if self._unplaced or self._renew:
            self.settle()
        done, found, popped, now = self._done, [], [], self._now
        while done:
            when, seq, version, flow = done[0]
            if not self._current(flow, version):
                heapq.heappop(done)  # stale
            elif when <= now or flow.left_at(now) == 0.0:
                popped.append(heapq.heappop(done))
                if flow.pool is None:
                    found.append((when, seq, flow.fid))
                else:
                    found += self._pool_due(flow.pool, keep)
            else:
                break
        if keep:
            for entry in popped:  # still valid: they leave the heap when finished
                heapq.heappush(done, entry)
        if len(found) > 1:
            found.sort()  # by (time, start order), unique: the ids are never compared
        return [fid for _, _, fid in found]

    def _pool_due(self, pool: _Pool, keep: bool) -> list[tuple[float, int, Hashable]]:
        """(finish time, start order, id) of a pool's members complete by now; their target
        entries leave the pool's heap unless `keep` (take_due's)."""
        targets, out, kept, now = pool.targets, [], [], self._now
        while (head := pool.head()) is not None:
            when = head.finish_time()
            if not (when <= now or head.left_at(now) == 0.0):
                break
            entry = heapq.heappop(targets)
            if keep:
                kept.append(entry)
            out.append((when, head.seq, head.fid))
        for entry in kept:
            heapq.heappush(targets, entry)
        return out

    def next_completion(self) -> tuple[float, Hashable] | None:
        """(time, flow id) of the flow that completes first at the current rates (the earliest
        started among those completing at the same time), or None with no flow. A flow
        already complete reports the network's time."""
        when = self.next_time()
        return None if when is None else (when, self._done[0][3].fid)

    def next_time(self) -> float | None:
        """next_completion()'s time alone (the transport's question); its entry is then the
        completion heap's first."""
        if self._unplaced or self._renew:
            self.settle()
        done = self._done
        while done:
            when, _, version, flow = done[0]
            if self._current(flow, version):
                # Complete within tolerance (or advanced past its end): it is due now.
                now = self._now
                return now if when <= now or flow.left_at(now) == 0.0 else when
            heapq.heappop(done)
        return None

    def rate(self, flow_id: Hashable) -> float:
        """A flow's rate now, bytes per second (0 for a zero-byte flow, inf for a flow with
        neither ports nor cap)."""
        if self._unplaced or self._renew:
            self.settle()
        flow = self._flows[flow_id]
        return flow.rate if flow.pool is None else flow.pool.rate

    def remaining(self, flow_id: Hashable) -> float:
        """A flow's bytes still to move at the network's time (0 once complete)."""
        if self._unplaced or self._renew:
            self.settle()
        return self._flows[flow_id].left_at(self._now)

    def _current(self, flow: _Flow, version: int) -> bool:
        """Whether a completion entry still holds: its flow is in the network and neither
        its rate nor (in a pool) its pool's rate or first member has changed since."""
        if self._flows.get(flow.fid) is not flow:
            return False
        pool = flow.pool
        return (flow.version if pool is None else pool.version) == version

    def _push(self, head: _Flow, version: int) -> None:
        """A completion entry: a flow's, or (head, a pool's version) a pool's, whose first
        member completes first."""
        heapq.heappush(self._done, (head.finish_time(), head.seq, version, head))
        if len(self._done) > 4 * len(self._flows) + 64:
            # Mostly stale entries (rates change more often than flows complete): rebuild, so
            # the heap stays O(flows) in size.
            self._done = [(f.finish_time(), f.seq, f.version, f) for f in self._flows.values()
                          if f.pool is None]
            for pool in self._pools.values():
                first = pool.head()
                self._done.append((first.finish_time(), first.seq, pool.version, first))
            heapq.heapify(self._done)

    # -- pools ------------------------------------------------------------------------------
    def _pool_at(self, port: int, flow: _Flow) -> bool:
        """Keep a new flow, whose only shared port is `port`, in that port's pool (joining
        it, or forming one with the port's flows): True if it could be, else False (its
        rates are then for progressive filling)."""
        capacity = self._capacity[port]
        flows = self.on_port[port]
        share = capacity / len(flows)
        if capacity == math.inf or flow.bound < share:
            return False
        now, pool = self._now, self._pools.get(port)
        if pool is None:
            # A pool forms if the port's flows share nothing else and none is bounded below
            # the even share (the new flow's other ports carry it alone: `port` is its only
            # shared one).
            on_port = self.on_port
            for f in flows.values():
                if f is not flow and (f.pool is not None or f.bound < share or any(
                        q != port and len(on_port[q]) > 1 for q in f.ports)):
                    return False
            pool = self._pools[port] = _Pool(port, capacity, now)
            self.last_recompute += len(flows)
            for f in flows.values():
                self._enter(pool, f)
        else:
            pool.bank(now)
            self.last_recompute += 1
            self._enter(pool, flow)
        self._pool_rate(pool, renew=False)
        self._renew[port] = pool  # its completion entry, once for every flow joining now
        return True

    def _enter(self, pool: _Pool, flow: _Flow) -> None:
        """A flow joins a pool whose service is banked up to now."""
        flow.target = pool.service + flow.left_at(self._now)
        flow.pool = pool
        pool.members += 1
        heapq.heappush(pool.targets, (flow.target, flow.seq, flow))
        if flow.bound < pool.capacity:  # else never below an even share of the port
            heapq.heappush(pool.bounds, (flow.bound, flow.seq, flow))

    def _pool_rate(self, pool: _Pool, renew: bool = True) -> None:
        """A pool's rate from now on: its port's even share among its members; its completion
        entry renewed now, or (`renew` False) by the caller."""
        pool.bank(self._now)
        pool.rate = pool.capacity / pool.members
        if pool.service > POOL_REBASE_BYTES:
            # Keep targets and service small, so that their difference (a member's bytes
            # left) keeps its precision however long the pool lives.
            members = self.on_port[pool.port].values()
            for f in members:
                f.target -= pool.service
            pool.service = 0.0
            pool.targets = [(f.target, f.seq, f) for f in members]
            heapq.heapify(pool.targets)
        if renew:
            self._push_pool(pool)

    def _push_pool(self, pool: _Pool) -> None:
        """The pool's one completion entry, for its first member: older ones are stale."""
        pool.version = next(self._stamps)
        self._push(pool.head(), pool.version)

    def _dissolve(self, pool: _Pool) -> None:
        """The pool's members become ordinary flows, at the pool's rate until recomputed."""
        now = self._now
        del self._pools[pool.port]
        for f in self.on_port[pool.port].values():
            f.left = f.left_at(now)
            f.pool = None
            f.at, f.rate = now, pool.rate
            f.version = next(self._stamps)
            self._push(f, f.version)

    def _component(self, ports: Iterable[int], new: list[_Flow]) -> tuple[list[_Flow],
                                                                        list[int]]:
        """The flows and ports reachable from `ports` through shared ports (in a deterministic
        order), plus the `new` flows (which may have no ports)."""
        flows: list[_Flow] = list(new)
        seen_flows = {id(f) for f in new}
        queue = list(dict.fromkeys(ports))
        seen_ports = set(queue)
        component_ports: list[int] = []
        on_port = self.on_port
        while queue:
            p = queue.pop()
            component_ports.append(p)
            if p in self._pools:  # a change reaches a pool: its rates are no longer even
                self._dissolve(self._pools[p])
            for f in on_port[p].values():
                if f.pool is not None:  # p is a member's own port, now shared
                    self._dissolve(f.pool)
                if id(f) not in seen_flows:
                    seen_flows.add(id(f))
                    flows.append(f)
                    for q in f.ports:
                        if q not in seen_ports:
                            seen_ports.add(q)
                            queue.append(q)
        return flows, component_ports

    def _recompute(self, ports: Sequence[int], new: list[_Flow]) -> None:
        """Progressive filling over the component of `ports` (and the new flows): raise every
        flow's rate together; the first constraint to saturate (a port whose residual
        bandwidth, split evenly among its unfrozen flows, is the smallest, or a flow's cap)
        freezes its flows at that level; subtract them from their other ports; repeat.

        A heap holds each port's current fair share (residual / unfrozen flows) and each
        capped flow's cap. A port's share only grows as flows freeze elsewhere (they freeze
        at a level no higher than its share), so an entry is replaced, not corrected, when a
        share changes (a version number marks the old one stale)."""
        flows, comp_ports = self._component(ports, new)
        self.last_recompute += len(flows)
        if len(flows) == 1:  # alone on its ports
            self._set_rate(flows[0], flows[0].bound)
            return
        on_port = self.on_port
        residual = {p: self._capacity[p] for p in comp_ports}
        unfrozen = {p: len(on_port[p]) for p in comp_ports}
        version = dict.fromkeys(comp_ports, 0)
        heap: list[tuple[float, int, int, Any]] = []
        # Entries: (level, 0, port, version) for a port, (cap, 1, start order, flow) for a cap;
        # the first three fields are unique, so the flow itself is never compared.
        for p in comp_ports:
            if unfrozen[p]:
                heap.append((residual[p] / unfrozen[p], 0, p, 0))
        for f in flows:
            if f.cap < math.inf:
                heap.append((f.cap, 1, f.seq, f))
        heapq.heapify(heap)
        rates: dict[int, float] = {}  # id(flow) -> its max-min rate
        level = 0.0
        while heap:
            share, kind, key, tag = heapq.heappop(heap)
            if kind == 0:
                if tag != version[key] or not unfrozen[key]:
                    continue
                frozen = [f for f in on_port[key].values() if id(f) not in rates]
            else:
                if id(tag) in rates:
                    continue
                frozen = [tag]
            # In exact arithmetic the levels only rise; max() keeps round-off from lowering one.
            level = max(level, share)
            touched: dict[int, None] = {}
            for f in frozen:
                rates[id(f)] = level
                for q in f.ports:
                    residual[q] = max(0.0, residual[q] - level)
                    unfrozen[q] -= 1
                    touched[q] = None
            for q in touched:
                version[q] += 1
                if unfrozen[q]:
                    heapq.heappush(heap, (max(level, residual[q] / unfrozen[q]), 0, q,
                                          version[q]))
        for f in flows:  # unfrozen: no finite port or cap bounds it
            self._set_rate(f, rates.get(id(f), math.inf))

    def _set_rate(self, f: _Flow, rate: float) -> None:
        if rate != f.rate:
            # Bank the progress at the old rate up to now, then go on at the new one.
            f.left = f.left_at(self._now)
            f.at = self._now
            f.rate = rate
            f.version = next(self._stamps)
            self._push(f, f.version)


#: A receive's source meaning any sender (MPI's MPI_ANY_SOURCE; Hop's receiving thread).
ANY = -1


class Match(NamedTuple):
    """A message paired with what lets its bytes move. `start`: when they may begin (sent_at
    for an eager message; max(sent_at, received_at) for a rendezvous one). received_at: when
    the matching receive was posted, None while an eager message has none yet. `eager`: the
    message is at most the eager threshold (its bytes started at its send). A named tuple:
    one is made for every message, and a frozen dataclass is several times slower to make."""

    src: int
    dst: int
    key: Hashable
    nbytes: float
    payload: Any
    sent_at: float
    received_at: float | None
    start: float
    eager: bool = False


@dataclass(frozen=True)
class Pending:
    """What waits in a Rendezvous: large sends without a receive, eager messages delivered
    but not yet received, receives without a message."""

    sends: int
    eager: int
    receives: int


class Message:
    """A message a Rendezvous keeps until a receive takes it: `eager` if its bytes moved from
    its send on; `stream` its (src, dst, key)."""

    __slots__ = ("dst", "eager", "key", "nbytes", "payload", "sent_at", "seq", "src", "stream")

    def __init__(self, src, dst, key, nbytes, payload, sent_at, seq, eager, stream):
        self.src, self.dst, self.key = src, dst, key
        self.nbytes, self.payload, self.sent_at = nbytes, payload, sent_at
        self.seq, self.eager, self.stream = seq, eager, stream

    def match(self, received_at: float | None) -> Match:
        return _match(self.src, self.dst, self.key, self.nbytes, self.payload, self.sent_at,
                      received_at, self.eager)


def _match(src, dst, key, nbytes, payload, sent_at: float, received_at: float | None,
           eager: bool) -> Match:
    """The Match of a message sent at sent_at and a receive posted at received_at (None: an
    eager message with none yet): an eager message's bytes start at its send, a rendezvous
    one's once both are in."""
    start = sent_at if eager or received_at is None else max(sent_at, received_at)
    return Match(src, dst, key, nbytes, payload, sent_at, received_at, start, eager)


class Rendezvous:
    """Sends matched to posted receives, per (src, dst, key) stream in order.

    - A message of at most `eager_bytes` is eager: send() returns its Match at once (start =
      sent_at), with received_at the time of a receive already waiting for it, else None.
      Its bytes move from then on. A receive posted later consumes it and returns it again,
      completed (received_at = that receive's time, start still sent_at, eager True): this is
      the receive's binding to the message, not a second transfer, so the caller starts no
      flow for an eager Match that post_receive returns. (The receive then completes when
      the message's bytes have arrived, or at once if they already have.)
    - A larger message waits for a matching receive: the call that pairs them (send(), if the
      receive was posted first, or post_receive()) returns its Match, start = max(sent_at,
      received_at). The caller starts its flow then.

    So every call returns at most one Match, and a flow is started for each Match except the
    eager ones that post_receive returns.

    Order, as MPI's (and as gloo's per-pair, per-tag queues): a stream's messages match its
    receives first to first. A receive from ANY takes the earliest unmatched message sent to
    its dst with its key (in call order, over every source); a new message goes to the
    earliest posted of the receives that can take it (from its source or from ANY).
    """

    def __init__(self, eager_bytes: float):
        if not eager_bytes >= 0:
            raise ValueError(f"eager_bytes must be >= 0, got {eager_bytes}")
        self.eager_bytes = eager_bytes
        self._seq = 0
        # Unmatched messages (large ones waiting, eager ones not yet received): per stream in
        # send order, and per (dst, key) over every source in call order, for ANY receives.
        # A stream's one message is kept as itself, with more as a deque (most streams carry
        # one message at a time: a deque for each would be made and dropped every message).
        self._stream: dict[tuple, Message | deque[Message]] = {}
        self._to_dst: dict[tuple, OrderedDict[int, Message]] = {}
        # Posted receives not yet matched, (post order, time): from one source, from ANY.
        self._receives: dict[tuple, deque[tuple[int, float]]] = {}
        self._any: dict[tuple, deque[tuple[int, float]]] = {}
        self._waiting_sends = 0
        self._waiting_eager = 0
        self._waiting_receives = 0

    def send(self, src: int, dst: int, key: Hashable, nbytes: float, t: float,
             payload: Any = None) -> list[Match]:
        """A message from src to dst posted at time t; returns the Match it completes, if
        any (always one for an eager message)."""
        if src == ANY:
            raise ValueError("a message's source cannot be ANY")
        if not nbytes >= 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        eager = nbytes <= self.eager_bytes
        receive = self._pair(src, dst, key, nbytes, payload, t, eager)
        if receive is None and not eager:
            return []
        return [_match(src, dst, key, nbytes, payload, t, receive, eager)]

    def offer(self, src: int, dst: int, key: Hashable, nbytes: float, t: float,
              payload: Any = None) -> bool:
        """send() for a caller that checks its own arguments and needs to know only whether
        the message's bytes move now (a receive was waiting for it, or it is eager): no Match
        is made (the transport, for every message it moves)."""
        eager = nbytes <= self.eager_bytes
        return self._pair(src, dst, key, nbytes, payload, t, eager) is not None or eager

    def _pair(self, src, dst, key, nbytes, payload, t, eager) -> float | None:
        """A new message: the time of the receive it pairs with at once, or None (it is kept
        for the first receive that will take it). (Each message's and each receive's path
        is written out in one function: the transport makes several of each per simulated
        step.)"""
        seq, self._seq = self._seq, self._seq + 1
        stream, box = (src, dst, key), (dst, key)
        # Invariant: a receive waits only while no message it could take does, so a new
        # message either pairs with the earliest posted receive that can take it (from src,
        # or from ANY; no queue is left empty) or waits.
        own = self._receives.get(stream)
        anyq = self._any.get(box)
        if own and (not anyq or own[0][0] < anyq[0][0]):
            queue, where, queues = own, stream, self._receives
        elif anyq:
            queue, where, queues = anyq, box, self._any
        else:
            queue = None
        if queue is not None:
            _, received = queue.popleft()
            if not queue:
                del queues[where]  # no empty queues left behind (keys are many over a run)
            self._waiting_receives -= 1
            return received
        message = Message(src, dst, key, nbytes, payload, t, seq, eager, stream)
        queue = self._stream.get(stream)
        if queue is None:
            self._stream[stream] = message
        elif type(queue) is Message:
            self._stream[stream] = deque((queue, message))
        else:
            queue.append(message)
        to_dst = self._to_dst.get(box)
        if to_dst is None:
            to_dst = self._to_dst[box] = OrderedDict()
        to_dst[seq] = message
        if eager:
            self._waiting_eager += 1
        else:
            self._waiting_sends += 1
        return None

    def post_receive(self, dst: int, src: int, key: Hashable, t: float) -> list[Match]:
        """A receive posted by dst at time t for a message from src (or ANY) with `key`;
        returns the Match it completes, if a message was waiting (see the class docstring
        for an eager one)."""
        message = self.take(dst, src, key, t)
        return [] if message is None else [message.match(t)]

    def take(self, dst: int, src: int, key: Hashable, t: float) -> Message | None:
        """post_receive for a caller that needs only the Message its receive takes, if one
        was waiting (its bytes move from now unless it is eager); else the receive waits."""
        box = (dst, key)
        to_dst = self._to_dst.get(box)
        message = None
        if to_dst:
            if src == ANY:
                _, message = to_dst.popitem(last=False)  # the earliest sent, over every source
                stream = message.stream
                queue = self._stream[stream]
            else:
                stream = (src, dst, key)
                queue = self._stream.get(stream)
                if queue is not None:
                    message = queue if type(queue) is Message else queue[0]
                    del to_dst[message.seq]
        if message is None:
            self._seq += 1
            queues = self._any if src == ANY else self._receives
            where = box if src == ANY else (src, dst, key)
            waiting = queues.get(where)
            if waiting is None:
                waiting = queues[where] = deque()
            waiting.append((self._seq, t))
            self._waiting_receives += 1
            return None
        # A stream's messages are in send order in both structures, so the one a receive
        # takes is always its stream's head.
        if queue is message:
            del self._stream[stream]
        else:
            head = queue.popleft()
            assert head is message
            if not queue:
                del self._stream[stream]
        if not to_dst:
            del self._to_dst[box]
        if message.eager:
            self._waiting_eager -= 1
        else:
            self._waiting_sends -= 1
        return message

    def pending(self) -> Pending:
        return Pending(self._waiting_sends, self._waiting_eager, self._waiting_receives)
