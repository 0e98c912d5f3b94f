"""After training: score the averaged model at the snapshot ticks and at the end, and find the
moment it first met the run's target; the models kept during training for that (Snapshots at
wall-clock ticks, History after every step).

Evaluation runs after training, so it never perturbs the timed path; the worker loop only keeps
the models (worker.py).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from pathlib import Path

import torch

from hetbench.comm.comm import ReduceOp
from hetbench.core.config import SCHEMA_VERSION, RunConfig
from hetbench.core.context import WorkerContext
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


class Snapshots:
    """Copies of this worker's parameters at wall-clock ticks, evaluated after training."""

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self.stride = 1
        self.by_tick: dict[int, tuple[int, torch.Tensor]] = {}

    def maybe_take(self, elapsed_s: float, iteration: int, model) -> float:
        """Snapshot if a new tick began; returns the seconds spent (excluded from the step)."""
        tick = int(elapsed_s / self.interval_s)
        if tick % self.stride or tick in self.by_tick:
            return 0.0
        start = time.perf_counter()
        self.by_tick[tick] = (iteration, flat_state(model))  # a new tensor (torch.cat)
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

    def __init__(self, budget_bytes: int = HISTORY_BYTES):
        self.budget_bytes = budget_bytes
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
        flat = flat_state(model)  # a new tensor (torch.cat): no clone needed
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


@torch.no_grad()
def evaluate(config: RunConfig, ctx: WorkerContext, workload: Workload, model,
              snapshots: Snapshots | None, end_s: float, iterations_done: int, run_dir: Path,
              history: History | None = None) -> None:
    """Score the average of all workers' models at each snapshot tick, then the final model,
    then (with a target) the moment the averaged model first met it.

    A model is its parameters and its floating-point buffers (flat_state): a batch-norm model
    is scored with the average of the running statistics each worker had at that moment, not
    with rank 0's statistics from the end of training.

    Runs after training, so evaluation never perturbs the timed path. Rank 0 writes eval.jsonl.
    Without snapshots (emulated compute: no real model to test) only the final consensus
    distance is recorded.
    """
    comm, workers = ctx.comm, ctx.worker_ranks

    def agreed(value: float, op) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=ctx.device)
        return comm.all_reduce_(t, op, workers).item()

    n = flat_params_numel(model)

    def spread_of(flat: torch.Tensor, mean: torch.Tensor) -> float:
        # Over the parameters only: workers that agree on them are in consensus, whatever
        # their batch-norm statistics (kept per worker by every algorithm).
        return agreed(float((flat[:n] - mean[:n]).pow(2).sum()), ReduceOp.SUM) / len(workers)

    def score(flat: torch.Tensor, iteration: float, at_s: float | None = None) -> dict:
        mean = comm.average_(flat.clone(), workers)
        record = {"iteration": agreed(iteration, ReduceOp.SUM) / len(workers),
                  "consensus_distance": spread_of(flat, mean)}
        if history is not None and at_s is not None:
            # At a wall-clock tick, workers can be an iteration apart (All-Reduce's models,
            # identical after every step, then differ by one step). The consensus distance
            # compares like with like: every worker's model after the same iteration, the
            # last one all workers had finished by the tick.
            common = int(agreed(history.at(at_s)[0], ReduceOp.MIN))
            own = history.after(common)
            record["consensus_distance"] = spread_of(own, comm.average_(own.clone(), workers))
            record["consensus_iteration"] = common
        if ctx.rank == 0 and snapshots is not None:
            original = flat_state(model)
            set_flat_state(model, mean)
            record.update(workload.evaluate(model))
            set_flat_state(model, original)
        return record

    records = []
    if snapshots is not None:
        stride = int(agreed(snapshots.stride, ReduceOp.MAX))
        last_tick = int(agreed(int(end_s / snapshots.interval_s), ReduceOp.MIN))
        for tick in range(0, last_tick + 1, stride):
            note(ctx.rank, f"evaluating snapshot {tick // stride + 1}/{last_tick // stride + 1}")
            # With a history, the model each worker had at the tick itself. A snapshot is
            # taken at the first iteration start after the tick, so it may hold a step that
            # ended after it, and the time to target below, which takes each evaluation's
            # moment as exact, would report the tick for a crossing up to one step later.
            iteration, flat = (snapshots.at(tick) if history is None
                               else history.at(tick * snapshots.interval_s))
            records.append({"kind": "snapshot", "wall_s": tick * snapshots.interval_s,
                            **score(flat, iteration, tick * snapshots.interval_s)})
    records.append({"kind": "final", "wall_s": agreed(end_s, ReduceOp.MAX),
                    **score(flat_state(model), iterations_done)})
    if history is not None:
        records.extend(time_to_target(config, ctx, workload, model, history, records, agreed))
    if ctx.rank == 0:
        log = EventLog(run_dir / "eval.jsonl")
        for record in records:
            log.append({"schema_version": SCHEMA_VERSION, "run_id": config.run_id, **record})
        log.close()


def time_to_target(config: RunConfig, ctx: WorkerContext, workload: Workload, model,
                    history: History, records: list[dict], agreed) -> list[dict]:
    """The first moment the averaged model met config.target, to one step of one worker.

    The evaluations above bound it: the first one that met the target. Every step any worker
    ended before that changed the averaged model, so those end times are the candidates, all of
    them from the start (a crossing the evaluations missed, the metric going above the target
    and back between two of them, counts too). Every worker sends rank 0 its models from that
    window; rank 0 averages them as they were at each candidate moment and tests it, in time
    order (see LINEAR_PROBES), until one meets the target. Beyond GATHER_BYTES the window
    shrinks to the bracket (from the evaluation before). Returns one "target" record on rank 0.
    """
    target = parse_target(config.target)
    first = -1
    if ctx.rank == 0:
        first = next((i for i, r in enumerate(records) if target.met(r.get(target.column))), -1)
    first = int(agreed(first, ReduceOp.MAX))  # rank 0's answer (the others said -1)
    if first < 0:
        return []
    stride = int(agreed(history.stride, ReduceOp.MAX))
    # "moment": what the time is, a step's end (some worker's; the averaged model changed
    # there) or the evaluation's tick (only when no step ended in the window searched).
    found = {**records[first], "kind": "target", "target": target.spec,
             "resolution_iterations": stride, "probes": 0, "exact": stride == 1,
             "moment": "evaluation"}
    if first == 0:
        return [found] if ctx.rank == 0 else []
    hi_s = records[first]["wall_s"]
    state_bytes = history.states[0][1].numel() * history.states[0][1].element_size()
    window = int(agreed(len(history.times_between(0.0, hi_s)) + 1, ReduceOp.SUM))
    lo_s = 0.0
    if window * state_bytes > GATHER_BYTES:
        lo_s = records[first - 1]["wall_s"]
        found["exact"] = False
        window = int(agreed(len(history.times_between(lo_s, hi_s)) + 1, ReduceOp.SUM))
        if window * state_bytes > GATHER_BYTES:
            note(ctx.rank, f"time to target not refined: {window} models of {state_bytes} "
                            "bytes would not fit; reports interpolate between evaluations")
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
    # The candidates: each moment some worker ended a step, in time order; the bracket's end
    # (the evaluation that met the target) is the last.
    worker_times = [m[:, 0].tolist() for m, _ in per_worker]
    candidates = [*sorted({t for ts in worker_times for t in ts[1:]} - {hi_s}), hi_s]
    original = flat_state(model)
    n = flat_params_numel(model)

    def met_at(j: int) -> bool:
        """Evaluate the average of every worker's model as it was at candidates[j]."""
        if j == len(candidates) - 1:
            return True  # the evaluation above did
        t = candidates[j]
        current = [bisect.bisect_right(ts, t) - 1 for ts in worker_times]
        models = [per_worker[w][1][i] for w, i in enumerate(current)]
        mean = (sum(m.double() for m in models) / ctx.workers).to(payload.dtype)
        set_flat_state(model, mean)
        scores = workload.evaluate(model)
        found["probes"] += 1
        if not target.met(scores.get(target.column)):
            return False
        iterations = [per_worker[w][0][i, 1].item() for w, i in enumerate(current)]
        found.update(scores, wall_s=t, iteration=sum(iterations) / ctx.workers, moment="step end",
                     consensus_distance=sum(float((m[:n] - mean[:n]).pow(2).sum())
                                            for m in models)
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
