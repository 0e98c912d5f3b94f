"""Each algorithm's synchronization step as simulated-time rules, one class per algorithm.

A protocol is told `ready(w)` when worker w's gradient is ready (at engine.t_sync[w]) and
`finish(w, t)` when w's budget is spent; it calls engine.end_step when w's
step is over and engine.done when w's finish() would return. Who waits for whom follows the real
algorithm; the groups and neighbours come from the same pure code the real algorithm calls
(hetbench.algorithms.topologies, prague.schedule, prague.generator), never from a copy.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import TYPE_CHECKING

from hetbench.algorithms import hop, topologies
from hetbench.core.record import encode_fields

if TYPE_CHECKING:
    from hetbench.sim.engine import Engine


class Protocol:
    """Default: no synchronization (each step ends when the gradient is ready)."""

    #: Server processes beside the workers, always competing for the CPU (CPU sharing).
    servers = 0

    def __init__(self, engine: Engine):
        self.eng = engine
        self.n = engine.n
        self.net = engine.network
        self.model_bytes = engine.layout.model_bytes
        self.config = engine.config.algorithm_config()

    def ready(self, w: int) -> None:
        self.eng.end_step(w, self.eng.now, 0.0)

    def finish(self, w: int, t: float) -> None:
        self.eng.done(w)

    def stats(self) -> dict:
        """Protocol counters for the summary (e.g. P-Reduce communicator cache hits)."""
        meetings = getattr(self, "meetings", None)
        if meetings is None:
            return {}
        return {"preduce_cache_hits": meetings.hits, "preduce_cache_misses": meetings.misses}


class AllReduceSim(Protocol):
    """Everyone waits for the last gradient, then one ring all-reduce per bucket."""

    def __init__(self, engine):
        super().__init__(engine)
        self.buckets = engine.layout.bucket_bytes
        self.arrived: list[int] = []

    def ready(self, w):
        self.arrived.append(w)
        if len(self.arrived) < self.n:
            return
        start = self.eng.now  # events run in time order: the last arrival is now
        active = self.eng.active
        cost = sum(self.net.ring_allreduce(b, self.n, active) for b in self.buckets)
        for x in self.arrived:
            self.eng.end_step(x, start + cost, start - self.eng.t_sync[x])
        self.arrived = []


class PSSyncSim(Protocol):
    """Gradients reach the server in arrival order; parameters go back one by one.

    Each message flies one hop (alpha + its sender's CPU time) plus bytes/beta on the server's
    link. The server handles one message at a time: its process spends the CPU time of every
    receive and then of every send in turn (as PSAsyncSim's server does), so a step costs it
    2n messages of CPU whatever the network; only the flights overlap.
    """

    servers = 1

    def __init__(self, engine):
        super().__init__(engine)
        beta = self.net.beta_bytes_per_s
        # A gradient message carries one flag element more than the model.
        self.push = (self.model_bytes + 4) / beta
        self.pull = self.model_bytes / beta
        self.arrived: list[int] = []

    def ready(self, w):
        self.arrived.append(w)
        if len(self.arrived) < self.n:
            return
        t_sync, hop, cpu = self.eng.t_sync, self.net.hop(self.eng.active), self.net.cpu_s
        free = 0.0
        for x in self.arrived:  # arrival order
            free = max(free, t_sync[x] + hop + self.push) + cpu
        for i, x in enumerate(sorted(self.arrived)):  # the server sends to workers 0..n-1
            end = free + (i + 1) * (cpu + self.pull) + hop
            own = 2 * (hop + cpu) + self.push + self.pull
            self.eng.end_step(x, end, end - t_sync[x] - own)
        self.arrived = []


class PSAsyncSim(Protocol):
    """The server takes one gradient at a time, in arrival order, and answers its sender.

    A request flies for alpha + bytes/beta, waits for the server, occupies it for the CPU time
    of its two messages (receive and reply), and the reply flies back. Only the CPU time is
    the server's: flights of different workers overlap (charging whole messages to the server
    capped 16 workers at 2/3 of what they measured, docs/bench-sim.md).
    CPU sharing: workers queued at the server are blocked in their receive and leave the cores
    to the others, so the CPU time is shared among the processes in a step less those still
    waiting for the server.
    """

    servers = 1

    def __init__(self, engine):
        super().__init__(engine)
        self.server_free = 0.0
        #: When each request scheduled so far is served (non-decreasing: FIFO).
        self._starts: deque[float] = deque()

    def ready(self, w):
        net = self.net
        arrive = self.eng.now + net.alpha_s + (self.model_bytes + 4) / net.beta_bytes_per_s
        starts = self._starts
        while starts and starts[0] <= arrive:
            starts.popleft()
        start = max(self.server_free, arrive)
        competing = max(self.eng.active - len(starts), 1)
        starts.append(start)
        self.server_free = start + 2 * net.cpu_s * net.share(competing)
        end = self.server_free + net.alpha_s + self.model_bytes / net.beta_bytes_per_s
        self.eng.end_step(w, end, start - arrive)


class DPSGDSim(Protocol):
    """Iteration k of worker i ends one message after all of its neighbours' k-th models."""

    def __init__(self, engine):
        super().__init__(engine)
        from hetbench.algorithms.dpsgd import gossip_graph

        self.graph = gossip_graph(self.config, self.n)
        #: ready_at[w][k]: when w's k-th gradient was ready (its k-th model sent).
        self.ready_at: list[list[float]] = [[] for _ in range(self.n)]
        self.waiting = [False] * self.n

    def ready(self, w):
        self.ready_at[w].append(self.eng.now)
        self.waiting[w] = True
        self._try(w)
        for j in self.graph[w]:
            if self.waiting[j]:
                self._try(j)

    def _try(self, x):
        k = self.eng.iteration[x]
        ready_at = self.ready_at
        if any(len(ready_at[j]) <= k for j in self.graph[x]):
            return
        latest = max(ready_at[j][k] for j in self.graph[x])
        mine = ready_at[x][k]
        self.waiting[x] = False
        # x sends to and receives from each of its d neighbours: d hops' worth of CPU time
        # (a ring all-reduce hop is one send and one receive per process), one alpha.
        net = self.net
        exchange = (net.alpha_s + self.model_bytes / net.beta_bytes_per_s
                    + len(self.graph[x]) * net.cpu_s * net.share(self.eng.active))
        self.eng.end_step(x, max(latest, mine) + exchange, latest - mine)


class ADPSGDSim(Protocol):
    """Actives average with a random passive neighbour, whose serving thread is a FIFO queue."""

    def __init__(self, engine):
        super().__init__(engine)
        import numpy as np

        from hetbench.algorithms.adpsgd import pair_graph

        active, _ = topologies.bipartite_split(self.n)
        self.active = set(active)
        self.graph = pair_graph(self.config, self.n)
        seed = engine.config.seed
        # The same per-rank generator a real worker draws its peers from (WorkerContext.rng).
        self.rng = {w: np.random.default_rng([seed, w, 17]) for w in active}
        self.server_free = [0.0] * self.n
        self.served = [0] * self.n

    def ready(self, w):
        t = self.eng.now
        if w not in self.active:
            served, self.served[w] = self.served[w], 0
            self.eng.end_step(w, t, 0.0, {"served": served})
            return
        peers = self.graph[w]
        peer = int(peers[self.rng[w].integers(len(peers))])
        start = max(self.server_free[peer], t)
        active = self.eng.active
        end = (start + self.net.message(self.model_bytes + 4, active)
               + self.net.message(self.model_bytes, active))
        self.server_free[peer] = end
        self.served[peer] += 1
        self.eng.end_step(w, end, start - t, {"peer": peer})


class _Meetings:
    """P-Reduce meetings: a group's collective starts when its last member arrives.

    The collective costs the ring formula over the members. As Comm.member_group does, the
    members keep LRU caches of `cache_size` member communicators; if one member lacks the
    group's, they all build a new one first (network.group_setup_s; 0 unless set). The store
    claim before each use (one concurrent compare_set per member) is not charged: on the
    validation machine a P-Reduce was measured within 10% of an all-reduce of the same ranks
    (docs/bench-prague.md), so the ring formula already covers it.
    """

    def __init__(self, protocol: Protocol):
        self.p = protocol
        self.open: dict = {}
        self.cache_size = protocol.config.cache_size
        self.caches = [OrderedDict() for _ in range(protocol.n)]
        self.hits = self.misses = 0

    def join(self, key, members: tuple[int, ...], w: int, t: float, payload) -> bool:
        """w arrives at t for the group `key` of `members`; when all are in, the protocol's
        met(x, t_end, wait_s, payload_x) runs for each member x. True once the group met."""
        arrivals = self.open.get(key)
        if arrivals is None:
            arrivals = self.open[key] = []
        arrivals.append((w, t, payload))
        if len(arrivals) < len(members):
            return False
        del self.open[key]
        net = self.p.net
        start = max(a[1] for a in arrivals)
        end = start + net.p_reduce(self.p.model_bytes, len(members), self.p.eng.active)
        if not all(members in self.caches[x] for x in members):
            self.misses += 1
            end += net.group_setup_s
        else:
            self.hits += 1
        for x in members:
            cache = self.caches[x]
            cache[members] = True
            cache.move_to_end(members)
            if len(cache) > self.cache_size:
                cache.popitem(last=False)
        met = self.p.met
        for x, t_x, payload_x in arrivals:
            met(x, end, start - t_x, payload_x)
        return True


class PragueStaticSim(Protocol):
    """The paper's fixed schedule; the first worker to stop fixes a last synchronized step."""

    def __init__(self, engine):
        super().__init__(engine)
        from hetbench.algorithms.prague.static import END_MARGIN

        self.end_margin = END_MARGIN
        self.step = [0] * self.n
        self.end: int | None = None
        self.meetings = _Meetings(self)
        self._by_step: dict[int, dict[int, tuple[int, ...]]] = {}

    def _group(self, w: int) -> tuple[int, tuple[int, ...]]:
        step = self.step[w]
        self.step[w] += 1
        if self.end is not None and step >= self.end:
            return step, (w,)
        return step, self._groups_of(step)[w]

    def _groups_of(self, step: int) -> dict[int, tuple[int, ...]]:
        """Each worker's group at `step`, from the schedule's own static_groups.

        A real worker calls static_group (O(workers)) for itself; n simulated workers doing so
        would cost O(n^2) per step, so each step's groups are computed once and kept while
        workers can still be at that step (they are at most a few steps apart).
        """
        from hetbench.algorithms.prague.schedule import static_groups

        groups = self._by_step.get(step)
        if groups is None:
            groups = {w: g for g in static_groups(step, self.n, self.config.workers_per_node)
                      for w in g}
            self._by_step[step] = groups
            self._by_step.pop(step - 64, None)
        return groups

    def ready(self, w):
        step, group = self._group(w)
        fields = encode_fields({"group": list(group), "gg_s": 0.0, "schedule_step": step})
        if len(group) < 2:
            self.eng.end_step(w, self.eng.now, 0.0, fields)
        else:
            self.meetings.join((step, group), group, w, self.eng.now, fields)

    def met(self, w, end, wait_s, fields):
        if fields is None:  # a step of finish()
            self.eng.at(end, self._drain, w, end)
        else:
            self.eng.end_step(w, end, wait_s, fields)

    def finish(self, w, t):
        if self.end is None:
            self.end = -(-(self.step[w] + self.end_margin) // 4) * 4
        self._drain(w, t)

    def _drain(self, w, t):
        """finish(): run every schedule step below the agreed end, without training."""
        while self.step[w] < self.end:
            step, group = self._group(w)
            if len(group) > 1:
                self.meetings.join((step, group), group, w, t, None)
                return
        self.eng.done(w)


class PragueGeneratedSim(Protocol):
    """prague-smart / prague-random: groups from the Group Generator, a server one alpha away.

    The generator is the real one (prague.generator.GroupGenerator) with the arguments the real
    algorithm's services() gives it, driven by requests in simulated-time order. Its server
    answers one request at a time, in arrival order, each taking network.gg_request_s (the
    real one is a single Python gRPC process: about 1 ms per request on the validation
    machine), so requests queue when many workers ask at once.
    """

    def __init__(self, engine):
        super().__init__(engine)
        from hetbench.algorithms.prague.generator import GroupGenerator

        cls = engine.config.algorithm_class()
        spec = cls.generator_spec(self.config, self.n)
        self.gg = GroupGenerator(self.n, spec.pop("group_size"), seed=engine.config.seed, **spec)
        self.rpc = self.net.alpha_s  # one way; a request's round trip is 2 alpha
        self.service = self.net.gg_request_s
        self.gg_free = 0.0
        self.meetings = _Meetings(self)
        #: Event fields of each open group, encoded once for all its members.
        self._fields: dict[int, str] = {}

    def _serve(self) -> float:
        """A request sent now: when the server takes it (messages arrive in the order they
        are sent, so the generator is called here, in that order: FIFO)."""
        served = max(self.gg_free, self.eng.now + self.rpc)
        self.gg_free = served + self.service
        return served

    def _ask(self, w: int):
        """w asks for its next group now: (the group, or None once w is drained; when the
        reply reaches w). Every request carries the time the server takes it, as the real
        server stamps every request with its clock, those of finish() included."""
        served = self._serve()
        return self.gg.request(w, served), self.gg_free + self.rpc

    def ready(self, w):
        group, reply = self._ask(w)
        fields = self._fields.get(group.id)
        if fields is None:
            # What encode_fields would give, formatted directly: at 1024 workers this runs half
            # a million times, and json.dumps was a tenth of the simulation's time.
            members = ",".join(map(str, group.members))
            fields = self._fields[group.id] = f',"group":[{members}],"group_id":{group.id}'
        own = f',"gg_s":{reply - self.eng.now!r}{fields}'
        if self.meetings.join(group.id, group.members, w, reply, own):
            del self._fields[group.id]

    def met(self, w, end, wait_s, fields):
        if fields is None:  # a group of finish()
            self.eng.at(end, self._drain, w)
        else:
            self.eng.end_step(w, end, wait_s, fields)

    def finish(self, w, t):
        self._serve()
        self.gg.finish(w)  # Done
        self.eng.at(self.gg_free + self.rpc, self._drain, w)

    def _drain(self, w):
        """finish(): P-Reduce the groups already queued for w, then stop."""
        group, reply = self._ask(w)
        if group is None:
            self.eng.done(w)
            return
        if self.meetings.join(group.id, group.members, w, reply, None):
            self._fields.pop(group.id, None)


UPDATE, SKIP = 0, 1


class HopSim(Protocol):
    """Hop's queues: backup workers, bounded staleness, token queues (iteration gap), skipping.

    Per worker: an update queue per neighbour of (lo, hi) entries, each neighbour's newest
    `entered` iteration, and the neighbours that are done, all updated when a message lands
    (one alpha + bytes/beta after it was sent). The rules are hop.py's, applied to that state.
    """

    def __init__(self, engine):
        super().__init__(engine)
        from hetbench.algorithms.dpsgd import gossip_graph

        self.graph = gossip_graph(self.config, self.n)
        self.msg_bytes = self.model_bytes + hop.HEADER * 4
        c = self.config
        self.b, self.s, self.gap = c.backup_workers, c.staleness, c.max_iteration_gap
        self.skip, self.skip_threshold = c.skip, c.skip_threshold
        self.queues = [{j: deque() for j in self.graph[i]} for i in range(self.n)]
        self.entered = [dict.fromkeys(self.graph[i], 0) for i in range(self.n)]
        self.done_peers: list[set[int]] = [set() for _ in range(self.n)]
        self.stopped = [False] * self.n
        #: What a blocked worker waits for: ("updates", k, since) or ("tokens", following,
        #: since, wait_s, fields).
        self.blocked: list[tuple | None] = [None] * self.n

    # -- messages ----------------------------------------------------------------------------
    def _send(self, w: int, kind: int, lo: int, hi: int, entered: int) -> None:
        arrive = self.eng.now + self.net.message(self.msg_bytes, self.eng.active)
        for j in self.graph[w]:
            self.eng.at(arrive, self._deliver, w, j, kind, lo, hi, entered)

    def _deliver(self, src, dst, kind, lo, hi, entered):
        if kind is None:  # DONE
            self.done_peers[dst].add(src)
        else:
            if entered > self.entered[dst][src]:
                self.entered[dst][src] = entered
            if not self.stopped[dst]:
                self.queues[dst][src].append(hop.Entry(lo, hi))
        if self.blocked[dst] is not None:
            self._unblock(dst)

    # -- hop.py's rules, on this worker's state ----------------------------------------------
    def _usable(self, w, j, k):
        entry = hop.newest_usable(self.queues[w][j], k, self.s)
        return None if entry is None else entry.hi

    def _updates_ready(self, w, k):
        return hop.updates_ready(self.queues[w], self.done_peers[w], k, self.b, self.s)

    def _tokens_ready(self, w, k):
        return hop.tokens_ready(self.entered[w], self.done_peers[w], k, self.gap)

    def _skip_target(self, w, k):
        return hop.skip_target(self.entered[w], self.done_peers[w], k, self.skip_threshold,
                               self.gap)

    def _drop_before(self, w, k):
        hop.drop_before(self.queues[w], k, self.s)

    # -- the step ----------------------------------------------------------------------------
    def ready(self, w):
        k = self.eng.iteration[w]
        self._send(w, UPDATE, k, k, k)
        target = self._skip_target(w, k) if self.skip else None
        if target is None:
            if self._updates_ready(w, k):
                self._mixed(w, k, 0.0)
            else:
                self.blocked[w] = ("updates", k, self.eng.now)
            return
        used = {str(j): q[-1].hi for j, q in self.queues[w].items() if q}
        self._drop_before(w, target)
        fields = {"used": used, "skipped": target - k - 1, "skip_to": target,
                  "skip_ns": round(self.eng.now * 1e9)}
        self._send(w, SKIP, k + 1, target - 1, target)
        self._tokens(w, target, 0.0, fields)

    def _mixed(self, w, k, wait_s):
        used = {}
        for j in self.graph[w]:
            hi = self._usable(w, j, k)
            if hi is not None:
                used[str(j)] = min(hi, k)
        self._drop_before(w, k + 1)
        self._tokens(w, k + 1, wait_s, {"used": used})

    def _tokens(self, w, following, wait_s, fields):
        if self._tokens_ready(w, following):
            self.eng.end_step(w, self.eng.now, wait_s, fields, following)
        else:
            self.blocked[w] = ("tokens", following, self.eng.now, wait_s, fields)

    def _unblock(self, w):
        state = self.blocked[w]
        now = self.eng.now
        if state[0] == "updates":
            _, k, since = state
            if self._updates_ready(w, k):
                self.blocked[w] = None
                self._mixed(w, k, now - since)
        else:
            _, following, since, wait_s, fields = state
            if self._tokens_ready(w, following):
                self.blocked[w] = None
                self.eng.end_step(w, now, wait_s + now - since, fields, following)

    def finish(self, w, t):
        self.stopped[w] = True
        for queue in self.queues[w].values():
            queue.clear()
        self._send(w, None, 0, 0, 0)  # DONE
        self.eng.done(w)


PROTOCOLS: dict[str, type[Protocol]] = {
    "allreduce": AllReduceSim,
    "ps-sync": PSSyncSim,
    "ps-async": PSAsyncSim,
    "dpsgd": DPSGDSim,
    "adpsgd": ADPSGDSim,
    "prague-static": PragueStaticSim,
    "prague-smart": PragueGeneratedSim,
    "prague-random": PragueGeneratedSim,
    "hop": HopSim,
}


def protocol_for(engine: Engine) -> Protocol:
    """The simulated protocol of the engine's algorithm."""
    from hetbench.errors import UserError

    name = engine.config.algorithm
    if name not in PROTOCOLS:
        raise UserError(f"bench sim has no model of algorithm {name!r}; it simulates: "
                        f"{', '.join(sorted(PROTOCOLS))}")
    return PROTOCOLS[name](engine)
