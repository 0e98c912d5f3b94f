"""The contract of a simulated protocol, and the P-Reduce meetings several share.

Each algorithm's simulated protocol lives in the algorithm's own module, beside its real step,
and the Algorithm names it (`Algorithm.simulated_protocol`). A protocol is told `ready(w)` when
worker w's gradient is ready (at engine.t_sync[w]) and `finish(w, t)` when w's budget is spent;
it calls engine.end_step when w's step is over and engine.done when w's finish() would return.
Who waits for whom follows the real algorithm; groups and neighbours come from the same pure
code the real step calls (topologies, prague.schedule, prague.generator, hop's rules).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from typing import Protocol as Interface

import numpy as np


class SimEngine(Interface):
    """What a protocol sees of the engine that plays it (sim/engine.py's Engine is one): the
    clock and its heap, each worker's loop state, and the calls that end a step or a worker.
    Nothing else of the engine is a protocol's to touch."""

    config: Any  # the RunConfig
    #: Workers (not counting servers).
    n: int
    #: The current simulated time, and each worker's iteration and gradient-ready time.
    now: float
    iteration: list[int]
    t_sync: list[float]
    #: Processes in a synchronization step now (CPU sharing: NetworkModel.share).
    active: int
    #: The run's network model (sim/model.py), its fair transport or None, message layout.
    network: Any
    transport: Any
    layout: Any
    #: The workers' models when the run learns (sim/learn.py), else None.
    learner: Any
    #: A real run's recorded order (sim/recorded.py), or None.
    recorded_order: Any
    #: Whether the steps' fields are wanted (event lines written, or facts read from events).
    full_events: bool

    def at(self, t: float, fn: Callable, *args) -> None:
        """Call fn(*args) at simulated time t (>= now)."""

    def end_step(self, w: int, t_end: float, wait_s: float, fields: dict | str | None = None,
                 next_iteration: int | None = None, *, peers: int | None = None,
                 staleness: float | None = None, discarded: bool = False,
                 peer_ranks=None) -> None:
        """Worker w's step ends at t_end after waiting wait_s for peers."""

    def done(self, w: int) -> None:
        """Worker w has finished (its finish() returned)."""


@dataclass
class Steps:
    """One iteration of every worker, played at once (Protocol.step_all): worker w's step ends
    at t_end[w] after waiting wait_s[w] (end_step's arguments, as arrays)."""

    t_end: np.ndarray
    wait_s: np.ndarray
    #: The real step's StepInfo.peers: one per worker, or the same for all.
    peers: np.ndarray | int
    #: StepInfo.staleness: the same for every worker (None: not reported), or (full event
    #: lines only) one per worker.
    staleness: float | list | None = 0.0
    #: Per worker, the event line's extra fields (only asked for where fields are wanted: full
    #: event logs, or an algorithm whose summary_facts reads events).
    fields: list | None = None
    #: Per worker, the ranks its step synchronized with (StepInfo.peer_ranks; only asked for
    #: with full event logs); None: every step met every worker, or the protocol does not say.
    peer_ranks: list | None = None


class Protocol:
    """The simulated half of an algorithm: its rules in simulated time (`bench sim`).

    The default plays no synchronization (each step ends when its gradient is ready). A
    subclass overrides `ready(w)` (the event path) and, where it qualifies, `lockstep = True`
    with `step_all` (every worker's k-th step at once); `learn(k, learner)` gives it a learning
    half (`bench sim --learn`). What a protocol may read (times in simulated seconds):

    - `self.n` (workers), `self.config` (the algorithm's options), `self.model_bytes` (the
      model's size in bytes);
    - `self.engine`: `now` (the current event's time), `iteration[w]` (worker w's step
      counter), `t_sync[w]` (when w's current gradient was ready), `t_start[w]` (when its
      current iteration began), `active` (processes in a step or a server loop now: pass it to
      the costs below);
    - `self.net`, the costs: `ring(members, nbytes, at, active)` (when a ring all-reduce over
      `members` starting at `at` ends), `rings(members, sizes, at, active)` (buckets one after
      another), `exchange(x, neighbours, nbytes, at, active)` (when worker x's exchange of one
      message with each neighbour, both ways, ends) and `exchange_s(degree, nbytes, active)`
      (its duration, degree an array on a lockstep path), `message_to(src, dst, nbytes, at,
      active)` (when a message arrives, its CPU time included), `wire(src, dst, nbytes, at)`
      (without it), `p_reduce(nbytes, members, active)` (a P-Reduce's duration),
      `rpc_one_way(w)` (to a service on rank 0's node), `group_setup_s` (a communicator's
      set-up, paid on a member-set cache miss: MemberCaches). On a lockstep path, the same
      patterns as durations: `ring_allreduce(nbytes, n, active)`, `exchange_s(degree, nbytes,
      active)`, `message(nbytes, active)`, `p_reduce(nbytes, members, active)` (one formula
      per pattern: the built-ins call these too). With a `[network]` table the
      same calls answer from the cluster's links and NIC queues (`self.net.cluster` is then
      set), so a protocol written against them runs on both.

    What a protocol calls:

    - `self.engine.end_step(w, t_end, wait_s, fields=None, next_iteration=None, *, peers=None,
      staleness=None, discarded=False, peer_ranks=None)`: worker w's step ends at t_end (>= now
      and >= its gradient's ready time t_sync[w]; bench sim refuses an earlier end in one line
      naming the protocol) after waiting wait_s for peers; the keywords are what the real step's
      StepInfo says (`peer_ranks`: the ranks it synchronized with, for "who waited for whom";
      `fields`: the event line's extra fields, a dict, or encode_fields' string; formatting them
      may be skipped where `self.engine.full_events` is False. As in a real step's
      StepInfo.fields, `samples` sets the samples the step used, and a key the harness writes
      itself (core.record.HARNESS_KEYS) is refused: bench sim stops with one line naming the
      protocol);
    - `self.after_rings(members, sizes, at, then, *args)` for a collective that may play the
      `[network]` table's `transport = "fair"`: `then(end, *args)` at its end (at once
      otherwise, from `self.net.rings`); and, under fair, `self.transport.send` and
      `post_receive` for every point-to-point message and receive (network/transport.py);
    - `self.engine.done(w)` when w's finish() would return (the default finish does it);
    - `self.engine.at(t, fn, *args)` to run fn(*args) at simulated time t.

    `step_all(k, t_sync, full)` returns `Steps`: every worker's t_end and wait_s as arrays,
    its peers (an array or one int), staleness (one value, or with `full` a list per worker)
    and with `full` (the fields are wanted: event lines are written, or the algorithm's
    summary_facts reads events) `fields`, a list of one dict per worker.
    """

    #: Server processes beside the workers, always competing for the CPU (CPU sharing).
    servers = 0
    #: Whether step_all plays this protocol: worker w's k-th step ends at a time that the
    #: workers' k-th gradients alone decide, whatever order the events run in, so the engine
    #: may play iteration k of every worker at once (Engine lockstep: numpy over workers
    #: instead of a heap event per worker and step). The event path stays the reference:
    #: both must give identical results (tests/unit/test_sim_lockstep.py).
    lockstep = False

    def __init__(self, engine: SimEngine):
        self.engine = engine
        #: Release 0.1's first plugins' name of `engine`, kept for them until the next release.
        self.eng = engine
        self.n = engine.n
        self.net = engine.network
        #: A Cluster's fair transport (network/transport.py), or None (fcfs, or no Cluster).
        self.transport = engine.transport
        self.model_bytes = engine.layout.model_bytes
        self.config = engine.config.algorithm_config()

    #: Whether every point-to-point message the protocol sends on a Cluster goes through
    #: `self.transport` and it posts each receive its real half posts, when it posts it: then
    #: it plays the `[network]` table's `transport = "fair"` (engine refuses it otherwise).
    transport_ready = False
    #: work(w, k, compute_s, factor) -> (compute_s, slowdown_s, samples), or None: how much
    #: worker w computes in iteration k, for an algorithm that owns its compute
    #: (Algorithm.compute), given a whole batch's compute time and w's slowdown factor; the
    #: engine then times the step's gradient by what it returns and counts its samples. It
    #: must decide as the real half does, through the same pure rule over the same
    #: per-micro-batch durations (a micro-batch of s samples: compute_s * s / batch, times the
    #: factor; core.work.split_batch). None: the whole batch, (factor - 1) x compute slower.
    work = None
    #: learn(k, learner), the protocol's model operations for `bench sim --learn` (lockstep
    #: protocols: iteration k of every worker, on a sim.learn.Learner), or None: the
    #: algorithm has no learning half and --learn refuses it.
    learn = None
    #: True when the protocol's event handlers apply its model operations themselves, one
    #: worker's at a time, on `self.engine.learner` when the run learns (sim/learn.py's
    #: begin / gradient / worker_step / server_step / take_server / pair_average): the
    #: asynchronous protocols, whose operations happen in the order events run.
    learns_events = False
    #: learn_finish(learner, iterations), or None: the model operations the real workers'
    #: finish() does after training (SGP mixes in the messages still in flight), applied once
    #: the learned simulation's steps are over.
    learn_finish = None
    #: The P-Reduce meetings of a protocol that has them (Meetings), for its cache counters.
    meetings: Meetings | None = None

    #: recorded_order(logs, done), a classmethod: the order of this protocol's
    #: order-dependent events in a real run, read from its event logs ({worker: [event line,
    #: ...]}) and its workers' done records ({worker: done.rank<w>.json}), which the protocol
    #: then follows when the engine is given it (Engine.recorded_order; ValueError when the
    #: record does not hold it). None: the record does not determine the real order
    #: (sim/recorded.py says, per built-in, why). Lockstep protocols need none.
    recorded_order = None

    def ready(self, w: int) -> None:
        self.engine.end_step(w, self.engine.now, 0.0)

    def after_rings(self, members, sizes, at: float, then, *args) -> None:
        """Ring all-reduces of each of `sizes` bytes in turn over `members` (all in at `at`),
        then `then(end, *args)` at their end: at once, with the end the network's costs give,
        or on a fair transport when the rings' flows have moved (network/transport.py), with
        `engine.now` then the end. The one way a protocol that plays "fair" runs a
        collective."""
        if self.transport is None:
            then(self.net.rings(members, sizes, at, self.engine.active), *args)
        else:
            self.transport.rings(members, sizes, at, (self._ringed, then, args))

    def _ringed(self, then, args) -> None:
        then(self.engine.now, *args)

    def round_trip_wait(self, w: int, peer: int, push_bytes: float, pull_bytes: float,
                        since: float, end: float) -> float:
        """On a Cluster: what worker w's step from `since` to `end` waited beyond its own push
        of push_bytes to `peer` and the pull back on idle links (the rest was queues and the
        peer's turn)."""
        own = self.net.round_trip_alone(w, peer, push_bytes, pull_bytes)
        return max(end - since - own, 0.0)

    def finish(self, w: int, t: float) -> None:
        self.engine.done(w)

    def step_all(self, k: int, t_sync: np.ndarray, full: bool) -> Steps:
        """Every worker's k-th step, their k-th gradients ready at t_sync (lockstep protocols);
        `full`: the fields are wanted (engine.full_events), so fill Steps.fields."""
        raise NotImplementedError

    def stats(self) -> dict:
        """Protocol counters for the summary (e.g. P-Reduce communicator cache hits)."""
        if self.meetings is None:
            return {}
        return {"preduce_cache_hits": self.meetings.hits,
                "preduce_cache_misses": self.meetings.misses}


class Partners:
    """The event path of a protocol whose step k waits for some partners' k-th gradients (a
    gossip graph's neighbours, every worker at an averaging step): `ready(w)` notes worker w's
    arrival and returns each worker whose step can now begin, as (x, its own arrival, its
    partners' latest arrival). `partners_of(w, k)` names w's partners at iteration k (w itself
    may be among them); the relation must be symmetric, as a real exchange's is."""

    def __init__(self, engine, partners_of):
        self.engine, self.partners_of = engine, partners_of
        #: arrived[w][k]: when w's k-th gradient was ready.
        self.arrived: list[list[float]] = [[] for _ in range(engine.n)]
        self.waiting: set[int] = set()

    def ready(self, w: int) -> list[tuple[int, int, float, float]]:
        self.arrived[w].append(self.engine.now)
        self.waiting.add(w)
        k = len(self.arrived[w]) - 1
        started = []
        for x in sorted({w, *self.partners_of(w, k)} & self.waiting):
            k_x = self.engine.iteration[x]
            partners = [j for j in self.partners_of(x, k_x) if j != x]
            if any(len(self.arrived[j]) <= k_x for j in partners):
                continue
            self.waiting.discard(x)
            mine = self.arrived[x][k_x]
            started.append((x, k_x, mine, max((self.arrived[j][k_x] for j in partners),
                                              default=mine)))
        return started


class MemberCaches:
    """Every worker's LRU cache of member sets, as the real P-Reduce keeps its member
    communicators (MemberGroups, comm/preduce.py): a use is a hit when every member holds the
    set; otherwise they all build it anew. Used by the simulated P-Reduce and by the fit of its
    set-up cost from real runs (sim.fit.fit_group_setup)."""

    #: Member sets larger than this are cached under a small number of their own: a tuple
    #: does not keep its hash, and a static schedule's inter-node group of 4,096 members was
    #: hashed once per member per lookup (half of prague-static's time at 16,384 workers).
    #: The numbering keeps every distinct large set: a fixed schedule's few, or (a generator
    #: with group_size above 16) one per generated group, about 300 bytes each.
    NUMBERED_FROM = 16

    def __init__(self, workers: int, cache_size: int):
        self.cache_size = cache_size
        #: Each worker's cache, oldest use first: a plain dict (insertion-ordered; a use moves
        #: its key to the end by popping and re-inserting it) is half the cost of an
        #: OrderedDict here (16,384 of them, a miss nearly every use at that scale).
        self._caches: list[dict] = [{} for _ in range(workers)]
        self._numbers: dict[tuple[int, ...], int] = {}

    def use(self, members: tuple[int, ...]) -> bool:
        """One use of the set `members` (sorted); True when it was a hit."""
        caches = self._caches
        key = members
        if len(members) > self.NUMBERED_FROM:
            key = self._numbers.setdefault(members, len(self._numbers))
        hit, size = True, self.cache_size
        for x in members:  # each member's cache is its own: check, then update it
            cache = caches[x]
            if cache.pop(key, None) is None:
                hit = False
                if len(cache) >= size:  # room for the new set: the least recently used goes
                    del cache[next(iter(cache))]
            cache[key] = True
        return hit


class Meetings:
    """P-Reduce meetings: a group's collective starts when its last member arrives.

    The collective costs the ring formula over the members. The members keep LRU caches of
    `cache_size` member communicators (MemberCaches); if one member lacks the group's, they
    all build a new one first (network.group_setup_s; 0 unless set). The store
    claim before each use (one concurrent compare_set per member) is not charged: a
    P-Reduce on a cached communicator costs what an all-reduce of the same ranks costs, within
    the ring formula's error (docs/results/benchmarks-history.md), so the formula covers it.
    """

    def __init__(self, protocol: Protocol):
        self.protocol = protocol
        self.open: dict = {}
        self.caches = MemberCaches(protocol.n, protocol.config.cache_size)
        self.hits = self.misses = 0

    def join(self, key, members: tuple[int, ...], w: int, t: float, payload) -> bool:
        """w arrives at t for the group `key` of `members`; when all are in, the protocol's
        met(x, t_end, wait_s, payload_x, peers, staleness_x) runs for each member x: peers the
        other members, staleness_x the mean iteration gap to them (the real P-Reduce stamps
        every member's iteration in band). True once the group met."""
        arrivals = self.open.get(key)
        if arrivals is None:
            arrivals = self.open[key] = []
        arrivals.append((w, t, payload))
        if len(arrivals) < len(members):
            return False
        del self.open[key]
        if self.protocol.learns_events and (learner := self.protocol.engine.learner):
            # The P-Reduce's math: every member's model becomes the members' mean (each took
            # its own optimizer step before it asked for the group; nothing else changes a
            # waiting member's model, so averaging now is averaging when they meet).
            learner.average_groups([members])
        start = max([a[1] for a in arrivals])
        setup_s = 0.0
        if self.caches.use(members):
            self.hits += 1
        else:
            self.misses += 1
            setup_s = self.protocol.net.group_setup_s
        gaps = iteration_gaps(self.protocol.engine.iteration, members)
        if self.protocol.transport is None:  # the ring booked from the start, set-up added
            self._met(self.protocol.net.ring(members, self.protocol.model_bytes, start,
                                             self.protocol.engine.active) + setup_s,
                      start, arrivals, gaps)
        else:  # the communicator is built before the ring's bytes move
            self.protocol.after_rings(members, (self.protocol.model_bytes,), start + setup_s,
                                      self._met, start, arrivals, gaps)
        return True

    def _met(self, end: float, start: float, arrivals: list, gaps: dict) -> None:
        met, others = self.protocol.met, len(arrivals) - 1
        for x, t_x, payload_x in arrivals:
            met(x, end, start - t_x, payload_x, others, gaps[x] / others if others else 0.0)


def iteration_gaps(iteration: list[int], members: tuple[int, ...]) -> dict[int, int]:
    """Each member's summed |iteration gap| to the other members, exactly (integers), in
    O(g log g): sorted iterations and prefix sums. (Summing over the others for each member
    was O(g^2): a static schedule's inter-node group at 16,384 workers has 4,096 members.)"""
    if len(members) == 2:  # the commonest group (P-Reduce pairs)
        a, b = members
        gap = abs(iteration[a] - iteration[b])
        return {a: gap, b: gap}
    if len(members) <= 8:
        return {x: sum(abs(iteration[o] - iteration[x]) for o in members) for x in members}
    values = sorted(iteration[x] for x in members)
    prefix = list(itertools.accumulate(values, initial=0))
    total, g = prefix[-1], len(values)
    gaps = {}
    for x in members:
        mine = iteration[x]
        below = bisect.bisect_left(values, mine)
        above = bisect.bisect_right(values, mine)
        gaps[x] = (mine * below - prefix[below]) + (total - prefix[above] - mine * (g - above))
    return gaps
