"""The life of one rank: join the world, build workload and algorithm, train, evaluate.

`python -m hetbench.harness.worker --run-dir DIR` is the one entry point every launcher (the
local one, torchrun, mpirun) starts once per rank.

The loop per iteration is: compute (forward/backward, or an emulated paced wait) -> pacing floor
-> injected slowdown -> algorithm.step (local update + synchronization) -> one event line. The
harness times each phase; the algorithm reports only how long it was blocked on peers.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import os
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hetbench.comm import rendezvous
from hetbench.comm.comm import Comm, ReduceOp
from hetbench.comm.rendezvous import Rendezvous
from hetbench.core.algorithm import Algorithm, StepInfo
from hetbench.core.config import SCHEMA_VERSION, RunConfig
from hetbench.core.context import WorkerContext
from hetbench.core.faults import parse_fault
from hetbench.core.record import write_done, write_error
from hetbench.core.signals import LAUNCHER_PID_ENV, exit_with
from hetbench.core.store import EventLog, environment, read_json, write_json_atomic
from hetbench.core.target import parse_target
from hetbench.core.tensors import (
    flat_params,
    flat_params_numel,
    flat_state,
    params_of,
    set_flat_state,
)
from hetbench.core.workload import Workload
from hetbench.errors import UserError
from hetbench.harness.compute_end import ComputeEnd
from hetbench.network.emulator import Emulator

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
#: the averaged model, no communication: about 2 ms for svm or mlp-digits); beyond this many it
#: narrows them first in rounds of SCAN_PROBES evenly spaced tests, and can then miss a brief
#: excursion above the target (hop on svm, 8 workers: 20-25% later than the exact first moment).
LINEAR_PROBES = 4096
SCAN_PROBES = 64

#: Store key under which rank 0 publishes the services it started (runs without `bench run`).
SERVICES_KEY = "hetbench/services"

# What the rank was doing when it failed, for the cause in error.rank<r>.json.
_progress = {"phase": "starting", "iteration": None}


def pick_device(requested: str, local_rank: int) -> torch.device:
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("device = cuda was asked for but CUDA is not available")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


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
        #: Seconds since the common start at which each kept step ended, in order, and beside
        #: them the iteration that followed and the flat model.
        self.times: list[float] = []
        self.states: list[tuple[int, torch.Tensor]] = []

    def add(self, elapsed_s: float, iteration: int, model) -> float:
        """Keep the model after this step; returns the seconds that took (0 when skipped)."""
        if iteration % self.stride:
            return 0.0
        start = time.perf_counter()
        flat = flat_state(model)  # a new tensor (torch.cat): no clone needed
        self.times.append(elapsed_s)
        self.states.append((iteration, flat))
        while len(self.states) > 1 and (
                len(self.states) * flat.numel() * flat.element_size() > self.budget_bytes):
            self.stride *= 2
            kept = [i for i, (it, _) in enumerate(self.states) if it % self.stride == 0]
            self.times = [self.times[i] for i in kept]
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


def sync_fields(info: StepInfo, met: set[int] = frozenset(), rank: int = 0,
                workers: int = 0) -> dict[str, Any]:
    """The event's standard synchronization fields (peers, staleness), where the step gave them,
    and `peer_ranks`: the ranks the step met, as the step says (StepInfo.peer_ranks) or else as
    Comm recorded them (`met`). Left out when they are every other worker (all-worker
    collectives need no list, which would grow with the world)."""
    fields = {}
    if info.peers is not None:
        fields["peers"] = info.peers
    if info.staleness is not None:
        fields["staleness"] = info.staleness
    peer_ranks = (set(map(int, info.peer_ranks)) if info.peer_ranks is not None
                  else set(met) - {rank})
    if peer_ranks and not peer_ranks >= set(range(workers)) - {rank}:
        fields["peer_ranks"] = sorted(peer_ranks)
    return fields


def cluster_fields(fields: dict[str, Any], k: float) -> dict[str, Any]:
    """An algorithm's own event fields, its `*_s` seconds (host time) in cluster time."""
    if k == 1.0:
        return fields
    return {key: value / k if key.endswith("_s") and isinstance(value, float | int)
            and not isinstance(value, bool) else value for key, value in fields.items()}


def _note(rank: int, what: str) -> None:
    """A timestamped line in the rank's log (worker.rank<r>.log), for post-mortems."""
    print(f"{time.strftime('%H:%M:%S')}.{time.time_ns() // 1_000_000 % 1000:03d} rank {rank}: "
          f"{what}", flush=True)


def run_worker(run_dir: Path, config: RunConfig, rdzv: Rendezvous,
               services: dict[str, Any]) -> None:
    rank, world_size = rdzv.rank, rdzv.world_size
    torch.set_num_threads(1)
    device = pick_device(config.device, rdzv.local_rank)
    _progress["phase"] = "joining the process group"
    comm = Comm.connect(rank, world_size, None, None, device, config.host_timeout_s,
                        store=rdzv.store, local_rank=rdzv.local_rank)
    _progress["transport"] = comm.describe()
    staged = ", point to point through host memory" if comm.stages_through_host else ""
    _note(rank, f"joined the world of {world_size} ranks ({comm.backend}, {device}{staged})")
    try:
        workers = list(range(config.workers))
        comm.group(workers)  # collective over the world: every rank creates it, now
        workload: Workload = config.workload_class()(config.workload_config(), config.seed)
        torch.manual_seed(config.seed)  # same initial model on every rank
        model = workload.build_model().to(device)
        optimizer = workload.make_optimizer(model)
        algorithm: Algorithm = config.algorithm_class()(config.algorithm_config())
        ctx = WorkerContext(rank=rank, world_size=world_size, workers=config.workers,
                            device=device, comm=comm, seed=config.seed,
                            rng=np.random.default_rng([config.seed, rank, 17]),
                            services=services)
        _progress["phase"] = "setup"
        algorithm.setup(ctx, model, optimizer)
        network = config.cluster()
        if network is not None:
            _check_one_host(comm, rank)
            if rank == 0:
                Emulator.prepare(run_dir, world_size)
        _note(rank, "set up; waiting for the common start")
        comm.barrier()  # common start: nobody's clock runs during the others' set-up
        comm.end_setup()
        if network is not None:  # rank 0's shared file exists now: open it, start under it
            comm.start_network(Emulator.open(run_dir, network, rank))
            _note(rank, f"network emulated: {network.describe()}")
        _note(rank, "training")
        t0_ns = time.time_ns()
        # This process's CPU time (all its threads) while training: what the run cost the cores
        # (summary.json's train_cpu_s, report.csv's cpu_ms_per_iteration).
        cpu0_s = time.process_time()
        if not ctx.is_worker:
            _progress["phase"] = "serving"
            _progress["finish"] = algorithm.serve(ctx, model, optimizer) or {}
            _progress["train_cpu_s"] = time.process_time() - cpu0_s
            _end_network(comm)
            return
        snapshots = Snapshots(config.eval_interval_s)
        snapshots.maybe_take(0.0, 0, model)  # tick 0: the common initial model
        emulated = config.compute == "emulated"
        history = None
        if config.target and not emulated:
            history = History()
            history.add(0.0, 0, model)
        iterations_done = _train(config, ctx, workload, model, optimizer, algorithm, run_dir,
                                 t0_ns, None if emulated else snapshots, history)
        _progress["phase"] = "finish"
        _progress["finish"] = algorithm.finish(ctx, model) or {}
        _progress["train_cpu_s"] = time.process_time() - cpu0_s
        _end_network(comm)  # evaluation runs at the host's own speed
        # Workers can end their budgets far apart: asynchronous ones (a deterministic straggler
        # runs its own iterations), and synchronous decentralized ones too, a worker up to the
        # graph's diameter in iterations ahead of a straggler (D-PSGD on a ring of 32 at
        # dilation 32 finished 50 s apart). The evaluation's collectives must not time out.
        _progress["phase"] = "waiting for the other workers to finish"
        comm.wait_for_arrivals("worker-finished", config.workers)
        end_s = (time.time_ns() - t0_ns) / 1e9 / config.dilation
        _progress["phase"] = "evaluation"
        _note(rank, f"trained {iterations_done} iterations; evaluating")
        if config.save_models:
            np.save(run_dir / f"model.rank{rank}.npy", flat_params(model).cpu().numpy())
        _evaluate(config, ctx, workload, model, None if emulated else snapshots, end_s,
                  iterations_done, run_dir, history)
    except BaseException:
        # Stamp the failure before closing the group: closing resets peers' connections, and
        # their reports must not look earlier than the cause.
        _progress["failed_at_ns"] = time.time_ns()
        raise
    finally:
        if comm.network is not None:
            comm.network.close()
        comm.close()


def _check_one_host(comm: Comm, rank: int) -> None:
    """An emulated network needs every rank on one host (one clock, one shared file)."""
    host = socket.gethostname()
    if rank == 0:
        comm.store.set("hetbench/network-host", host)
    elif comm.store.get("hetbench/network-host").decode() != host:
        raise RuntimeError(f"a [network] model emulates a cluster on one host, but rank {rank} "
                           f"runs on {host}, not on rank 0's host")


def _end_network(comm: Comm) -> None:
    """Training is over: stop emulating, and keep this rank's fidelity record for done.json."""
    if comm.network is not None:
        _progress.setdefault("finish", {})["network"] = comm.network.report()
        comm.network.close()
        comm.network = None


def _train(config: RunConfig, ctx: WorkerContext, workload: Workload, model, optimizer,
           algorithm: Algorithm, run_dir: Path, t0_ns: int, snapshots: Snapshots | None,
           history: History | None = None) -> int:
    """Train until the budget is spent; returns the worker's final iteration counter."""
    rank, comm, device = ctx.rank, ctx.comm, ctx.device
    options = config.workload_config()
    # Dilation k (a network model's): modeled times last k times longer on this host, and every
    # time recorded is cluster time, the host's divided by k, from the common start t0.
    k = config.dilation

    def cluster_ns(host_ns: int) -> int:
        return host_ns if k == 1.0 else t0_ns + round((host_ns - t0_ns) / k)

    end_compute = ctx.end_compute = ComputeEnd(config.injector(), rank,
                                               k * config.pace_ms / 1000, device)
    batch_size = options.batch_size
    agree_on_stop = algorithm.synchronous and config.seconds is not None
    fault = parse_fault(config.fault, config.workers)
    batches = None
    if config.compute == "emulated":
        # Fixed, seeded gradients of the real shapes: real message sizes, no real compute.
        g = torch.Generator().manual_seed(config.seed * 1000 + rank)
        for p in params_of(model):
            p.grad = (torch.randn(p.shape, generator=g) * 1e-4).to(device)
    else:
        batches = workload.train_batches(rank, config.workers)
        net = algorithm.forward_module(model)
    log = EventLog(run_dir / f"events.rank{rank}.jsonl")
    iteration = 0
    # The process's CPU time (all threads: a receiver thread's too) since the previous event:
    # what one iteration costs the cores, whether or not it waited.
    cpu_mark_s = time.process_time()
    kept_s = 0.0  # seconds History.add took after the previous step
    try:
        while True:
            elapsed_s = (time.time_ns() - t0_ns) / 1e9 / k
            stop = (config.iterations is not None and iteration >= config.iterations) or (
                config.seconds is not None and elapsed_s >= config.seconds)
            if agree_on_stop:
                flag = torch.tensor([float(stop)], device=device)
                stop = bool(comm.all_reduce_(flag, ReduceOp.MAX, ctx.worker_ranks).item())
            if stop:
                break
            _progress["phase"], _progress["iteration"] = "training", iteration
            # Keeping models for evaluation is outside every step but inside the run's wall
            # time: its seconds are on record (snapshot_s) beside the step they follow.
            snapshot_s = kept_s + (
                snapshots.maybe_take(elapsed_s, iteration, model) if snapshots else 0.0) / k
            kept_s = 0.0

            end_compute.begin(iteration, elapsed_s)
            t_start = cluster_ns(end_compute.t_start_ns)
            if batches is None:
                if comm.network is None:
                    time.sleep(k * options.compute_ms / 1000)
                else:  # a modeled wait: its lateness counts against the run's fidelity
                    comm.network.wait(k * options.compute_ms / 1000, comm.network.clock())
                loss_value = float("nan")
            else:
                x, y = next(batches)
                optimizer.zero_grad()  # set_to_none: no fill_ per parameter, as a plain loop
                loss = workload.loss(net, (x.to(device), y.to(device)))
                loss.backward()  # DDP's hook may end compute in here (see compute_end.py)
                loss_value = loss.item()  # also waits for a GPU to finish the step
            end_compute()
            compute_s = end_compute.compute_s / k
            if fault:
                fault.maybe_fire(rank, iteration)
            # Communication that started inside backward counts from end_compute on.
            t_sync = cluster_ns(end_compute.t_end_ns)
            comm.record_peers()
            info = algorithm.step(ctx, model, optimizer)
            met = comm.recorded_peers()
            end_compute.synchronize()  # the step's own device work (its update) is the step's
            t_end = cluster_ns(time.time_ns())
            step_s = (t_end - t_sync) / 1e9
            wait_s = min(info.wait_s / k, step_s)
            cpu_now_s = time.process_time()
            process_cpu_s, cpu_mark_s = cpu_now_s - cpu_mark_s, cpu_now_s
            log.append({
                "schema_version": SCHEMA_VERSION, "run_id": config.run_id, "rank": rank,
                "iteration": iteration, "t_start": t_start, "t_end": t_end,
                "compute_s": compute_s, "slowdown_s": (t_sync - t_start) / 1e9 - compute_s,
                "comm_s": step_s - wait_s, "wait_s": wait_s,
                "samples": 0 if info.discarded else batch_size,
                **({"samples_discarded": batch_size} if info.discarded else {}),
                "loss": loss_value, "snapshot_s": snapshot_s, "process_cpu_s": process_cpu_s,
                **sync_fields(info, met, rank, config.workers),
                **cluster_fields(info.fields, k),
            })
            iteration = info.next_iteration if info.next_iteration is not None else iteration + 1
            if history is not None:  # after the event; its time goes in the next one's
                kept_s = history.add((t_end - t0_ns) / 1e9, iteration, model) / k
    finally:
        ctx.stopping = True
        log.close()
    return iteration


@torch.no_grad()
def _evaluate(config: RunConfig, ctx: WorkerContext, workload: Workload, model,
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
            _note(ctx.rank, f"evaluating snapshot {tick // stride + 1}/{last_tick // stride + 1}")
            # With a history, the model each worker had at the tick itself. A snapshot is
            # taken at the first iteration start after the tick, so it may hold a step that
            # ended after it; the time to target below takes each evaluation's moment as exact,
            # and reported the tick for a crossing up to one step later (found in a bench tune
            # trial: 1.0 s "exact" where no state before 1.0 s met the target).
            iteration, flat = (snapshots.at(tick) if history is None
                               else history.at(tick * snapshots.interval_s))
            records.append({"kind": "snapshot", "wall_s": tick * snapshots.interval_s,
                            **score(flat, iteration, tick * snapshots.interval_s)})
    records.append({"kind": "final", "wall_s": agreed(end_s, ReduceOp.MAX),
                    **score(flat_state(model), iterations_done)})
    if history is not None:
        records.extend(_time_to_target(config, ctx, workload, model, history, records, agreed))
    if ctx.rank == 0:
        log = EventLog(run_dir / "eval.jsonl")
        for record in records:
            log.append({"schema_version": SCHEMA_VERSION, "run_id": config.run_id, **record})
        log.close()


def _time_to_target(config: RunConfig, ctx: WorkerContext, workload: Workload, model,
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
    found = {**records[first], "kind": "target", "target": config.target,
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
            _note(ctx.rank, f"time to target not refined: {window} models of {state_bytes} "
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="one hetbench rank, started by a launcher: `bench run`, or torchrun / mpirun "
                    "on each machine for a run prepared with `bench run --prepare`")
    parser.add_argument("--run-dir", type=Path, required=True,
                        help="the run's directory; it holds config.json (which names the launcher)")
    parser.add_argument("--rank", type=int, default=None,
                        help="local launcher: this rank (torchrun: $RANK, mpi: the MPI rank)")
    parser.add_argument("--store-host", default="127.0.0.1", help="local launcher's store")
    parser.add_argument("--store-port", type=int, default=None, help="local launcher's store")
    args = parser.parse_args(argv)
    # The rank as far as it is known before any rendezvous, to name the log and error files.
    rank = args.rank if args.rank is not None else _rank_from_environment()
    try:
        config = RunConfig.from_dict(read_json(args.run_dir / "config.json"))
        if config.launcher != "local":
            log_to_run_dir(args.run_dir, rank)
            if os.environ.get(LAUNCHER_PID_ENV):  # started by `bench run`, not by hand
                exit_with(int(os.environ[LAUNCHER_PID_ENV]))
        _note(rank, f"started (pid {os.getpid()}) by launcher {config.launcher}")
        _progress["phase"] = "rendezvous"
        rdzv = _join(config, args)
        rank = rdzv.rank
        with contextlib.ExitStack() as stack:
            services = _services(config, args.run_dir, rdzv, stack)
            run_worker(args.run_dir, config, rdzv, services)
        write_done(args.run_dir, rank, {"train_cpu_s": _progress.get("train_cpu_s"),
                                        "transport": _progress.get("transport"),
                                        **_progress.get("finish", {})})
    except BaseException as exc:
        write_error(args.run_dir, rank, {
            "exception": type(exc).__name__, "message": str(exc).strip()[:2000],
            "phase": _progress["phase"], "iteration": _progress["iteration"],
            "traceback": traceback.format_exc(),
            "time_ns": _progress.get("failed_at_ns") or time.time_ns(),
        })
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)


def _rank_from_environment() -> int:
    """torchrun sets RANK; Open MPI's mpirun sets OMPI_COMM_WORLD_RANK (PMIx: PMIX_RANK)."""
    for key in ("RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if key in os.environ:
            return int(os.environ[key])
    raise SystemExit("hetbench.harness.worker: no --rank and no RANK / OMPI_COMM_WORLD_RANK in "
                     "the environment; start it through `bench run`, torchrun or mpirun")


def log_to_run_dir(run_dir: Path, rank: int) -> None:
    """Send this rank's stdout/stderr to worker.rank<r>.log in the run directory (the local
    launcher does it for each rank; under torchrun and mpirun, whose output interleaves every
    rank's, the worker does it itself), so a run's directory looks the same whoever started it."""
    fd = os.open(run_dir / f"worker.rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _join(config: RunConfig, args: argparse.Namespace) -> Rendezvous:
    if config.launcher == "torchrun":
        return rendezvous.join_torchrun(config.world_size, config.host_timeout_s)
    if config.launcher == "mpi":
        return rendezvous.join_mpi(config.world_size, config.bind_host, config.host_timeout_s)
    if config.launcher == "slurm":
        return rendezvous.join_slurm(args.run_dir, config.world_size, config.bind_host,
                                     config.host_timeout_s)
    if args.rank is None or args.store_port is None:
        raise UserError("launcher local: the worker needs --rank and --store-port")
    return rendezvous.join_local(args.rank, config.world_size, args.store_host,
                                 args.store_port, config.host_timeout_s)


def _services(config: RunConfig, run_dir: Path, rdzv: Rendezvous,
              stack: contextlib.ExitStack) -> dict[str, Any]:
    """What the algorithm's services() yielded: from services.json when `bench run` launched the
    run and started them; else rank 0 starts them and passes their address through the store.

    Rank 0 also writes env.json then, since no launcher process on a machine of the run did.
    """
    path = run_dir / "services.json"
    if path.exists():
        return read_json(path)
    if rdzv.rank == 0:
        if not (run_dir / "env.json").exists():
            write_json_atomic(run_dir / "env.json", environment())
        _progress["phase"] = "starting services"
        services = stack.enter_context(config.algorithm_class().services(config, run_dir))
        rdzv.store.set(SERVICES_KEY, json.dumps(services))
        return services
    return json.loads(rdzv.store.get(SERVICES_KEY))


if __name__ == "__main__":
    main()
