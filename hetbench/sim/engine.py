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

import heapq
import itertools
import json
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetbench.core.config import SCHEMA_VERSION, RunConfig
from hetbench.core.metrics import SyncTally, throughput
from hetbench.core.record import encode_fields, summary_head
from hetbench.core.registry import ALGORITHMS
from hetbench.core.signals import interrupted_cause
from hetbench.core.store import environment, read_json, write_json_atomic
from hetbench.errors import UserError
from hetbench.sim.model import SimModels, layout
from hetbench.sim.protocol import Protocol

#: Events buffered per worker before they are appended to its log (bounds memory at scale).
FLUSH_EVERY = 512


class Engine:
    """A heap of timed callbacks and the per-worker state of the harness's training loop."""

    def __init__(self, config: RunConfig, models: SimModels, sink: EventSink | None = None):
        self.config = config
        self.models = models
        self.network = models.for_run(config)
        self.layout = layout(config)
        self.n = config.workers
        self.compute_s = models.compute.seconds(config)
        self._draw = models.compute.sampler(config)
        self._compute_s = [self.compute_s] * self.n
        self.injector = config.injector()
        self.sink = sink
        self.now = 0.0
        self._heap: list = []
        self._seq = itertools.count()
        self.iteration = [0] * self.n
        self.t_start = [0.0] * self.n
        #: When each worker's current gradient was ready (compute + slowdown over).
        self.t_sync = [0.0] * self.n
        self._slowdown = [0.0] * self.n
        self.finished = [False] * self.n
        self.events = 0
        #: Processes in a synchronization step now (CPU sharing: NetworkModel.share).
        self.active = 0
        # A wall-clock budget under a synchronous algorithm is agreed by a 1-element all-reduce
        # at the top of every iteration, as the real worker loop does.
        self._agree = config.seconds is not None and config.algorithm_class().synchronous
        self._agreeing: list[int] = []
        self.protocol = protocol_for(self)
        self.active = self.protocol.servers  # a server process is always in its loop

    # -- the event loop ----------------------------------------------------------------------
    def at(self, t: float, fn: Callable, *args) -> None:
        """Call fn(*args) at simulated time t (never before now)."""
        heapq.heappush(self._heap, (t, next(self._seq), fn, args))

    def run(self) -> None:
        """Play the run to the end; RuntimeError if the protocol leaves workers waiting forever."""
        for w in range(self.n):
            self.begin(w, 0.0)
        heap = self._heap
        while heap:
            t, _, fn, args = heapq.heappop(heap)
            self.now = t
            fn(*args)
        stuck = [w for w in range(self.n) if not self.finished[w]]
        if stuck:
            raise RuntimeError(
                f"simulation of {self.config.algorithm} stalled at t={self.now:.6f} s: workers "
                f"{stuck[:10]} never finished (at iterations "
                f"{[self.iteration[w] for w in stuck[:10]]})")

    # -- the worker loop ---------------------------------------------------------------------
    def _budget_spent(self, w: int, t: float) -> bool:
        c = self.config
        return ((c.iterations is not None and self.iteration[w] >= c.iterations)
                or (c.seconds is not None and t >= c.seconds))

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
        if self._budget_spent(w, t):
            self.protocol.finish(w, t)
        else:
            self._compute(w, t)

    def _compute(self, w: int, t: float) -> None:
        k = self.iteration[w]
        compute = self.compute_s if self._draw is None else self._draw(w)
        slow = (self.injector.factor(w, k, t) - 1.0) * compute
        self.t_start[w] = t
        self._compute_s[w] = compute
        self._slowdown[w] = slow
        t_sync = t + compute + slow
        self.t_sync[w] = t_sync
        self.at(t_sync, self._ready, w)

    def _ready(self, w: int) -> None:
        self.active += 1
        self.protocol.ready(w)

    def end_step(self, w: int, t_end: float, wait_s: float, fields: dict | str | None = None,
                 next_iteration: int | None = None, *, peers: int | None = None,
                 staleness: float | None = None, discarded: bool = False) -> None:
        """Worker w's step ends at t_end (>= now) after waiting wait_s for peers; `peers`,
        `staleness` and `discarded` are the real step's StepInfo fields."""
        if t_end > self.now:
            self.at(t_end, self._end, w, t_end, wait_s, fields, next_iteration, peers,
                    staleness, discarded)
        else:
            self._end(w, t_end, wait_s, fields, next_iteration, peers, staleness, discarded)

    def _end(self, w: int, t_end: float, wait_s: float, fields: dict | str | None,
             next_iteration: int | None, peers: int | None = None,
             staleness: float | None = None, discarded: bool = False) -> None:
        self.active -= 1
        k = self.iteration[w]
        step_s = t_end - self.t_sync[w]
        wait_s = min(max(wait_s, 0.0), step_s)
        if self.sink is not None:
            self.sink.add(w, k, self.t_start[w], t_end, self._compute_s[w], self._slowdown[w],
                          step_s - wait_s, wait_s, fields, peers, staleness, discarded)
        self.events += 1
        self.iteration[w] = k + 1 if next_iteration is None else next_iteration
        self.begin(w, t_end)

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
        playable = []
        for name in ALGORITHMS.names():
            try:
                if ALGORITHMS.get(name).simulated_protocol() is not None:
                    playable.append(name)
            except UserError:
                continue  # unavailable here (a missing optional dependency)
        raise UserError(f"algorithm {config.algorithm!r} has no simulated protocol "
                        "(its Algorithm.simulated_protocol() returns None); bench sim plays: "
                        f"{', '.join(playable)}")
    return protocol


class EventSink:
    """Event lines of every worker, appended to events.rank<r>.jsonl in batches.

    Lines hold the same JSON a real worker's EventLog writes (read back by store.read_jsonl),
    but are formatted here, and protocols may pass fields already encoded (encode_fields) once
    per group: at a million events json.dumps per line was a third of the run time. The sink
    also keeps what the summary needs, so it is not parsed back from a million lines.
    """

    def __init__(self, config: RunConfig, run_dir: Path):
        self.run_dir = run_dir
        self.prefix = (f'{{"schema_version":{SCHEMA_VERSION},"run_id":{json.dumps(config.run_id)},'
                       '"rank":')
        self.samples = config.workload_options["batch_size"]
        self._buffers: dict[int, list[str]] = {}
        #: Per rank: (t_start, t_end) in ns and samples of each event, and its last iteration.
        self.spans: list[list[tuple[int, int, int]]] = [[] for _ in range(config.workers)]
        self.last_iteration: list[int | None] = [None] * config.workers
        self._sums: list[tuple[float, float, float, float]] = []
        self.sync = SyncTally()
        self.discarded = 0

    def add(self, rank: int, iteration: int, t_start: float, t_end: float, compute_s: float,
            slowdown_s: float, comm_s: float, wait_s: float, fields: dict | str | None,
            peers: int | None = None, staleness: float | None = None,
            discarded: bool = False) -> None:
        extra = fields if isinstance(fields, str) else encode_fields(fields)
        samples = self.samples
        if discarded:  # as the real worker logs a dropped gradient (StepInfo.discarded)
            extra = f',"samples_discarded":{samples}' + extra
            samples = 0
            self.discarded += 1
        if peers is not None:
            self.sync.add(peers, staleness)
            sync = f',"peers":{peers}'
            if staleness is not None:
                sync += f',"staleness":{float(staleness)!r}'
            extra = sync + extra
        start_ns, end_ns = round(t_start * 1e9), round(t_end * 1e9)
        line = (f'{self.prefix}{rank},"iteration":{iteration},"t_start":{start_ns},'
                f'"t_end":{end_ns},"compute_s":{compute_s!r},'
                f'"slowdown_s":{slowdown_s!r},"comm_s":{comm_s!r},"wait_s":{wait_s!r},'
                f'"samples":{samples},"loss":NaN,"snapshot_s":0.0{extra}}}\n')
        self.spans[rank].append((start_ns, end_ns, samples))
        self.last_iteration[rank] = iteration
        self._sums.append((compute_s, slowdown_s, comm_s, wait_s))
        buffer = self._buffers.get(rank)
        if buffer is None:
            buffer = self._buffers[rank] = []
        buffer.append(line)
        if len(buffer) >= FLUSH_EVERY:
            self._flush(rank)

    def _flush(self, rank: int) -> None:
        lines = self._buffers.pop(rank, [])
        if lines:
            with (self.run_dir / f"events.rank{rank}.jsonl").open("a") as f:
                f.write("".join(lines))

    def close(self) -> None:
        for rank in list(self._buffers):
            self._flush(rank)

    def summary(self, config: RunConfig) -> dict[str, Any]:
        """What launcher.summarize would compute from the files written (a test holds them
        equal), with the harness's own throughput() over the spans kept in memory."""
        by_rank = {r: [{"t_start": a, "t_end": b, "samples": n} for a, b, n in spans]
                   for r, spans in enumerate(self.spans)}
        counts = [len(spans) for spans in self.spans]
        starts = [spans[0][0] for spans in self.spans if spans]
        ends = [max(b for _, b, _ in spans) for spans in self.spans if spans]
        return {
            "throughput": throughput(by_rank, config.warmup_iterations),
            "samples": sum(n for spans in self.spans for _, _, n in spans),
            "iterations": sum(counts),
            "iterations_per_worker": counts,
            "last_iteration_per_worker": self.last_iteration,
            "train_wall_s": ((max(ends) - min(starts)) / 1e9) if starts else 0.0,
            "final_test_loss": None, "final_test_accuracy": None,
            "final_consensus_distance": None, "mean_consensus_distance": None,
            **self.sync.health(),
            "sync_intended": config.algorithm_class().intended_sync_share(
                config.algorithm_config(), config.workers),
            "averagings_after_training": None, "gradients_dropped": self.discarded,
            "torn_lines": 0,
            "train_cpu_s": None,  # no process ran
            **dict(zip(("compute_s", "slowdown_s", "comm_s", "wait_s"),
                       (math.fsum(column) for column in zip(*self._sums, strict=True))
                       if self._sums else (0.0,) * 4, strict=True)),
        }


@dataclass
class SimResult:
    """One simulated run: where it was written, its summary, and what simulating it cost."""

    config: RunConfig
    run_dir: Path
    summary: dict[str, Any]
    #: Wall seconds the simulation (and writing its files) took on this machine.
    sim_s: float


def simulate(config: RunConfig, models: SimModels, out_dir: Path) -> SimResult:
    """Simulate `config` and write its run directory `out_dir/<run_id>` (real runs' schema)."""
    started = time.time()
    run_dir = Path(out_dir) / config.run_id
    engine = Engine(config, models)  # an algorithm it cannot play fails before any file exists
    _clear_previous(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / "config.json", config.to_dict())
    write_json_atomic(run_dir / "env.json", {**environment(), "simulated": True})
    sink = engine.sink = EventSink(config, run_dir)
    status, cause, stopped = "ok", None, None
    try:
        try:
            engine.run()
        except RuntimeError as exc:
            status, cause = "failed", f"simulator: {exc}"
        sink.close()
        summary = _summary(config, models, engine, status, cause, started)
    # Ctrl-C, SIGTERM, SIGHUP: on record, then stop bench. The outer try: a signal can also
    # land while the events are written and summed (seconds at 1024 workers).
    except KeyboardInterrupt as exc:
        stopped = exc
        sink.close()  # what was simulated so far, as a real run's events
        summary = _summary(config, models, engine, "interrupted", interrupted_cause(exc),
                           started)
    write_json_atomic(run_dir / "summary.json", summary)
    if stopped is not None:
        raise stopped
    return SimResult(config, run_dir, summary, summary["sim_s"])


def _summary(config: RunConfig, models: SimModels, engine: Engine, status: str,
             cause: str | None, started: float) -> dict[str, Any]:
    summary = {
        **summary_head(config, status, cause, started),
        **engine.sink.summary(config),
        "simulated": True, "sim": {**models.to_dict(config), **engine.protocol.stats()},
    }
    # A simulated run has no start-up: its wall time is the simulated training span.
    summary["wall_s"] = summary["train_wall_s"]
    summary["sim_s"] = time.time() - started
    return summary


def _clear_previous(run_dir: Path) -> None:
    """Remove an earlier simulation of the same run; never touch a real run's directory."""
    if not run_dir.exists():
        return
    # env.json marks a simulation from its start: one killed before its summary is ours too.
    try:
        simulated = read_json(run_dir / "env.json").get("simulated") is True
    except (OSError, ValueError):
        simulated = False
    if not simulated:
        raise UserError(f"{run_dir} holds a real (or unfinished) run; simulate into another "
                        "directory with --out")
    shutil.rmtree(run_dir)

