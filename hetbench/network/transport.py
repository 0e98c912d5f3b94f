"""Messages on a modeled cluster as they move under gloo and TCP, delivered by callback: the
`[network]` table's `transport = "fair"` (issue 58), one model for both of its players:
`bench sim` drives it on its simulated clock (sim/engine.py), and the emulator of real runs on
the host's clock, in a service every rank of the run talks to (network/fair_service.py).

Under the default, "fcfs" (the model every result before it used), a protocol computes its
messages' times itself when it sends them (ClusterNetwork.post: a message moves as soon as
it is posted and holds its NIC ports for its whole bytes' time, first come first served), so
a message's end is known when it is sent. Real transports do neither. gloo's TCP pairs hand a
message over only once its receiver has posted a matching receive (a send waits for the
receiver's NOTIFY_RECV_READY, whatever its size), and TCP flows that cross one NIC share it.
Under "fair" a message waits for a receive the protocol posted (`post_receive`,
network/flows.Rendezvous), then moves as a flow whose rate is its max-min fair share of the NIC
ports it crosses (network/flows.FlowNetwork), recomputed whenever a flow starts or ends, and
is delivered a link latency after its last byte left. Its end is known only when it comes, so
the protocol is told by callback: `delivered` when it arrives, and `sent` when its sender's
send returns: once the rest of its bytes fit in the sender's socket buffer (gloo's send
completes when its bytes are written to the socket, not when they leave the NIC), at once for
a message of at most SOCKET_BUFFER_BYTES.

A collective (`rings`: ring all-reduces over a set of members, one after another) moves as one
flow per edge of its ring, each carrying the bytes the ring sends over that edge (2 (m - 1) / m
of each all-reduce's bytes for m members), all started when the last member is in; it ends when
its last edge's flow has moved, plus each ring step's latency. A real ring's steps wait for
their slowest edge, so its edges move in lockstep; here an edge that shares no port with other
traffic may finish early and leave its ports idle sooner than the real ring would. On links the
ring has to itself, that is the ring formula (ClusterNetwork.ring): every edge at its rate.

A protocol that plays "fair" must post every receive its real half posts, when it posts it (a
message nobody receives never moves; a request's reply, whose receive is always posted when
it is sent, may skip the matching: `request` and `reply`, which give the same times), send its
collectives through `rings` (Protocol.after_rings does either), and says so with
`Protocol.transport_ready`; the engine refuses "fair" for the others.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Hashable

from hetbench.network.flows import ANY, FlowNetwork, Rendezvous
from hetbench.network.model import GBIT, egress, ingress

__all__ = ["ANY", "Transport"]

#: A TCP socket's send buffer: Linux's autotuning maximum on this project's machines
#: (sysctl net.ipv4.tcp_wmem: 4096 16384 4194304).
SOCKET_BUFFER_BYTES = 4 * 2**20


class _Share:
    """A lone flow's terms from its last pair on (Transport._pair): from `at`, with `moved`
    of its bytes out then, at `rate` until `until` (when the first of the pair ends), then at
    its bound; `partner` the pair's other flow, until one of them is delivered or handed
    over (no cycle is left for the collector, which is off during a run)."""

    __slots__ = ("at", "moved", "partner", "rate", "until")

    def __init__(self, at, moved, rate, until, partner):
        self.at, self.moved, self.rate, self.until, self.partner = (at, moved, rate, until,
                                                                    partner)


class _Lone:
    """A flow the transport times itself, without the FlowNetwork: alone on its ports since
    `start` at its rate alone (`bound`), or on its `share`'s terms since its last pair. Its
    `first` bytes are out at `sent_at` (its send returns, `returned` once it has), and its
    `rest` (the socket buffer's) at `end`. `live` until it has been delivered (a ring's
    edge, `ring`: counted at its ring's end) or handed over to the FlowNetwork. Its clock
    callbacks carry its share as it was when they were timed: a pair re-times the older flow
    under a new share, and the callbacks of its old times are stale."""

    __slots__ = ("bound", "delivered", "end", "first", "link", "live", "rest", "returned",
                 "ring", "sent", "sent_at", "seq", "share", "start")

    def __init__(self, seq, link, first, sent, delivered, rest, rate, start):
        self.seq, self.link = seq, link
        self.first, self.sent, self.delivered, self.rest = first, sent, delivered, rest
        self.start, self.bound = start, rate
        # The times the FlowNetwork would give it: finish_time() of `first` bytes from start,
        # then of `rest` more from there (extend).
        self.sent_at = start + first / rate
        self.end = self.sent_at + rest / rate if rest > 0 else self.sent_at
        self.live, self.returned, self.ring = True, False, False
        self.share: _Share | None = None

    def moved_at(self, t: float) -> float:
        """Its bytes out by time t (>= its start, and its share's `at`)."""
        share = self.share
        if share is None:
            return self.bound * (t - self.start)
        if t <= share.until:
            return share.moved + share.rate * (t - share.at)
        return (share.moved + share.rate * (share.until - share.at)
                + self.bound * (t - share.until))

    def time_of(self, nbytes: float) -> float:
        """When `nbytes` of its bytes are out (at least those out at its share's `at`)."""
        share = self.share
        if share is None:
            return self.start + nbytes / self.bound
        switch = share.moved + share.rate * (share.until - share.at)
        if nbytes <= switch:
            return share.at + (nbytes - share.moved) / share.rate
        return share.until + (nbytes - switch) / self.bound


def _pair_rates(capacity: float, a: float, b: float) -> tuple[float, float]:
    """The max-min rates of two flows that share one port of `capacity`, a and b their rates
    alone (each of their other ports carries it alone): the even share, unless one's own
    bound is below it and leaves the other more."""
    half = capacity / 2
    if a >= half and b >= half:
        return half, half
    if a <= b:
        return a, min(b, capacity - a)
    return min(a, capacity - b), b


class Transport:
    """One run's fair transport over its Cluster (network/model.py), on a clock `engine`:
    `engine.now` (the current event's time, in cluster seconds) and `engine.at(t, fn, *args)`
    (call fn(*args) at time t; callbacks of one time in the order they were scheduled).

    `shortcuts=False` puts every flow into the FlowNetwork at once, with its rates set as it
    starts: the reference that lone flows and settled starts are tested against (they give
    the same times, and differ only in the order of callbacks due at one instant)."""

    def __init__(self, engine, cluster, shortcuts: bool = True):
        self.engine, self.cluster = engine, cluster
        self._shortcuts = shortcuts
        #: Per NIC port, its bandwidth (the FlowNetwork's capacities; a pair's shared port).
        self._capacity = [cluster.nic_rate(p // 2) for p in range(cluster.ports)]
        self.flows = FlowNetwork(self._capacity)
        # gloo moves no message before its receive is posted, whatever its size.
        self.rendezvous = Rendezvous(eager_bytes=0.0)
        self._ids = itertools.count()
        #: Flow id -> ((its ports, cap, latency), the sent callback or None, the delivered
        #: callback, the bytes still to add once `sent` is called: the same flow, extended).
        self._moving: dict[int, tuple] = {}
        #: The pending completion check's number: a newer one makes older ones stale.
        self._check = 0
        #: When the pending check runs (inf: none pending).
        self._check_at = float("inf")
        #: Whether a _settled call is pending at this instant.
        self._settling = False
        #: _link's answers, as messages ask: per source rank, by destination (no pair's
        #: tuple to build at each message).
        self._links: list[dict[int, tuple]] = [{} for _ in range(cluster.ports // 2)]
        #: Per rank, its requests whose reply is still to come (request, reply).
        self._requests = [0] * (cluster.ports // 2)
        #: The inter-node link's rate, which bounds every flow between nodes.
        self._inter = cluster.config.inter_gbps * GBIT
        #: Per port, the lone flow (_Lone) last started on it, if any: it holds the port
        #: while it is live and its end is still ahead.
        self._held: list[_Lone | None] = [None] * cluster.ports

    def send(self, src: int, dst: int, nbytes: float, at: float, delivered: tuple,
             sent: tuple | None = None, key: Hashable = 0) -> None:
        """A message of nbytes from src to dst, posted at `at` (>= now) on stream `key`:
        `delivered` = (fn, *args) is called when it arrives, `sent` = (fn, *args) when its
        bytes are out of src."""
        if at > self.engine.now:
            self.engine.at(at, self._send, src, dst, nbytes, delivered, sent, key)
        else:
            self._send(src, dst, nbytes, delivered, sent, key)

    def send_then_receive(self, src: int, dst: int, nbytes: float, delivered: tuple,
                          key: Hashable, receive_from: int, receive_key: Hashable) -> None:
        """Deprecated, kept for plugins' protocols: a blocking send from src now, then src's
        receive from `receive_from` (a peer, or ANY) on `receive_key` once it returns. Pass
        sent=(transport.post_receive, src, receive_from, receive_key) to `send` instead, or
        for a request and its reply use `request` and `reply`."""
        warnings.warn("Transport.send_then_receive is deprecated: pass sent=(transport."
                      "post_receive, src, receive_from, receive_key) to send, or use request "
                      "and reply", DeprecationWarning, stacklevel=2)
        self._send(src, dst, nbytes, delivered, (self._receive, src, receive_from, receive_key),
                   key)

    def request(self, src: int, dst: int, nbytes: float, delivered: tuple, key: Hashable,
                reply_key: Hashable) -> None:
        """A request from src to dst on stream `key` (a push to a server, an active peer's
        request), sent blocking; then src receives dst's reply on `reply_key`, which dst sends
        with `reply` once the request has arrived, and src posts no other receive on that
        stream meanwhile. The real loop posts the reply's receive once the send returns, so
        the reply, sent after the request arrived (after the send returned), always finds it
        posted and nothing competes for it: here it moves from its send, without the
        Rendezvous (the same times, two matches fewer a round trip). A test plays both
        through the Rendezvous and holds them equal."""
        self._requests[src] += 1
        self._send(src, dst, nbytes, delivered, None, key)

    def reply(self, src: int, dst: int, nbytes: float, delivered: tuple, key: Hashable,
              sent: tuple | None = None) -> None:
        """src's reply to dst's `request`, which has arrived, sent now on stream `key` (the
        request's reply_key): dst's receive is posted, so its bytes move at once. `sent` =
        (fn, *args) when src's send returns, as send's (a server's next receive)."""
        if not self._requests[dst]:
            raise RuntimeError(f"rank {src} replied to rank {dst}, which has no request "
                               "waiting for a reply")
        self._requests[dst] -= 1
        self._start(src, dst, nbytes, delivered, sent)

    def post_receive(self, dst: int, src: int, key: Hashable = 0,
                     at: float | None = None) -> None:
        """dst posts a receive from src (or ANY source) on stream `key` at `at` (default now):
        the first message of that stream not yet received may move."""
        if at is not None and at > self.engine.now:
            self.engine.at(at, self._receive, dst, src, key)
        else:
            self._receive(dst, src, key)

    def rings(self, members, sizes, at: float, done: tuple, broadcast: bool = False) -> None:
        """Ring all-reduces of each of `sizes` bytes in turn over `members` (with `broadcast`:
        pipelined ring broadcasts, m - 1 steps of a chunk each), all in from `at` (>= now):
        done = (fn, *args) is called when the last one ends."""
        self._later(at, self._rings, tuple(sorted(set(members))), tuple(sizes), done,
                    broadcast)

    # -- fair ------------------------------------------------------------------------------
    def _rings(self, ranks, sizes, done, broadcast=False) -> None:
        now = self.engine.now
        m = len(ranks)
        if m < 2 or not sizes:
            done[0](*done[1:])
            return
        steps = m - 1 if broadcast else 2 * (m - 1)
        edge_bytes = steps * sum(sizes) / m
        latency, shared = 0.0, []
        ring = [m, 0.0, done]  # edges still moving, the ring's latency, the callback
        # The edges timed here (inside a node, or alone on their ports) are counted in one
        # callback at the last one's end, not one each: only the ring's end is observed.
        timed, lones, last = 0, [], now
        for i, src in enumerate(ranks):
            dst = ranks[(i + 1) % m]
            link_s, rate, inside, (ports, cap, _), bound = self._link(src, dst)
            latency = max(latency, link_s)
            if inside:  # the node's bus: shared with nobody
                timed += 1
                last = max(last, now + edge_bytes / rate)
                continue
            # The ring adds its steps' latency at its end. Its edges share no port with each
            # other (each rank sends to one and receives from one).
            edge = ((ports, cap, 0.0), edge_bytes, None, (self._edges_done, ring, 1), 0.0)
            # A ring's edge is timed here only alone: its end is counted with its ring's, so
            # it is never re-timed in a pair.
            if edge_bytes > 0 and self._shortcuts and self._company(ports, now) == ():
                lone = self._hold(*edge, bound, now)
                lone.ring = True
                lones.append(lone)
                last = max(last, lone.end)
            else:
                self._claim(ports, now)
                shared.append(self._flow(*edge))
        ring[1] = steps * len(sizes) * latency
        if timed or lones:
            self.engine.at(last, self._timed_edges_done, ring, timed, lones)
        if shared:
            self.flows.start_checked(now, shared)
            self._schedule()

    def _timed_edges_done(self, ring: list, timed: int, lones: list[_Lone]) -> None:
        """The ring's edges timed here are in: each lone one not handed over since (a handed
        over edge is counted by the FlowNetwork's completion, at its own end)."""
        for lone in lones:
            if lone.live:
                lone.live = False
                timed += 1
        if timed:
            self._edges_done(ring, timed)

    def _edges_done(self, ring: list, edges: int) -> None:
        ring[0] -= edges
        if ring[0] == 0:
            self._later(self.engine.now + ring[1], *ring[2])

    def _later(self, at: float, fn: Callable, *args) -> None:
        if at > self.engine.now:
            self.engine.at(at, fn, *args)
        else:
            fn(*args)

    def _send(self, src, dst, nbytes, delivered, sent, key) -> None:
        if self.rendezvous.offer(src, dst, key, nbytes, self.engine.now, (delivered, sent)):
            self._start(src, dst, nbytes, delivered, sent)

    def _receive(self, dst, src, key) -> None:
        message = self.rendezvous.take(dst, src, key, self.engine.now)
        # Most receives are posted before their message is sent; an eager message that was
        # waiting has moved since its send.
        if message is not None and not message.eager:
            self._start(message.src, dst, message.nbytes, *message.payload)

    def _start(self, src, dst, nbytes, delivered, sent) -> None:
        """A matched message's flow, from now: over both NICs between nodes (limited to the
        inter-node link as well); inside a node, at the node's bus rate with no flow (the
        model does not share the bus, as it does not queue there). A message larger than the
        socket buffer returns its send once the rest fits, and its flow goes on with the
        buffer's bytes; one whose return nobody waits for (`sent` None) moves as one phase."""
        engine = self.engine
        now = engine.now
        latency, rate, inside, link, bound = self._links[src].get(dst) or self._link(src, dst)
        if inside:
            engine.at(now + nbytes / rate + latency, *delivered)
            if sent is not None:
                if nbytes > SOCKET_BUFFER_BYTES:
                    engine.at(now + (nbytes - SOCKET_BUFFER_BYTES) / rate, *sent)
                else:
                    sent[0](*sent[1:])
            return
        if nbytes > SOCKET_BUFFER_BYTES and sent is not None:
            # Returns once the rest fits in the buffer; the buffer's bytes go on after.
            first, rest, returned = nbytes - SOCKET_BUFFER_BYTES, SOCKET_BUFFER_BYTES, None
        else:  # nobody waits for its return (or it fits): one phase of all its bytes
            first, rest, returned, sent = nbytes, 0.0, sent, None
        ports = link[0]
        company = self._company(ports, now) if nbytes > 0 and self._shortcuts else None
        if company is not None:
            lone = self._hold(link, first, sent, delivered, rest, bound, now)
            if company:
                self._pair(*company, lone, now)
            share = lone.share  # _time's, written out: one call fewer a message
            if rest > 0:
                engine.at(lone.sent_at, self._lone_sent, lone, share)
            engine.at(lone.end + latency, self._lone_delivered, lone, share)
        else:
            self._claim(ports, now)
            fid, ports, nbytes, cap = self._flow(link, first, sent, delivered, rest)
            if nbytes > 0 and self._shortcuts:
                # Its rate is set with those of the others that start at this instant (a
                # server's replies, an incast), once these callbacks have run.
                self.flows.start_later(now, fid, ports, nbytes, cap)
                if not self._settling:
                    self._settling = True
                    engine.at(now, self._settled)
            else:
                self.flows.start_checked(now, [(fid, ports, nbytes, cap)])
                self._schedule()
        if returned is not None:
            returned[0](*returned[1:])

    # -- lone flows: timed here while alone on their ports, or two sharing one ----------------
    # Most messages of the point-to-point protocols move alone on their two NICs (a worker
    # sends one message at a time, a server takes one push at a time): such a flow moves at
    # its bound from its first byte to its last unless another flow starts on one of its
    # ports, so its send's return and its end are known at its start. It is timed by two
    # callbacks of the clock and never enters the FlowNetwork, whose completion checks cost
    # several times more; the first flow to start on one of its ports hands it over
    # (_claim), in the state the network would have kept it in. So is a pair: a message that
    # starts on a port of one lone flow and shares nothing else, as a server's blocking
    # replies do (each starts when the previous one's send returns, while that one's socket
    # buffer still leaves the same NIC): both move at their max-min rates until the first
    # ends, the other at its bound from then, all known at the pair's start.

    def _company(self, ports: tuple[int, ...], now: float) -> tuple | None:
        """What a flow starting now on `ports` would share them with: () nothing (alone),
        (lone flow, port) a lone flow it may pair with (on that port alone, not a ring's
        edge, not in a pair still sharing), None anything else (the FlowNetwork's)."""
        on_port, held = self.flows.on_port, self._held
        company = ()
        for p in ports:
            if on_port[p]:
                return None
            lone = held[p]
            if lone is not None and lone.live and lone.end > now:
                if company or lone.ring or (lone.share is not None and now < lone.share.until):
                    return None
                company = (lone, p)
        return company

    def _hold(self, link: tuple, first: float, sent, delivered: tuple, rest: float,
              bound: float, now: float) -> _Lone:
        """The record of a flow alone on its ports (_start's, a ring's edge), holding them;
        the caller times its callbacks."""
        lone = _Lone(self.flows.reserve(), link, first, sent, delivered, rest, bound, now)
        held = self._held
        for p in link[0]:
            held[p] = lone
        return lone

    def _pair(self, older: _Lone, port: int, new: _Lone, now: float) -> None:
        """`new` starts on `port`, which `older` moves on alone: both at their max-min rates
        until the first of them ends (`until`), the other at its bound from then. The older
        one is re-timed; the port is held by the one that ends last."""
        moved = older.moved_at(now)
        rates = _pair_rates(self._capacity[port], older.bound, new.bound)
        older_left, new_left = older.first + older.rest - moved, new.first + new.rest
        # Not before now: the older one may be all but out at this very instant, and
        # round-off must not put its times in the past.
        older_end = max(now, now + older_left / rates[0])
        new_end = now + new_left / rates[1]
        if older_end <= new_end:  # the older one ends first, the new one alone from then
            until, survivor = older_end, new
            older.end = older_end
            new.end = until + (new_left - rates[1] * (until - now)) / new.bound
        else:
            until, survivor = new_end, older
            new.end = new_end
            older.end = until + (older_left - rates[0] * (until - now)) / older.bound
        older.share = _Share(now, moved, rates[0], until, new)
        new.share = _Share(now, 0.0, rates[1], until, older)
        for lone in older, new:
            if lone.rest > 0 and not lone.returned:
                lone.sent_at = max(now, lone.time_of(lone.first))
        self._time(older)  # under its new share: its callbacks timed before are stale
        self._held[port] = survivor

    def _time(self, lone: _Lone) -> None:
        """The clock callbacks of a lone flow's return (if still to come) and delivery."""
        engine, share = self.engine, lone.share
        if lone.rest > 0 and not lone.returned:
            engine.at(lone.sent_at, self._lone_sent, lone, share)
        engine.at(lone.end + lone.link[2], self._lone_delivered, lone, share)

    def _lone_sent(self, lone: _Lone, share: _Share | None) -> None:
        """The first bytes are out: the send returns, the buffer's bytes go on."""
        if lone.live and lone.share is share:
            lone.returned = True
            lone.sent[0](*lone.sent[1:])

    def _lone_delivered(self, lone: _Lone, share: _Share | None) -> None:
        """Its last byte left at its end, a link latency ago."""
        if lone.live and lone.share is share:
            lone.live = False
            if share is not None:
                share.partner = None
            # The callback's arguments freed here, where they are in the cache, not when the
            # port's next flow comes.
            delivered, lone.delivered, lone.sent = lone.delivered, None, None
            delivered[0](*delivered[1:])

    def _claim(self, ports: tuple[int, ...], now: float) -> None:
        """Before a flow starts on `ports`: hand the lone flows still moving on them over to
        the FlowNetwork (their callbacks here no longer run), with the other of a pair that
        still shares a port."""
        held = self._held
        for p in ports:
            lone = held[p]
            if lone is None:
                continue
            held[p] = None
            share = lone.share
            if share is not None and now < share.until and share.partner is not None:
                self._hand_over(share.partner, now)
            self._hand_over(lone, now)

    def _hand_over(self, lone: _Lone, now: float) -> None:
        """A lone flow still moving goes on in the FlowNetwork, in the state the network
        would have kept it in: at its rate since its rate last changed."""
        if not (lone.live and lone.end > now):
            return
        lone.live = False
        fid = next(self._ids)  # its id in the network, from the hand-over
        link = lone.link
        ports, cap, _ = link
        share = lone.share
        if share is None:  # alone since its start
            at, moved, rate = lone.start, 0.0, lone.bound
        else:
            share.partner = None
            if now < share.until:  # at its share's rate since the pair began
                at, moved, rate = share.at, share.moved, share.rate
            else:  # a pair's survivor, at its bound since the other ended
                at, moved, rate = share.until, lone.moved_at(share.until), lone.bound
        if lone.rest > 0 and lone.returned:
            # Extended by its buffer's bytes at its return, as _complete does.
            nbytes = lone.first + lone.rest
            left = lone.rest if lone.sent_at >= at else nbytes - moved
            at = max(at, lone.sent_at)
            self._moving[fid] = (link, None, lone.delivered, 0.0)
        else:
            nbytes, left = lone.first, max(0.0, lone.first - moved)
            self._moving[fid] = (link, lone.sent, lone.delivered, lone.rest)
        # A flow never paired has moved alone at its bound (the network checks its ports).
        self.flows.adopt(fid, lone.seq, ports, nbytes, left, at, cap,
                         None if share is None else rate)

    def _settled(self) -> None:
        """The flows started at this instant: their rates, and the check at the next end."""
        self._settling = False
        self._schedule()

    def _link(self, src: int, dst: int) -> tuple[float, float, bool, tuple, float]:
        """(latency, rate, inside one node, (ports, cap, latency) of its flows, a flow's rate
        alone on them) from src to dst: fixed for a run under fair (no network slowdown), so
        looked up once per pair. Between nodes the NICs are shared ports and the switch's link
        bounds the flow."""
        link = self._links[src].get(dst)
        if link is None:
            cluster = self.cluster
            latency, rate = cluster.link(src, dst)
            ports = (egress(src), ingress(dst))
            link = self._links[src][dst] = (
                latency, rate, cluster.node[src] == cluster.node[dst],
                (ports, self._inter, latency), self.flows.bound(ports, self._inter))
        return link

    def _flow(self, link: tuple, nbytes: float, sent, delivered, rest: float) -> tuple:
        fid = next(self._ids)
        self._moving[fid] = (link, sent, delivered, rest)
        ports, cap, _ = link
        return fid, ports, nbytes, cap

    def _schedule(self) -> None:
        """A check at the next completion, unless one is pending no later (a check that finds
        nothing due, its flows slowed since, schedules the next)."""
        at = self.flows.next_time()
        if at is None:
            return
        engine = self.engine
        if at < engine.now:
            at = engine.now
        if at >= self._check_at:
            return
        self._check += 1
        self._check_at = at
        engine.at(at, self._complete, self._check)

    def _complete(self, check: int) -> None:
        """The flows done by now leave their ports: their senders' sends return now, and each
        message is delivered a latency later."""
        if check != self._check:  # an earlier check was scheduled since: it ran instead
            return
        self._check_at = float("inf")
        engine, flows, moving = self.engine, self.flows, self._moving
        now = engine.now
        flows.advance(now)
        finished, calls = [], []
        for fid in flows.take_due():
            link, sent, delivered, rest = moving[fid]
            if sent is not None:
                calls.append(sent)
            if rest > 0:  # the buffer's bytes, after the send returned: the same flow goes on
                moving[fid] = (link, None, delivered, 0.0)
                flows.extend(fid, rest)
                continue
            finished.append(fid)
            del moving[fid]
            if link[2] > 0:
                engine.at(now + link[2], *delivered)
            else:
                calls.append(delivered)
        if finished:
            flows.finish_checked(finished)
        self._schedule()
        for call in calls:
            call[0](*call[1:])
