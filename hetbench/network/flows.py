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
import math
from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

#: A flow's remaining bytes within this share of its size count as none (float round-off of
#: rate x time); a flow whose remainder is that small is complete.
REL_TOLERANCE = 1e-9


class _Flow:
    """One flow's state. Progress is kept lazily: `left` bytes at time `at`, moving at `rate`
    since, so that moving the clock costs nothing for flows whose rate does not change."""

    __slots__ = ("at", "cap", "fid", "left", "nbytes", "ports", "rate", "seq", "tol", "version")

    def __init__(self, fid: Hashable, seq: int, ports: tuple[int, ...], nbytes: float,
                 t: float, cap: float):
        self.fid = fid
        self.seq = seq  # start order: breaks ties, orders every iteration (determinism)
        self.ports = ports
        self.nbytes = nbytes
        self.cap = cap
        self.left = nbytes
        self.at = t
        self.rate = -1.0  # not yet computed: any real rate differs, so the first one is set
        self.version = 0  # bumped at every rate change: older completion entries are stale
        self.tol = REL_TOLERANCE * nbytes

    def left_at(self, t: float) -> float:
        """Bytes still to move at time t (>= self.at), 0 within tolerance."""
        if self.rate < 0:
            return self.left
        if self.rate == math.inf:  # no bound at all (no ports, no cap): done at once
            return 0.0
        left = self.left - self.rate * (t - self.at)
        return 0.0 if left <= self.tol else left

    def finish_time(self) -> float:
        if self.left == 0.0 or self.rate == math.inf:
            return self.at
        return self.at + self.left / self.rate


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
    calls on one component would cost n recomputes of it.
    """

    def __init__(self, capacities: Sequence[float]):
        for p, c in enumerate(capacities):
            if not c > 0:  # also rejects NaN
                raise ValueError(f"port {p}'s capacity must be > 0, got {c}")
        self._capacity = [float(c) for c in capacities]
        # Per port, the flows crossing it, in start order (a dict: ordered, O(1) removal).
        self._on_port: list[dict[Hashable, _Flow]] = [{} for _ in capacities]
        self._flows: dict[Hashable, _Flow] = {}
        self._now = 0.0
        self._seq = 0
        # Completion times, (time, start order, version, flow); entries whose flow is gone or
        # whose rate changed since are stale and skipped (lazy deletion).
        self._done: list[tuple[float, int, int, _Flow]] = []
        #: Flows whose rates the last start or finish recomputed (its component's size).
        self.last_recompute = 0

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
        moving: list[_Flow] = []
        for flow_id, ports, nbytes, cap in flows:
            flow = _Flow(flow_id, self._seq, ports, nbytes, t, cap)
            self._seq += 1
            self._flows[flow_id] = flow
            if nbytes == 0:
                # Nothing to move: complete at once, holding no share meanwhile, so the
                # others' rates do not change for an instant.
                flow.rate = 0.0
                self._push(flow)
                continue
            for p in ports:
                self._on_port[p][flow_id] = flow
            moving.append(flow)
        self.last_recompute = 0
        if len(moving) == 1 and all(len(self._on_port[p]) == 1 for p in moving[0].ports):
            # Alone on its ports (the commonest start): no other flow's rate changes.
            self.last_recompute = 1
            self._set_rate(moving[0], self._bound(moving[0]))
        elif moving:
            self._recompute([p for f in moving for p in f.ports], moving)

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
        freed: list[int] = []
        for flow_id in flow_ids:
            flow = self._flows.pop(flow_id)
            for p in flow.ports if flow.nbytes else ():
                del self._on_port[p][flow_id]
                freed.append(p)
        # Removing flows may split their components; recomputing from each freed port reaches
        # every piece, and progressive filling over disjoint components is each one's own.
        self.last_recompute = 0
        freed = [p for p in freed if self._on_port[p]]  # ports left with flows to speed up
        if freed:
            self._recompute(freed, [])

    def extend(self, flow_id: Hashable, nbytes: float) -> None:
        """Give a flow in the network nbytes more to move, at its rate: every port keeps the
        same flows, so no rate changes and nothing is recomputed (a message whose sender's
        send returned before its last bytes left goes on as the same flow)."""
        flow = self._flows[flow_id]
        if not nbytes >= 0 or not flow.nbytes:
            raise ValueError(f"flow {flow_id!r}: can extend a flow with bytes by nbytes >= 0, "
                             f"got {nbytes}")
        flow.left, flow.at = flow.left_at(self._now) + nbytes, self._now
        flow.nbytes += nbytes
        flow.tol = REL_TOLERANCE * flow.nbytes
        flow.version += 1  # its old completion entry is stale
        self._push(flow)

    def due(self) -> list[Hashable]:
        """The flows complete at the network's time (next_completion's order), for
        finish_many: flows that finish together (a server's replies) are handled at once."""
        done, out, keep = self._done, [], []
        while done:
            when, _, version, flow = done[0]
            if self._flows.get(flow.fid) is not flow or flow.version != version:
                heapq.heappop(done)  # stale
            elif when <= self._now or flow.left_at(self._now) == 0.0:
                keep.append(heapq.heappop(done))
                out.append(flow.fid)
            else:
                break
        for entry in keep:  # still valid: they leave the heap when finished
            heapq.heappush(done, entry)
        return out

    def next_completion(self) -> tuple[float, Hashable] | None:
        """(time, flow id) of the flow that completes first at the current rates (the earliest
        started among those completing at the same time), or None with no flow. A flow
        already complete reports the network's time."""
        done = self._done
        while done:
            when, _, version, flow = done[0]
            if self._flows.get(flow.fid) is flow and flow.version == version:
                # Complete within tolerance (or advanced past its end): it is due now.
                if when <= self._now or flow.left_at(self._now) == 0.0:
                    return self._now, flow.fid
                return when, flow.fid
            heapq.heappop(done)
        return None

    def rate(self, flow_id: Hashable) -> float:
        """A flow's rate now, bytes per second (0 for a zero-byte flow, inf for a flow with
        neither ports nor cap)."""
        return self._flows[flow_id].rate

    def remaining(self, flow_id: Hashable) -> float:
        """A flow's bytes still to move at the network's time (0 once complete)."""
        return self._flows[flow_id].left_at(self._now)

    def _push(self, flow: _Flow) -> None:
        heapq.heappush(self._done, (flow.finish_time(), flow.seq, flow.version, flow))
        if len(self._done) > 4 * len(self._flows) + 64:
            # Mostly stale entries (rates change more often than flows complete): rebuild, so
            # the heap stays O(flows) in size.
            self._done = [(f.finish_time(), f.seq, f.version, f) for f in self._flows.values()]
            heapq.heapify(self._done)

    def _component(self, ports: Iterable[int], new: list[_Flow]) -> tuple[list[_Flow],
                                                                        list[int]]:
        """The flows and ports reachable from `ports` through shared ports (in a deterministic
        order), plus the `new` flows (which may have no ports)."""
        flows: list[_Flow] = list(new)
        seen_flows = {id(f) for f in new}
        queue = list(dict.fromkeys(ports))
        seen_ports = set(queue)
        component_ports: list[int] = []
        on_port = self._on_port
        while queue:
            p = queue.pop()
            component_ports.append(p)
            for f in on_port[p].values():
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
        self.last_recompute = len(flows)
        if len(flows) == 1:  # alone on its ports
            self._set_rate(flows[0], self._bound(flows[0]))
            return
        on_port = self._on_port
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

    def _bound(self, f: _Flow) -> float:
        """A flow's rate alone on its ports: its narrowest port, or its cap."""
        return min([f.cap, *(self._capacity[p] for p in f.ports)])

    def _set_rate(self, f: _Flow, rate: float) -> None:
        if rate != f.rate:
            # Bank the progress at the old rate up to now, then go on at the new one.
            f.left = f.left_at(self._now)
            f.at = self._now
            f.rate = rate
            f.version += 1
            self._push(f)


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


class _Message:
    __slots__ = ("dst", "eager", "key", "nbytes", "payload", "sent_at", "seq", "src")

    def __init__(self, src, dst, key, nbytes, payload, sent_at, seq, eager):
        self.src, self.dst, self.key = src, dst, key
        self.nbytes, self.payload, self.sent_at = nbytes, payload, sent_at
        self.seq, self.eager = seq, eager

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
        self._stream: dict[tuple, deque[_Message]] = {}
        self._to_dst: dict[tuple, OrderedDict[int, _Message]] = {}
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
        seq, self._seq = self._seq, self._seq + 1
        # Invariant: a receive waits only while no message it could take does, so a new
        # message either pairs with the earliest posted receive that can take it or waits.
        receive = self._take_receive(src, dst, key)
        if receive is not None:  # matched at once: no _Message to keep
            return [_match(src, dst, key, nbytes, payload, t, receive, eager)]
        message = _Message(src, dst, key, nbytes, payload, t, seq, eager)
        stream = (src, dst, key)
        self._stream.setdefault(stream, deque()).append(message)
        self._to_dst.setdefault((dst, key), OrderedDict())[message.seq] = message
        if eager:
            self._waiting_eager += 1
            return [message.match(None)]
        self._waiting_sends += 1
        return []

    def post_receive(self, dst: int, src: int, key: Hashable, t: float) -> list[Match]:
        """A receive posted by dst at time t for a message from src (or ANY) with `key`;
        returns the Match it completes, if a message was waiting (see the class docstring
        for an eager one)."""
        message = self._take_message(src, dst, key)
        if message is None:
            self._seq += 1
            queues = self._any if src == ANY else self._receives
            where = (dst, key) if src == ANY else (src, dst, key)
            waiting = queues.get(where)
            if waiting is None:
                waiting = queues[where] = deque()
            waiting.append((self._seq, t))
            self._waiting_receives += 1
            return []
        if message.eager:
            self._waiting_eager -= 1
        else:
            self._waiting_sends -= 1
        return [message.match(t)]

    def pending(self) -> Pending:
        return Pending(self._waiting_sends, self._waiting_eager, self._waiting_receives)

    def _take_receive(self, src: int, dst: int, key: Hashable) -> float | None:
        """Remove the earliest posted receive that takes a message src -> dst with key (from
        src or from ANY); returns its time, or None."""
        own = self._receives.get((src, dst, key))
        anyq = self._any.get((dst, key))
        if own and (not anyq or own[0][0] < anyq[0][0]):
            queue, where, queues = own, (src, dst, key), self._receives
        elif anyq:
            queue, where, queues = anyq, (dst, key), self._any
        else:
            return None
        _, t = queue.popleft()
        if not queue:
            del queues[where]  # no empty queues left behind (keys are many over a run)
        self._waiting_receives -= 1
        return t

    def _take_message(self, src: int, dst: int, key: Hashable) -> _Message | None:
        """Remove the unmatched message a receive (dst, src or ANY, key) takes, or None."""
        to_dst = self._to_dst.get((dst, key))
        if not to_dst:
            return None
        if src == ANY:
            message = next(iter(to_dst.values()))  # the earliest sent, over every source
            stream = (message.src, dst, key)
        else:
            stream = (src, dst, key)
            if stream not in self._stream:
                return None
            message = self._stream[stream][0]
        queue = self._stream[stream]
        # A stream's messages are in send order in both structures, so the one a receive
        # takes is always its stream's head.
        assert queue[0] is message
        queue.popleft()
        if not queue:
            del self._stream[stream]
        del to_dst[message.seq]
        if not to_dst:
            del self._to_dst[(dst, key)]
        return message
