"""Synchronous patterns: a protocol declares who meets whom at iteration k; its event path, its
lockstep path and its fair transport's flows all follow from that one declaration.

- `Collective`: iteration k is either a local step (over when its gradient is ready) or every
  worker meeting in ring all-reduces of declared sizes (`sizes(k)`): All-Reduce, local SGD,
  DiLoCo.
- `GroupAverage`: iteration k partitions the workers into groups (`groups(k)`), each meeting
  in a P-Reduce of the model: prague-static's schedule.
- `NeighbourExchange`: iteration k of worker x sends its model to its out-neighbours and waits
  for its in-neighbours' models of iteration k (`make_exchange()`: the graph the real step
  uses): D-PSGD, SGP; OSGP keeps its own waits on it.

The math stays the algorithm's (`learn`); a pattern only says when steps end.
"""

from __future__ import annotations

import itertools

import numpy as np

from hetbench.sim.protocol import Meetings, Protocol, Steps


class Collective(Protocol):
    """Iteration k: a local step (`sizes(k)` is None), or every worker waits for the last one
    and then runs one ring all-reduce per entry of `sizes(k)` (bytes, in turn) over all
    workers, as the real step's collective over the worker ranks does."""

    transport_ready = True
    lockstep = True

    def __init__(self, engine):
        super().__init__(engine)
        self.arrived: list[int] = []
        #: Collectives held so far (every worker met), for a protocol's counters.
        self.collectives = 0

    def sizes(self, k: int) -> tuple[float, ...] | None:
        """The ring all-reduces of iteration k in bytes, or None: a local step."""
        raise NotImplementedError

    def ready(self, w):
        sizes = self.sizes(self.engine.iteration[w])
        if sizes is None:
            self.engine.end_step(w, self.engine.now, 0.0, peers=0)
            return
        self.arrived.append(w)
        if len(self.arrived) < self.n:
            return
        self.collectives += 1
        start = self.engine.now  # events run in time order: the last arrival is now
        arrived, self.arrived = self.arrived, []
        self.after_rings(range(self.n), sizes, start, self._met, start, arrived)

    def _met(self, end, start, arrived):
        for x in arrived:
            self.engine.end_step(x, end, start - self.engine.t_sync[x], peers=self.n - 1,
                                 staleness=0.0)

    def step_all(self, k, t_sync, full):
        sizes = self.sizes(k)
        if sizes is None:
            return Steps(t_sync.copy(), np.zeros(self.n), 0, staleness=None)
        self.collectives += 1
        start = float(t_sync.max())
        end = self.net.rings(range(self.n), sizes, start, self.n)
        return Steps(np.full(self.n, end), start - t_sync, self.n - 1)


def meeting_key(k: int, group: tuple[int, ...]) -> tuple[int, int]:
    """The Meetings key of step k's `group`: a step's groups partition the workers, so its
    first member names it. (Not the members: a tuple does not keep its hash, and a static
    schedule's 4,096-member group was hashed at each member's join, O(g^2) a step.)"""
    return k, group[0]


class GroupAverage(Protocol):
    """Iteration k: the workers split into the groups of `groups(k)`; a group of two or more
    waits for its last member and meets in a P-Reduce (a ring all-reduce of the model over
    its members, after a communicator's set-up on a member-set cache miss: Meetings, which
    the event path joins and the lockstep path counts alike); a worker alone ends its step at
    once, waiting for nobody. `group_fields(k, group)`: the event line's fields of a member's
    step (default none)."""

    transport_ready = True
    lockstep = True

    def __init__(self, engine):
        super().__init__(engine)
        self.meetings = Meetings(self)
        self._by_step: dict[int, dict[int, tuple[int, ...]]] = {}

    def groups(self, k: int) -> list[tuple[int, ...]]:
        """Iteration k's groups: every worker in exactly one, members sorted."""
        raise NotImplementedError

    def group_fields(self, k: int, group: tuple[int, ...]) -> dict | None:
        return None

    def group_of(self, w: int, k: int) -> tuple[int, ...]:
        """Worker w's group at iteration k. groups(k) is computed once per k (n workers each
        searching it would cost O(n^2) per iteration) and kept while workers can still be at
        that iteration (64 behind the newest asked for)."""
        by_worker = self._by_step.get(k)
        if by_worker is None:
            by_worker = self._by_step[k] = {x: g for g in self.groups(k) for x in g}
            self._by_step.pop(k - 64, None)
        return by_worker[w]

    def ready(self, w):
        k = self.engine.iteration[w]
        group = self.group_of(w, k)
        self.meet(w, k, group, self.group_fields(k, group))

    def meet(self, w: int, k: int, group: tuple[int, ...], fields) -> None:
        """The event path: worker w, whose gradient is ready now, joins its group of step k
        (`fields`: its event line's, or None for a step that records none)."""
        if len(group) < 2:
            self.engine.end_step(w, self.engine.now, 0.0, fields, peers=0)
        else:
            self.meetings.join(meeting_key(k, group), group, w, self.engine.now, fields)

    def met(self, w, end, wait_s, fields, peers, staleness):
        self.engine.end_step(w, end, wait_s, fields, peers=peers, staleness=staleness)

    def step_all(self, k, t_sync, full):
        """Every worker's step k (in training a group's members are at the same iteration:
        staleness 0, as Meetings computes)."""
        n, net = self.n, self.net
        groups = self.groups(k)
        t_end = t_sync.copy()  # a worker alone ends its step at once, waiting for nobody
        wait_s = np.zeros(n)
        peers = np.zeros(n, dtype=np.int64)
        met = [g for g in groups if len(g) > 1]
        if met:
            members = np.fromiter(itertools.chain.from_iterable(met), dtype=np.int64)
            sizes = np.array([len(g) for g in met])
            bounds = np.concatenate(([0], np.cumsum(sizes)[:-1]))
            arrived = t_sync[members]
            start = np.maximum.reduceat(arrived, bounds)
            cost = {size: net.ring_allreduce(self.model_bytes, size, n)
                    for size in set(sizes.tolist())}
            setup = net.group_setup_s
            meetings = self.meetings
            ends = []
            for group, begin in zip(met, start.tolist(), strict=True):
                end = begin + cost[len(group)]
                if meetings.caches.use(group):
                    meetings.hits += 1
                else:
                    meetings.misses += 1
                    end += setup
                ends.append(end)
            starts_each = np.repeat(start, sizes)
            t_end[members] = np.repeat(ends, sizes)
            wait_s[members] = starts_each - arrived
            peers[members] = np.repeat(sizes - 1, sizes)
        fields = staleness = None
        if full:
            fields = [None] * n
            for group in groups:
                entry = self.group_fields(k, group)
                for x in group:
                    fields[x] = entry
            staleness = [0.0 if p else None for p in peers.tolist()]
        return Steps(t_end, wait_s, peers, 0.0 if staleness is None else staleness, fields)


class NeighbourExchange(Protocol):
    """Iteration k of worker x ends one message after all of its neighbours' k-th models (on
    a time-varying graph: its in- and out-peers of iteration k, whose receive its send waits
    for).

    `make_exchange()` returns the real step's graph: `links(rank, k)` -> (send to, receive
    from), `at(rank, k)` -> the same and the mixing row {j: W_rank,j}, `rounds` (iterations
    after which the links repeat), `time_varying`, and `graph` (a static graph's neighbours
    per rank) or `shifts(k)` (a time-varying graph's offsets d: x sends to x + d and receives
    from x - d)."""

    transport_ready = True
    lockstep = True
    #: The real step's message tag: the fair transport's stream of the exchange.
    message_tag = 0
    #: A static graph with more edges than this is played event by event (the lockstep's
    #: neighbour index, workers x the largest degree, would not be small).
    LOCKSTEP_EDGES = 1 << 22

    def __init__(self, engine):
        super().__init__(engine)
        self.exchange = self.make_exchange()
        #: Under transport = "fair": the receives and sends each worker's step still waits for.
        self._unfinished = [0] * self.n
        if self.lockstep and not self.exchange.time_varying:
            self._static_neighbours()
        #: ready_at[w][k]: when w's k-th gradient was ready (its k-th model sent).
        self.ready_at: list[list[float]] = [[] for _ in range(self.n)]
        self._partner_tables: dict[int, list] = {}
        self.waiting = [False] * self.n
        #: On a cluster's network (its NIC queues): each message is queued when its sender
        #: posts it, as the emulator does, not when its receiver's exchange begins (that
        #: booked a ring's messages in receiver order and held NICs idle meanwhile).
        #: delivered[(src, dst, k)]: when src's k-th model reaches dst; out[(x, k)]: when x's
        #: k-th sends are out of its NIC.
        self.sends_queue = self.net.queues_at_nics
        self.delivered: dict[tuple[int, int, int], float] = {}
        self.out: dict[tuple[int, int], float] = {}
        #: mixing(k)'s rows per phase of the graph.
        self._mixing_rows: dict[int, tuple] = {}

    def make_exchange(self):
        """The real step's graph (see the class)."""
        raise NotImplementedError

    def _partners(self, x: int, k: int) -> tuple[tuple[int, ...], tuple[int, ...], int]:
        """(x's in-peers at iteration k, everyone x's iteration k waits for, how many x sends
        to), built once per phase of the graph for every rank, not per worker-iteration. The
        partners come in the order the set of them iterates, as when one was built per call:
        the order in which waiting partners are tried is the order of their events."""
        phase = k % self.exchange.rounds
        table = self._partner_tables.get(phase)
        if table is None:
            table = self._partner_tables[phase] = [
                (receive_from, tuple(set(send_to) | set(receive_from)), len(send_to))
                for send_to, receive_from in (self.exchange.links(r, k) for r in range(self.n))]
        return table[x]

    def ready(self, w):
        k = len(self.ready_at[w])
        self.ready_at[w].append(self.engine.now)
        if self.transport is not None:
            self._exchange_fair(w, k)
            return
        if self.sends_queue:
            out = self.engine.now
            for j in self.exchange.links(w, k)[0]:
                sent, self.delivered[(w, j, k)] = self.net.post(w, j, self.model_bytes,
                                                                self.engine.now)
                out = max(out, sent)
            self.out[(w, k)] = out
        self.waiting[w] = True
        self._try(w)
        # Only workers whose iteration-k partners include w can have been waiting on it (the
        # relation is symmetric: w sends to x iff x receives from w).
        for j in self._partners(w, k)[1]:
            if self.waiting[j]:
                self._try(j)

    def _exchange_fair(self, w: int, k: int) -> None:
        """The real step under transport = "fair": a receive posted for each in-neighbour's
        model, an isend to each out-neighbour (which moves once that neighbour's step posts
        its receive), and the step ends when every one is done."""
        send_to, receive_from = self.exchange.links(w, k)
        transport, now, tag = self.transport, self.engine.now, self.message_tag
        self._unfinished[w] = len(send_to) + len(receive_from)
        for j in receive_from:
            transport.post_receive(w, j, tag)
        for j in send_to:
            transport.send(w, j, self.model_bytes, now, (self._done_one, j),
                           sent=(self._done_one, w), key=tag)
        if not self._unfinished[w]:
            self._done_one(w, 0)

    def _done_one(self, x: int, count: int = 1) -> None:
        self._unfinished[x] -= count
        if self._unfinished[x]:
            return
        k = self.engine.iteration[x]
        receive_from, partners, _ = self._partners(x, k)
        mine = self.ready_at[x][k]
        latest = max((self.ready_at[j][k] for j in partners if len(self.ready_at[j]) > k),
                     default=mine)
        self.engine.end_step(x, self.engine.now, max(latest - mine, 0.0),
                             peers=len(receive_from), staleness=0.0, peer_ranks=partners)

    def _try(self, x):
        k = self.engine.iteration[x]
        ready_at = self.ready_at
        receive_from, partners, _ = self._partners(x, k)
        if any(len(ready_at[j]) <= k for j in partners):
            return
        latest = max(ready_at[j][k] for j in partners)
        mine = ready_at[x][k]
        self.waiting[x] = False
        if self.sends_queue:
            end = max(latest, mine, self.out.pop((x, k)),
                      *(self.delivered.pop((j, x, k)) for j in receive_from))
        else:
            end = self.net.exchange(x, receive_from, self.model_bytes, max(latest, mine),
                                    self.engine.active)
        # The ranks it met, as a real step's Comm records them: its in- and out-neighbours.
        self.engine.end_step(x, end, latest - mine, peers=len(receive_from), staleness=0.0,
                             peer_ranks=partners)

    def mixing(self, k: int):
        """Every worker's mixing row at iteration k as (peers, weights), [workers, m]: its own
        model first, then its in-neighbours' in the real step's order; cached per phase (for
        a learning half: learner.mix(*self.mixing(k)))."""
        import torch

        cache = self._mixing_rows
        phase = k % self.exchange.rounds
        if phase not in cache:
            rows = []
            for r in range(self.n):
                _, receive_from, weights = self.exchange.at(r, k)
                rows.append([(r, weights[r]), *((j, weights[j]) for j in receive_from)])
            width = max(len(row) for row in rows)
            peers = torch.tensor([[j for j, _ in row] + [row[0][0]] * (width - len(row))
                                  for row in rows])
            weights = torch.tensor([[w for _, w in row] + [0.0] * (width - len(row))
                                    for row in rows], dtype=torch.float32)
            cache[phase] = (peers, weights)
        return cache[phase]

    def step_all(self, k, t_sync, full):
        exchange = self.exchange
        if exchange.time_varying:
            # In-peers (x - d) % n and out-peers (x + d) % n of every shift d: rolled copies.
            offsets = exchange.shifts(k)
            latest = np.roll(t_sync, -offsets[0])
            for d in offsets:
                latest = np.maximum(np.maximum(latest, np.roll(t_sync, -d)), np.roll(t_sync, d))
            degree = len(offsets)
        else:
            # Each row: x's neighbours, padded with x itself (changes neither the step's begin,
            # max(latest, mine), nor its clipped wait, max(latest - mine, 0)).
            latest = t_sync[self._neighbours].max(axis=1)
            degree = self._degree
        begin = np.maximum(latest, t_sync)
        met = [self._partners(x, k)[1] for x in range(self.n)] if full else None
        return Steps(begin + self.net.exchange_s(degree, self.model_bytes, self.n),
                     latest - t_sync, degree, peer_ranks=met)

    def _static_neighbours(self) -> None:
        graph = self.exchange.graph
        widest = max(len(peers) for peers in graph)
        if widest * self.n > self.LOCKSTEP_EDGES:
            self.lockstep = False
            return
        self._neighbours = np.array([(*peers, *[x] * (widest - len(peers)))
                                     for x, peers in enumerate(graph)], dtype=np.int64)
        self._degree = np.array([len(peers) for peers in graph], dtype=np.int64)
