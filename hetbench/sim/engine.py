"""The event loop, the worker loop it plays, and the run directory it writes.

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
import heapq
import math
import shutil
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hetbench.core.algorithm import Algorithm
from hetbench.core.config import RunConfig
from hetbench.core.record import summary_head
from hetbench.core.registry import ALGORITHMS
from hetbench.core.rundir import RunDir
from hetbench.core.signals import interrupted_cause
from hetbench.core.store import environment, read_json, write_json_atomic
from hetbench.errors import UserError
from hetbench.sim.model import SimModels, layout
from hetbench.sim.protocol import Protocol
from hetbench.sim.sink import EventSink, full_events
from hetbench.sim.transport import Transport


class Engine:
    """A heap of timed callbacks and the per-worker state of the harness's training loop."""

    def __init__(self, config: RunConfig, models: SimModels, sink: EventSink | None = None,
                 lockstep: bool = True, recorded_order=None):
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
        self.now = 0.0
        #: Pending events: the distinct times (a heap) and, per time, its callbacks in the
        #: order they were scheduled (see at()).
        self._times: list[float] = []
        self._at: dict[float, list] = {}
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
        #: A Cluster's fair transport (`transport = "fair"`, sim/transport.py), or None.
        self.transport = None
        if self.network.fair:
            self._check_fair_transport()
            self.transport = Transport(self, self.network)
        self.protocol = protocol_for(self)
        self.active = self.protocol.servers  # a server process is always in its loop
        #: The protocol's rule for how much a worker computes (Protocol.work), or None.
        self._work = self.protocol.work

    def _check_fair_transport(self) -> None:
        """`transport = "fair"` needs a protocol that sends through the transport and posts
        its receives, ring collectives, NICs whose speed holds for the whole run (the flows'
        shares are computed over fixed capacities) and no recorded order to follow."""
        protocol = simulated_protocol(self.config)
        if not protocol.transport_ready:
            ready = playable(lambda played: played.transport_ready)
            raise UserError(f"[network] transport = \"fair\": {self.config.algorithm}'s "
                            f"simulated protocol {protocol.__name__} does not post its "
                            f"receives yet; fair transport plays {', '.join(ready)}")
        if self.network.cluster.config.collective != "ring":
            raise UserError("[network] transport = \"fair\" moves ring collectives as flows; "
                            f"collective = \"{self.network.cluster.config.collective}\" is not "
                            "modeled as flows yet: use transport = \"fcfs\"")
        if self.injector.network_kind:
            raise UserError(f"[network] transport = \"fair\" with slowdown "
                            f"{self.config.slowdown!r}: slowed NICs are not modeled in fair "
                            "flows yet; use transport = \"fcfs\"")
        if self.recorded_order is not None:
            raise UserError("[network] transport = \"fair\" cannot follow a real run's "
                            "recorded order yet; use transport = \"fcfs\"")

    # -- the event loop ----------------------------------------------------------------------
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
        times, at, pop = self._times, self._at, heapq.heappop
        learner = self.learner
        while times:
            t = pop(times)
            self.now = t
            if learner is not None and t > learner.next_tick_s:
                # Evaluation ticks before this moment see the models as they are before it.
                learner.evaluate_before(t, sum(self.iteration) / self.n)
            # A list iterator also yields what is appended meanwhile: callbacks that schedule
            # more at this same time (end_step at now goes through _end directly, not here).
            for fn, args in at[t]:
                fn(*args)
            del at[t]
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


@dataclass
class SimResult:
    """One simulated run: where it was written, its summary, and what simulating it cost."""

    config: RunConfig
    run_dir: Path
    summary: dict[str, Any]
    #: Wall seconds the simulation (and writing its files) took on this machine.
    sim_s: float


def simulate(config: RunConfig, models: SimModels, out_dir: Path,
             events: str = "auto", lockstep: bool = True, recorded_order=None) -> SimResult:
    """Simulate `config` and write its run directory `out_dir/<run_id>` (real runs' schema;
    `events`: one of sink.EVENT_MODES; `lockstep` False: event by event even where the protocol
    could be played an iteration at a time, for the tests that compare the two;
    `recorded_order`: a real run's order of events to follow, sim/recorded.py)."""
    started = time.time()
    run_dir = Path(out_dir) / config.run_id
    # An algorithm it cannot play fails here, before any file exists.
    engine = Engine(config, models, lockstep=lockstep, recorded_order=recorded_order)
    if config.learn:  # torch and torch.func: imported only by a run that learns
        from hetbench.sim.learn import Learner, check_learnable

        check_learnable(config, engine.protocol)
    _clear_previous(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if config.learn:
        engine.learner = Learner(config, run_dir)
    write_json_atomic(RunDir(run_dir).config, config.to_dict())
    write_json_atomic(RunDir(run_dir).env, {**environment(), "simulated": True})
    sink = engine.sink = EventSink(config, run_dir, full_events(events, config.workers),
                                   keep=facts_read_events(config))
    status, cause, stopped = "ok", None, None
    try:
        try:
            engine.run()
        except RuntimeError as exc:
            status, cause = "failed", f"simulator: {exc}"
        sink.close()
        if engine.learner is not None and status == "ok":
            # What the real workers' finish() does to the models after training (a drain).
            if engine.protocol.learn_finish is not None:
                engine.protocol.learn_finish(engine.learner, config.iterations)
            if not engine.protocol.learns_events:
                engine.learner.finish(engine.trained_until, config.iterations)
            else:  # workers' own iteration counts, as each real rank reports its own
                engine.learner.finish(engine.learner.last_end_s,
                                      sum(engine.iteration) / engine.n)
        summary = _summary(config, models, engine, status, cause, started)
    # Ctrl-C, SIGTERM, SIGHUP: on record, then stop bench. The outer try: a signal can also
    # land while the events are written and summed (seconds at 1024 workers).
    except KeyboardInterrupt as exc:
        stopped = exc
        sink.close()  # what was simulated so far, as a real run's events
        summary = _summary(config, models, engine, "interrupted", interrupted_cause(exc),
                           started)
    write_json_atomic(RunDir(run_dir).summary, summary)
    if stopped is not None:
        raise stopped
    return SimResult(config, run_dir, summary, summary["sim_s"])


#: Summary fields only a real run's host can measure: a simulated summary names them as absent.
#: (A staged message's speed, `staged_p2p_mb_per_s`, is not among them: a real run has it only
#: where ranks share a GPU, which no config says, so no simulated run could name it absent.)
REAL_ONLY = ("launcher", "backend", "devices", "fidelity", "network", "p2p_mb_per_iteration",
             "collective_mb_per_iteration", "clock_hosts", "machines",
             "clock_offset_ms", "clock_error_ms", "clock_drift_ms")
#: REAL_ONLY fields a real run has only sometimes: an emulated network's, and the clocks'
#: alignment (ranks on several hosts); a simulated summary names them absent only then.
SOMETIMES = {"fidelity": lambda config: bool(config.network),
             "network": lambda config: bool(config.network),
             **{key: lambda config: bool(config.hosts)
                for key in ("clock_offset_ms", "clock_error_ms", "clock_drift_ms")}}


def _summary(config: RunConfig, models: SimModels, engine: Engine, status: str,
             cause: str | None, started: float) -> dict[str, Any]:
    stats = engine.protocol.stats()
    summary = {
        **summary_head(config, status, cause, started),
        **engine.sink.summary(config),
        **(engine.learner.summary() if engine.learner is not None and status == "ok" else {}),
        **_facts(config, stats, engine.sink.kept_events()),
        "simulated": True, "sim": {**models.to_dict(config), **stats}, **config.code_record(),
        "evaluated_model": config.algorithm_class().evaluated_model_name(),
        # A learned run trained its simulated workers on the workload's data; a timing-only
        # one trained on none.
        "data": (f"{config.data_source} (learned in the simulator)"
                 if engine.learner is not None else "none (simulated)"),
        # What a real summary of this config would hold that no simulation can measure.
        "absent": [key for key in REAL_ONLY
                   if key not in SOMETIMES or SOMETIMES[key](config)],
    }
    if config.timing:
        summary["timing"] = timing_summary(config, engine)
    # A simulated run has no start-up: its wall time is the simulated training span.
    summary["wall_s"] = summary["train_wall_s"]
    summary["sim_s"] = time.time() - started
    return summary


def timing_summary(config: RunConfig, engine: Engine) -> dict[str, Any]:
    """What a run with [timing] took from its timing workload, and what it did not."""
    timing = config.timing_config
    options = timing.workload_options
    return {
        "workload": timing.workload, "batch_size": options["batch_size"],
        "compute_preset": options.get("compute_preset") or None,
        "compute_ms": engine.compute_s * 1e3, "model_bytes": engine.layout.model_bytes,
        "meaning": (f"message sizes, compute time and samples per iteration are "
                    f"{timing.workload}'s; the model, data, accuracy, loss, iterations and "
                    f"consensus are those of {config.workload} (not a {timing.workload}'s "
                    "accuracy)"),
    }


def _facts(config: RunConfig, stats: dict[str, Any], events) -> dict[str, Any]:
    """The algorithm's summary_facts, as a real summary has them (facts_record: the values,
    and their names and units under "facts"): from every worker's events as the simulated
    run's lines hold them (the sink's kept events; written or not), with what the protocol
    counted (its stats) where it counted the same thing, None where a fact needs what only
    real ranks record (their done records)."""
    algorithm = config.algorithm_class()
    facts = algorithm.summary_facts(config.algorithm_config(), events,
                                    [None] * config.world_size)
    return algorithm.facts_record({key: stats.get(key, value) for key, value in facts.items()})


class _Probe(Sequence):
    """No events, and a note of whether anything looked at them (facts_read_events)."""

    def __init__(self):
        self.read = False

    def __len__(self) -> int:
        self.read = True
        return 0

    def __getitem__(self, index):
        self.read = True
        return [][index]

    def __iter__(self):
        self.read = True
        return iter(())


def facts_read_events(config: RunConfig) -> bool:
    """Whether config's algorithm's summary_facts reads the events it is given, so that the
    simulator must keep what rebuilds every event (EventSink.keep; at 1,024 workers x 1,000
    iterations a worker-by-worker lockstep path and about a hundred bytes per event).

    Found by calling it on no events that note being looked at, with the config and done
    records the simulated run's call gets: a summary_facts that does not look at them there
    follows the same path at the end of the run (nothing it branches on differs), so it never
    needs them. One not overridden (Algorithm's: nothing) is not called; one that fails on no
    events is taken to read them."""
    algorithm = config.algorithm_class()
    if getattr(algorithm.summary_facts, "__func__", None) is Algorithm.summary_facts.__func__:
        return False
    probe = _Probe()
    try:
        algorithm.summary_facts(config.algorithm_config(), probe, [None] * config.world_size)
    except Exception:
        return True
    return probe.read


def _clear_previous(run_dir: Path) -> None:
    """Remove an earlier simulation of the same run; never touch a real run's directory."""
    if not run_dir.exists():
        return
    # env.json marks a simulation from its start: one killed before its summary is ours too.
    try:
        simulated = read_json(RunDir(run_dir).env).get("simulated") is True
    except (OSError, ValueError):
        simulated = False
    if not simulated:
        raise UserError(f"{run_dir} holds a real (or unfinished) run; simulate into another "
                        "directory with --out")
    shutil.rmtree(run_dir)

