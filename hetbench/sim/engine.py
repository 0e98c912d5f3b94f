"""The simulated worker loop: what the real worker loop does, played on bench sim's clock
(sim/clock.py); sim/run.py writes a simulated run's directory, sim/sink.py its events and
summary.

Time is simulated seconds from the common start (t = 0), kept as floats and written to the event
logs as integer nanoseconds, like a real run's clock. Each worker repeats what the real worker
loop does: stop check -> compute (the compute model's time) -> injected slowdown ((k - 1) x that
compute, from the run's own injector) -> the protocol's synchronization step -> one event line.
A protocol (the algorithm's own, beside its real step; the contract is sim/protocol.py) is told
when a worker's gradient is ready and calls `end_step` when that worker's step is over, so
waiting is whatever the protocol's rules make it.
"""

from __future__ import annotations

import gc
import math
from array import array
from collections.abc import Callable

import numpy as np

from hetbench.core.config import RunConfig
from hetbench.core.registry import ALGORITHMS
from hetbench.errors import UserError
from hetbench.network.transport import Transport
from hetbench.sim.clock import Clock
from hetbench.sim.model import SimModels, layout
from hetbench.sim.protocol import Protocol
from hetbench.sim.sink import EventSink


class Engine(Clock):
    """The per-worker state of the harness's training loop, on a Clock: a protocol reads the
    time (`now`) and schedules (`at`) on the engine itself."""

    def __init__(self, config: RunConfig, models: SimModels, sink: EventSink | None = None,
                 lockstep: bool = True, recorded_order=None):
        super().__init__()
        self.config = config
        #: A real run's order of the protocol's order-dependent events, which the protocol
        #: follows instead of the simulated timeline's (sim/recorded.py), or None.
        self.recorded_order = recorded_order
        #: Whether run() may play a lockstep protocol an iteration at a time (False: always
        #: event by event, the reference the lockstep tests compare with).
        self.allow_lockstep = lockstep
        self.models = models
        self.network = models.for_run(config)
        # Message sizes and compute are the timing workload's when the run has one ([timing]:
        # a cluster's costs over the workload's learning), else the workload's own.
        costs = config.timing_config
        self.layout = layout(costs)
        self.n = config.workers
        self.compute_s = models.compute.seconds(costs)
        self._draw = models.compute.sampler(costs)
        self._compute_s = [self.compute_s] * self.n
        self.injector = config.injector()
        self._factor = self.injector.factor
        #: Iteration -> every worker's slowdown factor (array('d')), for injectors whose
        #: factor does not depend on time: one numpy column per iteration, not a call per
        #: worker-iteration (a fifth of the event path's time).
        self._factor_columns: dict[int, array] | None = {} if self.injector.time_free else None
        #: The budget: iterations and wall seconds, each unbounded when not set.
        self._max_iterations = math.inf if config.iterations is None else config.iterations
        self._max_seconds = math.inf if config.seconds is None else config.seconds
        self.sink = sink
        #: The workers' models when the run learns (sim/learn.py), else None.
        self.learner = None
        #: Step ends so far of each iteration not yet complete (a lockstep protocol's learning
        #: played event by event), and the end of the last complete one.
        self._ended_per_iteration: dict[int, int] = {}
        self.trained_until = 0.0
        self.iteration = [0] * self.n
        self.t_start = [0.0] * self.n
        #: When each worker's current gradient was ready (compute + slowdown over).
        self.t_sync = [0.0] * self.n
        self._slowdown = [0.0] * self.n
        #: Samples each worker's current step computed, where the protocol decides its work
        #: (Protocol.work), else None: the batch size.
        self._samples: list[int | None] = [None] * self.n
        self.finished = [False] * self.n
        self.events = 0
        #: Processes in a synchronization step now (CPU sharing: NetworkModel.share).
        self.active = 0
        # A wall-clock budget under a synchronous algorithm is agreed by a 1-element all-reduce
        # at the top of every iteration, as the real worker loop does.
        self._agree = config.seconds is not None and config.algorithm_class().synchronous
        self._agreeing: list[int] = []
        #: A Cluster's fair transport (`transport = "fair"`, network/transport.py), or None.
        self.transport = None
        if self.network.fair:
            self._check_fair_transport()
            self.transport = Transport(self, self.network.cluster)
        self.protocol = protocol_for(self)
        self.active = self.protocol.servers  # a server process is always in its loop
        #: The protocol's rule for how much a worker computes (Protocol.work), or None.
        self._work = self.protocol.work

    def _check_fair_transport(self) -> None:
        """`transport = "fair"` needs a protocol that sends through the transport and posts
        its receives, and no recorded order to follow (its collectives and NICs: RunConfig
        checks them for bench run too)."""
        protocol = simulated_protocol(self.config)
        if not protocol.transport_ready:
            ready = playable(lambda played: played.transport_ready)
            raise UserError(f"[network] transport = \"fair\": {self.config.algorithm}'s "
                            f"simulated protocol {protocol.__name__} does not post its "
                            f"receives yet; fair transport plays {', '.join(ready)}")
        if self.recorded_order is not None:
            raise UserError("[network] transport = \"fair\" cannot follow a real run's "
                            "recorded order yet; use transport = \"fcfs\"")

    # -- the run ---------------------------------------------------------------------------
    def run(self) -> None:
        """Play the run to the end; RuntimeError if the protocol leaves workers waiting forever.

        Python's cyclic garbage collector is off meanwhile: the engine allocates millions of
        short-lived tuples (heap entries, messages), each of which counted towards a
        collection that walked every live object, and at 16,384 workers the live objects are
        many (half of allreduce-backup's time, a fifth of prague-smart's). Nothing the engine
        drops is cyclic, so reference counting frees it; whatever cycle a protocol might leave
        is collected when the collector is back on, at the end of the run."""
        collecting = gc.isenabled()
        gc.disable()
        try:
            if self.lockstep():
                self._run_lockstep()
            else:
                for w in range(self.n):
                    self.begin(w, 0.0)
            self._drain_heap()
        finally:
            if collecting:
                gc.enable()

    def _drain_heap(self) -> None:
        learner = self.learner
        if learner is None:
            self.drain()
        else:
            def evaluate(t: float) -> None:
                if t > learner.next_tick_s:
                    # Evaluation ticks before this moment see the models as they are before it.
                    learner.evaluate_before(t, sum(self.iteration) / self.n)
            self.drain(evaluate)
        stuck = [w for w in range(self.n) if not self.finished[w]]
        if stuck:
            raise RuntimeError(
                f"simulation of {self.config.algorithm} stalled at t={self.now:.6f} s: workers "
                f"{stuck[:10]} never finished (at iterations "
                f"{[self.iteration[w] for w in stuck[:10]]})")

    # -- lockstep: an iteration of every worker at a time ---------------------------------------
    def lockstep(self) -> bool:
        """Whether this run can be played an iteration at a time (Protocol.lockstep): an
        iteration budget (a wall-clock budget stops workers by time), and a network whose costs
        do not depend on how many processes are in a step at each instant (no shared cores: a
        lockstep play does not track that count; no Cluster: its NIC queues serve transfers in
        the order events run)."""
        net = self.network
        return (self.allow_lockstep and self.protocol.lockstep and self.config.seconds is None
                and self.config.iterations is not None and net.cluster is None
                and net.cores is None)

    def _run_lockstep(self) -> None:
        """The worker loop of begin/_compute/_end with numpy over the workers: the same
        arithmetic in the same order, element by element, so every time is the same double
        as the event path's. Then each worker's budget is spent at its last step's end, and
        finish() runs as events (a protocol's finish may still synchronize)."""
        n, sink, protocol = self.n, self.sink, self.protocol
        full = self.full_events
        t = np.zeros(n)
        for k in range(self.config.iterations):
            if self._draw is None:
                compute = np.full(n, self.compute_s)
            else:  # each worker's own seeded stream: the same draws in any order
                compute = np.array([self._draw(w) for w in range(n)])
            factors = self.injector.factors(k, t)
            samples = None
            if self._work is None:
                slow = (factors - 1.0) * compute
            else:  # the protocol decides each worker's work, worker by worker
                planned = [self._work(w, k, c, f)
                           for w, (c, f) in enumerate(zip(compute.tolist(), factors.tolist(),
                                                          strict=True))]
                compute = np.array([c for c, _, _ in planned])
                slow = np.array([d for _, d, _ in planned])
                samples = [m for _, _, m in planned]
            t_sync = t + compute + slow
            self.t_start = t  # what a protocol may read of this iteration, as on the event path
            steps = protocol.step_all(k, t_sync, full)
            early = np.flatnonzero(steps.t_end < t_sync)
            if len(early):
                self._refuse_early_end(int(early[0]), k, float(steps.t_end[early[0]]),
                                       float(t_sync[early[0]]))
            if self.learner is not None:
                # Evaluations at the ticks before this iteration ends see the models as they
                # are; then the iteration's model operations, as the real steps do them.
                self.learner.evaluate_before(float(steps.t_end.max()), k)
                protocol.learn(k, self.learner)
                self.learner.after_iteration(k, float(steps.t_end.max()))
            step_s = steps.t_end - t_sync
            wait_s = np.minimum(np.maximum(steps.wait_s, 0.0), step_s)
            if sink is not None:
                sink.add_all(k, t, steps.t_end, compute, slow, step_s - wait_s, wait_s, steps,
                             samples)
            t = steps.t_end
            self.events += n
            self.iteration = [k + 1] * n
        if sink is not None:
            sink.settle()
        self.t_sync = t.tolist() if self.config.iterations == 0 else t_sync.tolist()
        self.t_start = (t if self.config.iterations == 0 else self.t_start).tolist()
        self.trained_until = float(t.max()) if n else 0.0
        for w, t_end in enumerate(t.tolist()):
            self.at(t_end, self.begin, w, t_end)

    # -- the worker loop ---------------------------------------------------------------------
    def _budget_spent(self, w: int, t: float) -> bool:
        return self.iteration[w] >= self._max_iterations or t >= self._max_seconds

    def begin(self, w: int, t: float) -> None:
        """Top of worker w's loop at time t: stop, or compute its next gradient."""
        if self._agree:
            self._agreeing.append(w)
            if len(self._agreeing) == self.n:
                # Everyone is in the agreement all-reduce: the last arrival is now (t).
                done = self.network.ring(range(self.n), 4, t)
                stop = any(self._budget_spent(x, t) for x in range(self.n))
                for x in self._agreeing:
                    self.at(done, self.protocol.finish if stop else self._compute, x, done)
                self._agreeing = []
            return
        if self.iteration[w] >= self._max_iterations or t >= self._max_seconds:  # _budget_spent
            self.protocol.finish(w, t)
        else:
            self._compute(w, t)

    def _compute(self, w: int, t: float) -> None:
        compute = self.compute_s if self._draw is None else self._draw(w)
        k = self.iteration[w]
        columns = self._factor_columns
        if columns is None:
            factor = self._factor(w, k, t)
        else:
            column = columns.get(k)
            if column is None:
                column = self._factor_column(k)
            factor = column[w]
        if self._work is None:
            slow = (factor - 1.0) * compute
        else:
            compute, slow, self._samples[w] = self._work(w, k, compute, factor)
        self.t_start[w] = t
        if self.learner is not None and self.protocol.learns_events:
            self.learner.begin(w)  # its gradient is of the model it holds now
        self._compute_s[w] = compute
        self._slowdown[w] = slow
        t_sync = t + compute + slow
        self.t_sync[w] = t_sync
        self.at(t_sync, self._ready, w)

    #: Factor columns kept before the oldest ones that no worker can still need are dropped.
    KEPT_COLUMNS = 256

    def _factor_column(self, k: int) -> array:
        columns = self._factor_columns
        if len(columns) >= self.KEPT_COLUMNS:
            oldest = min(self.iteration)
            for stale in [i for i in columns if i < oldest]:
                del columns[stale]
        column = columns[k] = array("d", self.injector.factors(k, np.zeros(self.n)).tobytes())
        return column

    def _ready(self, w: int) -> None:
        self.active += 1
        self.protocol.ready(w)

    def end_step(self, w: int, t_end: float, wait_s: float, fields: dict | str | None = None,
                 next_iteration: int | None = None, *, peers: int | None = None,
                 staleness: float | None = None, discarded: bool = False,
                 peer_ranks=None) -> None:
        """Worker w's step ends at t_end (>= now) after waiting wait_s for peers; `peers`,
        `staleness`, `discarded` and `peer_ranks` (the ranks it synchronized with) are the
        real step's StepInfo fields."""
        if t_end < self.now or t_end < self.t_sync[w]:
            self._refuse_early_end(w, self.iteration[w], t_end, max(self.now, self.t_sync[w]))
        if t_end > self.now:
            self.at(t_end, self._end, w, t_end, wait_s, fields, next_iteration, peers,
                    staleness, discarded, peer_ranks)
        else:
            self._end(w, t_end, wait_s, fields, next_iteration, peers, staleness, discarded,
                      peer_ranks)

    def _refuse_early_end(self, w: int, k: int, t_end: float, earliest: float) -> None:
        """A step that would end before its gradient was ready, or before the moment it is
        decided: its event line would contradict itself (a negative wait) and its time would
        count work the protocol never waited for."""
        protocol = type(self.protocol).__name__
        raise UserError(f"{self.config.algorithm}'s simulated protocol {protocol} ended worker "
                        f"{w}'s step {k} at {t_end:.9f} s, before {earliest:.9f} s (its "
                        "gradient's ready time, or now): a step ends at or after both")

    def _end(self, w: int, t_end: float, wait_s: float, fields: dict | str | None,
             next_iteration: int | None, peers: int | None = None,
             staleness: float | None = None, discarded: bool = False,
             peer_ranks=None) -> None:
        self.active -= 1
        k = self.iteration[w]
        step_s = t_end - self.t_sync[w]
        # min(max(wait_s, 0.0), step_s), without two builtin calls per worker-iteration
        if wait_s < 0.0:
            wait_s = 0.0
        if wait_s > step_s:
            wait_s = step_s
        if self.sink is not None:
            self.sink.add(w, k, self.t_start[w], t_end, self._compute_s[w], self._slowdown[w],
                          step_s - wait_s, wait_s, fields, peers, staleness, discarded,
                          peer_ranks, self._samples[w])
        self.events += 1
        self.iteration[w] = k + 1 if next_iteration is None else next_iteration
        if self.learner is not None:
            if self.protocol.learns_events:
                self.learner.step_ended(t_end, self.iteration)
            else:
                self._lockstep_learning(k, t_end)
        self.begin(w, t_end)

    def _lockstep_learning(self, k: int, t_end: float) -> None:
        """A lockstep protocol played event by event (shared cores, a Cluster): its math is
        iteration k of every worker at once, whatever the timing, so it is applied when the
        last worker's step k ends (iterations complete in order: the last end of k + 1 comes
        after every end of k), as the lockstep path applies it."""
        ended = self._ended_per_iteration
        ended[k] = ended.get(k, 0) + 1
        if ended[k] == self.n:
            del ended[k]
            self.protocol.learn(k, self.learner)
            self.learner.after_iteration(k, t_end)
            self.trained_until = t_end

    @property
    def full_events(self) -> bool:
        """Whether the steps' fields are wanted: event lines are written, or the algorithm's
        summary_facts reads events (protocols skip formatting fields otherwise)."""
        return self.sink is None or self.sink.wants_fields

    def done(self, w: int) -> None:
        """Worker w has finished (its finish() returned)."""
        self.finished[w] = True


def protocol_for(engine: Engine) -> Protocol:
    """The simulated protocol the engine's algorithm names, playing this engine."""
    return simulated_protocol(engine.config)(engine)


def simulated_protocol(config: RunConfig) -> type[Protocol]:
    """The Protocol class config's algorithm names (Algorithm.simulated_protocol); UserError,
    one line naming what bench sim plays, when it names none."""
    protocol = config.algorithm_class().simulated_protocol()
    if protocol is None:
        raise UserError(f"algorithm {config.algorithm!r} has no simulated protocol "
                        "(its Algorithm.simulated_protocol() returns None); bench sim plays: "
                        f"{', '.join(playable())}")
    return protocol


def playable(which: Callable[[type[Protocol]], bool] = lambda played: True) -> list[str]:
    """The algorithms available here whose simulated protocol exists and passes `which`, in
    registry order (for the one-line errors that say what bench sim plays)."""
    names = []
    for name in ALGORITHMS.names():
        try:
            played = ALGORITHMS.get(name).simulated_protocol()
        except UserError:
            continue  # unavailable here (a missing optional dependency)
        if played is not None and which(played):
            names.append(name)
    return names
