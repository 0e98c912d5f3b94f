"""After training: score the evaluated model at the snapshot ticks and at the end, and find the
moment it first met the run's target; the models kept during training for that (Snapshots at
wall-clock ticks, History after every step).

The evaluated model is the one the algorithm produces (Algorithm.evaluated_model,
EvaluatedModel here): the workers' average by default, a model each worker keeps beside its own
(DiLoCo's outer model; the workers' average of it), or a server rank's (the parameter servers'),
which the server keeps while it serves (ServerModel, through ctx.model_updated) and sends rank 0
as it asks for it after training (ServerModels). The consensus distance is always the workers'.

Evaluation runs after training, so it never perturbs the timed path; the worker loop (and a
server's) only keeps the models (worker.py).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from hetbench.comm.clock import now_ns
from hetbench.comm.comm import ReduceOp
from hetbench.core.algorithm import Algorithm
from hetbench.core.config import SCHEMA_VERSION, RunConfig
from hetbench.core.context import WorkerContext
from hetbench.core.rundir import RunDir
from hetbench.core.store import EventLog
from hetbench.core.target import parse_target
from hetbench.core.tensors import flat_params_numel, flat_state, set_flat_state
from hetbench.core.workload import Workload

#: Snapshots kept per worker; beyond this the snapshot stride doubles (older odd ticks dropped).
MAX_SNAPSHOTS = 48
#: Memory for a run with a target to keep each worker's model after every step; beyond it only
#: every 2nd (4th, ...) step's is kept, and the time to target is found to that many iterations.
HISTORY_BYTES = 256 * 2**20
#: What rank 0 may receive of the workers' models to find the first moment a target was met
#: from the start of the run (_time_to_target); beyond it, from the evaluation before it.
GATHER_BYTES = 512 * 2**20
#: The tag of evaluation's point-to-point messages: the workers' models sent to rank 0 for the
#: time-to-target search, and rank 0's requests to a server rank and its answers.
TARGET_TAG = 71
#: Candidate moments rank 0 tests one by one for that first moment (a test is one evaluation of
#: the averaged model, without communication, cheap for small models); beyond this many it
#: narrows them first in rounds of SCAN_PROBES evenly spaced tests, and can then miss a brief
#: excursion above the target, so the record says it is not exact.
LINEAR_PROBES = 4096
SCAN_PROBES = 64


def note(rank: int, what: str) -> None:
    """A timestamped line in the rank's log (worker.rank<r>.log), for post-mortems."""
    print(f"{time.strftime('%H:%M:%S')}.{time.time_ns() // 1_000_000 % 1000:03d} rank {rank}: "
          f"{what}", flush=True)


class EvaluatedModel:
    """Which model a run's evaluation scores (Algorithm.evaluated_model), as each rank needs to
    know it: what a worker keeps of its model at a moment, and where the scored model is."""

    def __init__(self, name: str = "workers", server: int | None = None,
                 algorithm: Algorithm | None = None):
        self.name = name
        #: The rank whose model is scored (the first server rank), or None: the workers'.
        self.server = server
        #: Each worker keeps a model of the algorithm's own beside the one it trains
        #: (Algorithm.evaluated_state), and the workers' average of that is scored.
        self.beside = name not in ("workers", "server")
        self._algorithm = algorithm

    @classmethod
    def of(cls, config: RunConfig, algorithm: Algorithm) -> EvaluatedModel:
        name = type(algorithm).evaluated_model
        if name == "server" and config.world_size <= config.workers:
            raise ValueError(f"{algorithm.name} declares evaluated_model = 'server' but has no "
                             "server rank (server_ranks)")
        return cls(name, config.workers if name == "server" else None, algorithm)

    def keep(self, model: nn.Module) -> torch.Tensor:
        """What a worker keeps of its model at a moment (a new tensor): its flat_state, then,
        where the algorithm scores a model of its own, that model's (evaluated_state)."""
        own = flat_state(model)
        if not self.beside:
            return own
        other = self._algorithm.evaluated_state(model)
        if other.shape != own.shape:
            raise ValueError(f"{self._algorithm.name}.evaluated_state gave {other.numel()} "
                             f"values where flat_state(model) has {own.numel()}")
        return torch.cat([own, other.to(own.dtype)])

    def split(self, kept: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A kept state (or a stack of them) as (the worker's own model, the model it adds to
        the scored average): the same tensor twice unless the algorithm keeps one beside."""
        if not self.beside:
            return kept, kept
        half = kept.shape[-1] // 2
        return kept[..., :half], kept[..., half:]


class Snapshots:
    """Copies of this worker's model (what `keep` keeps of it: EvaluatedModel.keep) at
    wall-clock ticks, evaluated after training."""

    def __init__(self, interval_s: float,
                 keep: Callable[[nn.Module], torch.Tensor] = flat_state):
        self.interval_s = interval_s
        self.keep = keep
        self.stride = 1
        self.by_tick: dict[int, tuple[int, torch.Tensor]] = {}

    def maybe_take(self, elapsed_s: float, iteration: int, model) -> float:
        """Snapshot if a new tick began; returns the seconds spent (excluded from the step)."""
        tick = int(elapsed_s / self.interval_s)
        if tick % self.stride or tick in self.by_tick:
            return 0.0
        start = time.perf_counter()
        self.by_tick[tick] = (iteration, self.keep(model))  # a new tensor (torch.cat)
        if len(self.by_tick) > MAX_SNAPSHOTS:
            self.stride *= 2
            self.by_tick = {t: s for t, s in self.by_tick.items() if t % self.stride == 0}
        return time.perf_counter() - start

    def at(self, tick: int) -> tuple[int, torch.Tensor]:
        """The latest snapshot taken at or before `tick`."""
        return self.by_tick[max(t for t in self.by_tick if t <= tick)]


class History:
    """This worker's model after each step (every `stride`-th once memory runs short), with
    when the step ended: the states the time to target is searched over after training."""

    def __init__(self, budget_bytes: int = HISTORY_BYTES,
                 keep: Callable[[nn.Module], torch.Tensor] = flat_state):
        self.budget_bytes = budget_bytes
        self.keep = keep  # what is kept of the model (EvaluatedModel.keep)
        self.stride = 1
        # Seconds since the common start at which each kept step ended, in order (a call while
        # the device has not told yet: step_lines.StepLines.ended_s), and beside them the
        # iteration that followed and the flat model.
        self._times: list[float | Callable[[], float]] = []
        self.states: list[tuple[int, torch.Tensor]] = []
        self._unresolved = False

    @property
    def times(self) -> list[float]:
        """When each kept step ended (after training, every one is known)."""
        if self._unresolved:
            self._times = [t() if callable(t) else t for t in self._times]
            self._unresolved = False
        return self._times

    def add(self, elapsed_s: float | Callable[[], float], iteration: int, model) -> float:
        """Keep the model after this step; returns the seconds that took (0 when skipped)."""
        if iteration % self.stride:
            return 0.0
        start = time.perf_counter()
        flat = self.keep(model)  # a new tensor (torch.cat): no clone needed
        self._times.append(elapsed_s)
        self._unresolved = self._unresolved or callable(elapsed_s)
        self.states.append((iteration, flat))
        while len(self.states) > 1 and (
                len(self.states) * flat.numel() * flat.element_size() > self.budget_bytes):
            self.stride *= 2
            kept = [i for i, (it, _) in enumerate(self.states) if it % self.stride == 0]
            self._times = [self._times[i] for i in kept]
            self.states = [self.states[i] for i in kept]
        return time.perf_counter() - start

    def times_between(self, lo_s: float, hi_s: float) -> list[float]:
        return self.times[bisect.bisect_right(self.times, lo_s):
                          bisect.bisect_right(self.times, hi_s)]

    def at(self, t_s: float) -> tuple[int, torch.Tensor]:
        """The iteration and model this worker had at `t_s` (its latest step ended by then)."""
        return self.states[max(0, bisect.bisect_right(self.times, t_s) - 1)]

    def after(self, iteration: int) -> torch.Tensor:
        """The model kept latest at or before `iteration` (exactly it while the stride is 1)."""
        kept = [it for it, _ in self.states]
        return self.states[max(0, bisect.bisect_right(kept, iteration) - 1)][1]


#: Rank 0's requests to a server rank whose model is scored (ServerModel.answer).
_END, _STRIDES, _AT, _FINAL, _WINDOW_SIZE, _WINDOW = range(6)


class ServerModel:
    """A server rank's model, where the algorithm scores it (evaluated_model = "server"): kept
    while the rank serves, at the snapshot ticks and (with a target) after every update, as a
    worker keeps its own; after training, sent to rank 0 as it asks for it (ServerModels).

    serve() reports each update through ctx.model_updated (`updated`). A tick's snapshot then
    holds the model after the first update that ended after the tick, as a worker's holds the
    model after the first step that ended after it; with a target the ticks are read off the
    history instead, exactly."""

    def __init__(self, config: RunConfig, model: nn.Module, t0_ns: int):
        self.model = model
        self.snapshots = Snapshots(config.eval_interval_s)
        self.history = History() if config.target else None
        self.updates = 0
        #: Host seconds the copies took, inside serving (the server's done record says them).
        self.kept_s = 0.0
        self._t0_ns, self._dilation = t0_ns, config.dilation
        self.snapshots.maybe_take(0.0, 0, model)  # tick 0: the common initial model
        if self.history is not None:
            self.history.add(0.0, 0, model)

    def updated(self) -> None:
        """The model changed (ctx.model_updated): a clock read and, at a new tick or with a
        target, a copy of the model."""
        self.updates += 1
        elapsed_s = (now_ns() - self._t0_ns) / 1e9 / self._dilation
        self.kept_s += self.snapshots.maybe_take(elapsed_s, self.updates, self.model)
        if self.history is not None:
            self.kept_s += self.history.add(elapsed_s, self.updates, self.model)

    @torch.no_grad()
    def answer(self, ctx: WorkerContext) -> None:
        """After training: answer rank 0's requests (ServerModels) until it has scored."""
        comm, device = ctx.comm, ctx.device
        note(ctx.rank, f"kept the model after {self.updates} updates; rank 0 scores it")
        comm.wait_for_arrivals("server-evaluation", 2)  # rank 0 may save models first

        def reply(*values: float) -> None:
            comm.send(torch.tensor(values, dtype=torch.float64, device=device), 0, TARGET_TAG)

        request = torch.zeros(3, dtype=torch.float64, device=device)
        while True:
            comm.recv(request, src=0, tag=TARGET_TAG)
            kind, a, b = request.tolist()
            if kind == _END:
                return
            if kind == _STRIDES:
                reply(self.snapshots.stride, self.history.stride if self.history else 1)
            elif kind == _AT:  # a tick (a) at b seconds: as the workers pick their model
                _, flat = (self.snapshots.at(int(a)) if self.history is None
                                   else self.history.at(b))
                comm.send(flat, 0, TARGET_TAG)
            elif kind == _FINAL:
                comm.send(flat_state(self.model), 0, TARGET_TAG)
            elif kind == _WINDOW_SIZE:
                reply(len(self.history.times_between(a, b)) + 1)
            elif kind == _WINDOW:  # the model at a, then after each update in (a, b]
                times = [a, *self.history.times_between(a, b)]
                kept = [self.history.at(t) for t in times]
                comm.send(torch.tensor([[t, it] for t, (it, _) in zip(times, kept, strict=True)],
                                       dtype=torch.float64, device=device), 0, TARGET_TAG)
                comm.send(torch.stack([flat for _, flat in kept]), 0, TARGET_TAG)
            else:
                raise RuntimeError(f"evaluation: unknown request {kind} from rank 0")


class ServerModels:
    """Rank 0's requests for the server rank's kept models (ServerModel.answer there): the
    model at a tick, the final one, those of a time window."""

    def __init__(self, ctx: WorkerContext, server: int, like: torch.Tensor):
        self.comm, self.server, self.device = ctx.comm, server, ctx.device
        self.size, self.dtype = like.numel(), like.dtype
        self.state_bytes = like.numel() * like.element_size()
        ctx.comm.wait_for_arrivals("server-evaluation", 2)

    def _ask(self, kind: int, a: float = 0.0, b: float = 0.0) -> None:
        self.comm.send(torch.tensor([kind, a, b], dtype=torch.float64, device=self.device),
                       self.server, TARGET_TAG)

    def _take(self, *shape: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        out = torch.empty(*shape, dtype=dtype or self.dtype, device=self.device)
        self.comm.recv(out, src=self.server, tag=TARGET_TAG)
        return out

    def strides(self) -> tuple[int, int]:
        """The server's snapshot stride and its history's."""
        self._ask(_STRIDES)
        snapshots, history = self._take(2, dtype=torch.float64).tolist()
        return int(snapshots), int(history)

    def at(self, tick: int, t_s: float) -> torch.Tensor:
        self._ask(_AT, tick, t_s)
        return self._take(self.size)

    def final(self) -> torch.Tensor:
        self._ask(_FINAL)
        return self._take(self.size)

    def window_size(self, lo_s: float, hi_s: float) -> int:
        self._ask(_WINDOW_SIZE, lo_s, hi_s)
        return int(self._take(1, dtype=torch.float64).item())

    def window(self, lo_s: float, hi_s: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(times and update counts [k, 2], models [k, size]): the model at lo_s, then after
        each update it kept in (lo_s, hi_s]."""
        k = self.window_size(lo_s, hi_s)
        self._ask(_WINDOW, lo_s, hi_s)
        return self._take(k, 2, dtype=torch.float64), self._take(k, self.size)

    def close(self) -> None:
        self._ask(_END)


@torch.no_grad()
def evaluate(config: RunConfig, ctx: WorkerContext, workload: Workload, model,
              snapshots: Snapshots | None, end_s: float, iterations_done: int, run_dir: Path,
              history: History | None = None, evaluated: EvaluatedModel | None = None) -> None:
    """Score the evaluated model (EvaluatedModel: the average of all workers' models unless the
    algorithm says otherwise) at each snapshot tick, then the final model, then (with a target)
    the moment it first met the target.

    A model is its parameters and its floating-point buffers (flat_state): a batch-norm model
    is scored with the average of the running statistics each worker had at that moment, not
    with rank 0's statistics from the end of training.

    Runs after training, so evaluation never perturbs the timed path. Rank 0 writes eval.jsonl
    (and, with save_models, the final scored model: model.evaluated.npy, flat_state's layout).
    Without snapshots (emulated compute: no real model to test) only the final consensus
    distance is recorded. Where a server's model is scored, rank 0 asks the server rank for it.
    """
    evaluated = evaluated or EvaluatedModel()
    comm, workers = ctx.comm, ctx.worker_ranks
    server = None
    if snapshots is not None and evaluated.server is not None and ctx.rank == 0:
        server = ServerModels(ctx, evaluated.server, flat_state(model))

    def agreed(value: float, op) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=ctx.device)
        return comm.all_reduce_(t, op, workers).item()

    n = flat_params_numel(model)

    def spread_of(flat: torch.Tensor, mean: torch.Tensor) -> float:
        # Over the parameters only: workers that agree on them are in consensus, whatever
        # their batch-norm statistics (kept per worker by every algorithm).
        return agreed(float((flat[:n] - mean[:n]).pow(2).sum()), ReduceOp.SUM) / len(workers)

    def score(kept: torch.Tensor, iteration: float, at_s: float | None = None,
              tick: int | None = None) -> dict:
        """The record of one moment (a tick, or the end where `tick` is None); `kept`: what
        this worker kept of its model then."""
        own, shown = evaluated.split(kept)
        mean = comm.average_(own.clone(), workers)
        record = {"iteration": agreed(iteration, ReduceOp.SUM) / len(workers),
                  "consensus_distance": spread_of(own, mean)}
        if history is not None and at_s is not None:
            # At a wall-clock tick, workers can be an iteration apart (All-Reduce's models,
            # identical after every step, then differ by one step). The consensus distance
            # compares like with like: every worker's model after the same iteration, the
            # last one all workers had finished by the tick.
            common = int(agreed(history.at(at_s)[0], ReduceOp.MIN))
            own = evaluated.split(history.after(common))[0]
            record["consensus_distance"] = spread_of(own, comm.average_(own.clone(), workers))
            record["consensus_iteration"] = common
        if snapshots is None:
            return record
        scored = mean
        if evaluated.beside:  # every worker's, averaged (DiLoCo's: one model on every worker)
            scored = comm.average_(shown.clone(), workers)
        elif server is not None:
            scored = server.final() if tick is None else server.at(tick, at_s)
        if ctx.rank == 0:
            original = flat_state(model)
            set_flat_state(model, scored)
            record.update(workload.evaluate(model))
            set_flat_state(model, original)
            if tick is None and config.save_models:
                np.save(run_dir / "model.evaluated.npy", scored.cpu().numpy())
        return record

    records = []
    if snapshots is not None:
        stride = snapshots.stride
        if server is not None:  # the server's ticks count too
            stride = max(stride, server.strides()[0])
        stride = int(agreed(stride, ReduceOp.MAX))
        last_tick = int(agreed(int(end_s / snapshots.interval_s), ReduceOp.MIN))
        for tick in range(0, last_tick + 1, stride):
            note(ctx.rank, f"evaluating snapshot {tick // stride + 1}/{last_tick // stride + 1}")
            # With a history, the model each worker had at the tick itself. A snapshot is
            # taken at the first iteration start after the tick, so it may hold a step that
            # ended after it, and the time to target below, which takes each evaluation's
            # moment as exact, would report the tick for a crossing up to one step later.
            at_s = tick * snapshots.interval_s
            iteration, flat = (snapshots.at(tick) if history is None else history.at(at_s))
            records.append({"kind": "snapshot", "wall_s": at_s,
                            **score(flat, iteration, at_s, tick)})
    records.append({"kind": "final", "wall_s": agreed(end_s, ReduceOp.MAX),
                    **score(evaluated.keep(model), iterations_done)})
    if history is not None:
        records.extend(time_to_target(config, ctx, workload, model, history, records, agreed,
                                      evaluated, server))
    if server is not None:
        server.close()
    if ctx.rank == 0:
        log = EventLog(RunDir(run_dir).evaluations)
        for record in records:
            log.append({"schema_version": SCHEMA_VERSION, "run_id": config.run_id, **record})
        log.close()


def time_to_target(config: RunConfig, ctx: WorkerContext, workload: Workload, model,
                    history: History, records: list[dict], agreed,
                    evaluated: EvaluatedModel | None = None,
                    server: ServerModels | None = None) -> list[dict]:
    """The first moment the evaluated model met config.target, to one step of one worker (or
    one update of the server whose model is scored: `server`, on rank 0).

    The evaluations above bound it: the first one that met the target. Every step any worker
    ended before that (every update of the server) that changed the evaluated model is a
    candidate, all of them from the start (a crossing the evaluations missed, the metric going
    above the target and back between two of them, counts too). Every worker (and the server)
    sends rank 0 its models from that window; rank 0 makes the evaluated model as it was at
    each candidate moment and tests it, in time order (see LINEAR_PROBES), until one meets the
    target. Beyond GATHER_BYTES the window shrinks to the bracket (from the evaluation before).
    Returns one "target" record on rank 0 (its iteration and consensus distance: the workers'
    at that moment).
    """
    evaluated = evaluated or EvaluatedModel()
    target = parse_target(config.target)
    first = -1
    if ctx.rank == 0:
        first = next((i for i, r in enumerate(records) if target.met(r.get(target.column))), -1)
    first = int(agreed(first, ReduceOp.MAX))  # rank 0's answer (the others said -1)
    if first < 0:
        return []
    stride = history.stride
    if server is not None:
        stride = max(stride, server.strides()[1])
    stride = int(agreed(stride, ReduceOp.MAX))
    # "moment": what the time is, a step's end (some worker's; the averaged model changed
    # there) or the evaluation's tick (only when no step ended in the window searched).
    found = {**records[first], "kind": "target", "target": target.spec,
             "resolution_iterations": stride, "probes": 0, "exact": stride == 1,
             "moment": "evaluation"}
    if first == 0:
        return [found] if ctx.rank == 0 else []
    hi_s = records[first]["wall_s"]
    state_bytes = history.states[0][1].numel() * history.states[0][1].element_size()

    def window_bytes(lo_s: float) -> float:
        """What every rank would send rank 0 of the window (lo_s, hi_s]."""
        mine = (len(history.times_between(lo_s, hi_s)) + 1) * state_bytes
        if server is not None:
            mine += server.window_size(lo_s, hi_s) * server.state_bytes
        return agreed(mine, ReduceOp.SUM)

    lo_s = 0.0
    if window_bytes(lo_s) > GATHER_BYTES:
        lo_s = records[first - 1]["wall_s"]
        found["exact"] = False
        window = window_bytes(lo_s)
        if window > GATHER_BYTES:
            note(ctx.rank, f"time to target not refined: {window / 2**20:.0f} MiB of models "
                            "would not fit; reports interpolate between evaluations")
            return []
    # Each worker's states in (lo_s, hi_s], after the one it had at lo_s; counts first.
    times = [lo_s, *history.times_between(lo_s, hi_s)]
    counts = torch.zeros(ctx.workers, dtype=torch.float64, device=ctx.device)
    counts[ctx.rank] = len(times)
    ctx.comm.all_reduce_(counts, ReduceOp.SUM, ctx.worker_ranks)
    mine = [history.at(t) for t in times]
    payload = torch.stack([flat for _, flat in mine])
    meta = torch.tensor([[t, it] for t, (it, _) in zip(times, mine, strict=True)],
                        dtype=torch.float64, device=ctx.device)
    if ctx.rank != 0:
        ctx.comm.send(meta, 0, tag=TARGET_TAG)
        ctx.comm.send(payload, 0, tag=TARGET_TAG)
        return []
    per_worker = [(meta, payload)]
    for w in range(1, ctx.workers):
        n = int(counts[w].item())
        meta_w = torch.empty(n, 2, dtype=torch.float64, device=ctx.device)
        payload_w = torch.empty(n, payload.shape[1], dtype=payload.dtype, device=ctx.device)
        ctx.comm.recv(meta_w, src=w, tag=TARGET_TAG)
        ctx.comm.recv(payload_w, src=w, tag=TARGET_TAG)
        per_worker.append((meta_w, payload_w))
    # Whose models make the evaluated one: the server's, or each worker's (the part it keeps
    # for it), with the times each one's were kept.
    sources = ([server.window(lo_s, hi_s)] if server is not None else
               [(m, evaluated.split(p)[1]) for m, p in per_worker])
    source_times = [m[:, 0].tolist() for m, _ in sources]
    worker_times = [m[:, 0].tolist() for m, _ in per_worker]
    # The candidates: each moment the evaluated model changed (some source's model did), in
    # time order; the bracket's end (the evaluation that met the target) is the last.
    changed = {ts[i] for ts, (_, states) in zip(source_times, sources, strict=True)
               for i in range(1, len(ts)) if not torch.equal(states[i], states[i - 1])}
    candidates = [*sorted(changed - {hi_s}), hi_s]
    original = flat_state(model)
    n = flat_params_numel(model)

    def mean_of(models: list[torch.Tensor]) -> torch.Tensor:
        return (sum(m.double() for m in models) / len(models)).to(payload.dtype)

    def met_at(j: int) -> bool:
        """Evaluate the evaluated model as it was at candidates[j]."""
        if j == len(candidates) - 1:
            return True  # the evaluation above did
        t = candidates[j]
        shown = mean_of([states[bisect.bisect_right(ts, t) - 1]
                         for ts, (_, states) in zip(source_times, sources, strict=True)])
        set_flat_state(model, shown)
        scores = workload.evaluate(model)
        found["probes"] += 1
        if not target.met(scores.get(target.column)):
            return False
        current = [bisect.bisect_right(ts, t) - 1 for ts in worker_times]
        owns = [evaluated.split(per_worker[w][1][i])[0] for w, i in enumerate(current)]
        own_mean = shown if server is None and not evaluated.beside else mean_of(owns)
        iterations = [per_worker[w][0][i, 1].item() for w, i in enumerate(current)]
        moment = "step end" if server is None else "server update"
        found.update(scores, wall_s=t, iteration=sum(iterations) / ctx.workers, moment=moment,
                     consensus_distance=sum(float((m[:n] - own_mean[:n]).pow(2).sum())
                                            for m in owns)
                     / ctx.workers)
        return True

    # The first candidate that meets the target. Up to LINEAR_PROBES are tested one by one, in
    # order; more are first narrowed in rounds of SCAN_PROBES evenly spaced probes to the first
    # sub-range whose end meets it (a shorter excursion above the target inside an earlier
    # sub-range is then missed, and the record says it is not exact).
    lo, hi = 0, len(candidates) - 1  # the answer is in [lo, hi]
    while lo < hi:
        step = 1 if hi - lo <= LINEAR_PROBES else -(-(hi - lo) // SCAN_PROBES)
        probes = range(lo, hi, step)
        first_met = next((j for j in probes if met_at(j)), None)
        if step == 1:  # every candidate below hi was tested, in order
            break
        found["exact"] = False
        if first_met is None:
            lo = probes[-1] + 1
        else:  # the probe before it failed (or it is lo)
            lo, hi = max(lo, first_met - step + 1), first_met
    set_flat_state(model, original)
    return [found]
