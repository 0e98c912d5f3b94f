"""The life of one rank: join the world, build workload and algorithm, train, evaluate.

`python -m hetbench.harness.worker --run-dir DIR` is the one entry point every launcher (the
local one, torchrun, mpirun) starts once per rank.

The loop per iteration is: compute (forward/backward, or an emulated paced wait) -> pacing floor
-> injected slowdown -> algorithm.step (local update + synchronization) -> one event line. The
harness times each phase and records whom each step met (Comm notes it); the algorithm reports
only how long it was blocked on peers. What happens after training (evaluating the kept models,
the time-to-target search) is evaluation.py's.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import os
import socket
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hetbench.comm import rendezvous
from hetbench.comm.clock import align_to, estimate_offsets, machine_id, now_ns
from hetbench.comm.comm import Comm, ReduceOp, Traffic
from hetbench.comm.rendezvous import Rendezvous
from hetbench.core.algorithm import Algorithm
from hetbench.core.config import RunConfig
from hetbench.core.context import WorkerContext
from hetbench.core.faults import parse_fault
from hetbench.core.launchers import launcher_kind
from hetbench.core.plugins import load_from_environment
from hetbench.core.record import started_line, write_done, write_error
from hetbench.core.rundir import RunDir
from hetbench.core.signals import LAUNCHER_PID_ENV, exit_with
from hetbench.core.store import EventLog, environment, read_json, write_json_atomic
from hetbench.core.tensors import (
    flat_params,
    params_of,
)
from hetbench.core.workload import Workload
from hetbench.harness.compute_end import ComputeEnd
from hetbench.harness.evaluation import (
    EvaluatedModel,
    History,
    ServerModel,
    Snapshots,
    evaluate,
    note,
)
from hetbench.harness.launch.hostwatch import publish_rank_probe
from hetbench.harness.profiling import LoopProfiler, part
from hetbench.harness.step_lines import StepLines, loss_for_line
from hetbench.harness.work import HarnessWork, SampleStream
from hetbench.network.emulator import Emulator

#: Store key under which rank 0 publishes the services it started (runs without `bench run`).
SERVICES_KEY = "hetbench/services"



@dataclass
class RankProgress:
    """What this rank is doing, and what it has to report: error.rank<r>.json reads it when the
    rank fails, done.rank<r>.json when it ends cleanly."""

    phase: str = "starting"
    iteration: int | None = None
    failed_at_ns: int | None = None
    #: What the algorithm's finish() (or a server's serve()) returned, plus the emulated
    #: network's fidelity record.
    finish: dict[str, Any] = field(default_factory=dict)
    #: This process's CPU seconds from the common start to the end of training.
    train_cpu_s: float | None = None
    #: The run's common start (common_start_ns), on every rank the same.
    start_ns: int | None = None
    #: Which backend and device the rank used (Comm.describe).
    transport: dict[str, Any] | None = None
    #: What its Comm operations moved while training (comm.Traffic).
    traffic: dict[str, int] | None = None
    #: Its host, and its clock against rank 0's, estimated at the start (applied when
    #: `aligned`: on another host than rank 0's) and the end of training (comm/clock.py;
    #: rank 0 has no estimates).
    clock: dict[str, Any] | None = None

    def done_record(self) -> dict[str, Any]:
        return {"train_cpu_s": self.train_cpu_s, "start_ns": self.start_ns,
                "transport": self.transport, "traffic": self.traffic, "clock": self.clock,
                **self.finish}


def pick_device(requested: str, local_rank: int) -> torch.device:
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("device = cuda was asked for but CUDA is not available")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def run_worker(run_dir: Path, config: RunConfig, rdzv: Rendezvous, services: dict[str, Any],
               progress: RankProgress) -> None:
    """Join the world, set up, train, evaluate; `progress` says how far it got and what the
    rank has to report."""
    rank, world_size = rdzv.rank, rdzv.world_size
    torch.set_num_threads(1)
    device = pick_device(config.device, rdzv.local_rank)
    progress.phase = "joining the process group"
    comm = Comm.connect(rank, world_size, None, None, device, config.host_timeout_s,
                        store=rdzv.store, local_rank=rdzv.local_rank)
    progress.transport = comm.describe()
    staged = ", point to point through host memory" if comm.stages_through_host else ""
    note(rank, f"joined the world of {world_size} ranks ({comm.backend}, {device}{staged})")
    try:
        workers = list(range(config.workers))
        comm.group(workers)  # collective over the world: every rank creates it, now
        # Each rank's clock against rank 0's, before anything is stamped (set-up's references
        # included): from here on this rank stamps rank 0's time (comm/clock.py).
        estimate = estimate_offsets(comm, list(range(world_size)))
        host = socket.gethostname()
        # On rank 0's host there is one clock: an estimate's error would only add noise.
        rank0_host = _rank0_host(comm, rank, host)
        aligned = rank0_host != host and estimate is not None
        align_to(estimate if aligned else None)
        progress.clock = {"host": host, "machine": machine_id(), "aligned": aligned,
                          **({"start": estimate.to_dict()} if estimate else {})}
        workload: Workload = config.workload_class()(config.workload_config(), config.seed)
        torch.manual_seed(config.seed)  # same initial model on every rank
        model = workload.build_model().to(device)
        optimizer = workload.make_optimizer(model)
        algorithm: Algorithm = config.algorithm_class()(config.algorithm_config())
        # Made before the algorithm sees the context, which nothing changes afterwards: a
        # DDP hook ends compute through it (compute_end.py).
        end_compute = ComputeEnd(config.injector(), rank,
                                 config.dilation * config.pace_ms / 1000, device)
        ctx = WorkerContext(rank=rank, world_size=world_size, workers=config.workers,
                            device=device, comm=comm, seed=config.seed,
                            rng=np.random.default_rng([config.seed, rank, 17]),
                            services=services, end_compute=end_compute,
                            dilation=config.dilation)
        progress.phase = "setup"
        algorithm.setup(ctx, model, optimizer)
        if comm.stages_through_host and world_size >= 2 and rank < 2:
            # What a staged message costs on this host, for the report's shared-GPU note: a
            # model-sized message (up to 64 MB) between ranks 0 and 1, before the common start.
            numel = min(sum(p.numel() for p in model.parameters()), 16 * 2**20)
            progress.transport["staged_p2p_mb_per_s"] = comm.measure_staged_bandwidth(
                1 - rank, numel)
        network = config.cluster()
        if network is not None:
            if host != rank0_host:  # one host: one clock, one shared file
                raise RuntimeError(f"a [network] model emulates a cluster on one host, but rank "
                                   f"{rank} runs on {host}, not on rank 0's host")
            if rank == 0:
                Emulator.prepare(run_dir, network)
        batches = None
        if ctx.is_worker and config.compute != "emulated":
            progress.phase = "reading data"
            batches = first_batch_drawn(workload.train_batches(rank, config.workers))
        note(rank, "set up; waiting for the common start")
        # Nobody's clock runs during the others' set-up, and every rank's runs from the same t0.
        t0_ns = common_start_ns(comm)
        comm.end_setup()
        comm.traffic = Traffic()  # training's, not set-up's
        if network is not None:  # rank 0's shared file exists now: open it, start under it
            comm.start_network(Emulator.open(run_dir, network, rank))
            note(rank, f"network emulated: {network.describe()}")
        note(rank, "training")
        progress.start_ns = t0_ns
        # This process's CPU time (all its threads) while training: what the run cost the cores
        # (summary.json's train_cpu_s, report.csv's cpu_ms_per_iteration).
        cpu0_s = time.process_time()
        evaluated = EvaluatedModel.of(config, algorithm)  # which model is scored
        if not ctx.is_worker:
            progress.phase = "serving"
            # The server whose model is scored keeps it while it serves (ctx.model_updated).
            kept = (ServerModel(config, model, t0_ns)
                    if evaluated.server == rank and config.compute != "emulated" else None)
            if kept is not None:
                ctx.model_updated = kept.updated
            progress.finish = algorithm.serve(ctx, model, optimizer) or {}
            progress.train_cpu_s = time.process_time() - cpu0_s
            _end_network(comm, progress)
            if config.save_models:
                np.save(run_dir / f"model.rank{rank}.npy", flat_params(model).cpu().numpy())
            if kept is not None:
                progress.finish["model_kept_s"] = kept.kept_s
                progress.phase = "evaluation"
                kept.answer(ctx)
            return
        snapshots = Snapshots(config.eval_interval_s, evaluated.keep)
        snapshots.maybe_take(0.0, 0, model)  # tick 0: the common initial model
        emulated = config.compute == "emulated"
        history = None
        if config.target and not emulated:
            history = History(keep=evaluated.keep)
            history.add(0.0, 0, model)
        iterations_done = _train(config, ctx, workload, model, optimizer, algorithm, run_dir,
                                 t0_ns, progress, batches, None if emulated else snapshots,
                                 history)
        progress.phase = "finish"
        progress.finish = algorithm.finish(ctx, model) or {}
        progress.train_cpu_s = time.process_time() - cpu0_s
        _end_network(comm, progress)  # evaluation runs at the host's own speed
        # Workers can end their budgets far apart: asynchronous ones (a deterministic straggler
        # runs its own iterations), and synchronous decentralized ones too, a worker up to the
        # graph's diameter in iterations ahead of a straggler, which under a dilated network
        # is longer than any timeout. The evaluation's collectives must not time out.
        progress.phase = "waiting for the other workers to finish"
        comm.wait_for_arrivals("worker-finished", config.workers)
        end_s = (now_ns() - t0_ns) / 1e9 / config.dilation
        # Again at the end, on the aligned clock: what is left is the drift since the start.
        estimate = estimate_offsets(comm, workers, clock=now_ns)
        if estimate is not None:
            progress.clock["end"] = estimate.to_dict()
        progress.phase = "evaluation"
        note(rank, f"trained {iterations_done} iterations; evaluating")
        if config.save_models:
            np.save(run_dir / f"model.rank{rank}.npy", flat_params(model).cpu().numpy())
        evaluate(config, ctx, workload, model, None if emulated else snapshots, end_s,
                  iterations_done, run_dir, history, evaluated)
    except BaseException:
        # Stamp the failure before closing the group: closing resets peers' connections, and
        # their reports must not look earlier than the cause.
        progress.failed_at_ns = now_ns()
        raise
    finally:
        if comm.network is not None:
            comm.network.close()
        comm.close()


def _rank0_host(comm: Comm, rank: int, host: str) -> str:
    """The hostname of rank 0 (every rank calls it)."""
    if rank == 0:
        comm.store.set("hetbench/rank0-host", host)
        return host
    return comm.store.get("hetbench/rank0-host").decode()


def _end_network(comm: Comm, progress: RankProgress) -> None:
    """Training is over: stop emulating, and keep this rank's fidelity record and what its
    operations moved for done.json."""
    progress.traffic = dataclasses.asdict(comm.traffic)
    if comm.network is not None:
        progress.finish["network"] = comm.network.report()
        comm.network.close()
        comm.network = None


def common_start_ns(comm: Comm) -> int:
    """The run's t0, the same on every rank: the moment the last rank was ready (the latest
    of the clocks every rank reads on arriving, agreed by a MAX all-reduce that is also the
    barrier before training). Times in the event logs are absolute; those from t0 (snapshot
    ticks, the target search's step ends, time budgets) place every worker's model on one
    timeline only if t0 is common. Each rank reading its own clock after the barrier, as
    before, started the ranks' clocks up to ~80 ms apart when 9 processes shared 2 cores (the
    host woke them one by one), so an "averaged model at 1 s" mixed models of different real
    moments: several iterations, and for ps-async dozens of server updates, apart.
    (float64 holds nanoseconds since the epoch to 256 ns.)"""
    arrived = torch.tensor([float(now_ns())], dtype=torch.float64, device=comm.device)
    return int(comm.all_reduce_(arrived, ReduceOp.MAX).item())


def first_batch_drawn(batches: Iterator) -> Iterator:
    """The same stream of minibatches, its first already drawn: a workload may read or generate
    its data set at the first draw (mlp-clusters generates 73,728 samples: 1.6 s a process,
    6-13 s with 8-16 ranks on 2 cores), which is set-up, before the common start, not training
    time (it was counted in real runs' time to target, and no simulated run has it)."""
    first = next(batches)
    return itertools.chain([first], batches)


def _train(config: RunConfig, ctx: WorkerContext, workload: Workload, model, optimizer,
           algorithm: Algorithm, run_dir: Path, t0_ns: int, progress: RankProgress,
           batches: Iterator | None, snapshots: Snapshots | None,
           history: History | None = None) -> int:
    """Train until the budget is spent (`batches`: the worker's minibatches, None under
    emulated compute); returns the worker's final iteration counter."""
    rank, comm, device = ctx.rank, ctx.comm, ctx.device
    options = config.workload_config()
    dilation = config.dilation
    end_compute = ctx.end_compute
    agree_on_stop = algorithm.synchronous and config.seconds is not None
    fault = parse_fault(config.fault, config.workers)
    if batches is None:
        # Fixed, seeded gradients of the real shapes: real message sizes, no real compute.
        g = torch.Generator().manual_seed(config.seed * 1000 + rank)
        for p in params_of(model):
            p.grad = (torch.randn(p.shape, generator=g) * 1e-4).to(device)
        net = None
    else:
        net = algorithm.forward_module(model)
    work = None
    if algorithm.owns_compute():  # micro-batches of the algorithm's choosing (work.py)
        def emulated_wait(seconds: float) -> None:
            if comm.network is None:
                time.sleep(seconds)
            else:  # a modeled wait: its lateness counts against the run's fidelity
                comm.network.wait(seconds, comm.network.clock())

        work = HarnessWork(workload, net, model,
                           None if batches is None else SampleStream(batches), end_compute,
                           options.batch_size, device, dilation, emulated_wait,
                           dilation * options.compute_ms / 1000)
    log = EventLog(RunDir(run_dir).events(rank))
    steps = StepLines(config, rank, log, t0_ns, options.batch_size)
    profiler = LoopProfiler.from_env(run_dir, rank, device)  # HETBENCH_PROFILE (profiling.py)
    iteration = 0
    # The process's CPU time (all threads: a receiver thread's too) since the previous event:
    # what one iteration costs the cores, whether or not it waited.
    cpu_mark_s = time.process_time()
    kept_s = 0.0  # seconds History.add took after the previous step
    try:
        while True:
            elapsed_s = (now_ns() - t0_ns) / 1e9 / dilation
            stop = (config.iterations is not None and iteration >= config.iterations) or (
                config.seconds is not None and elapsed_s >= config.seconds)
            if agree_on_stop:
                flag = torch.tensor([float(stop)], device=device)
                stop = bool(comm.all_reduce_(flag, ReduceOp.MAX, ctx.worker_ranks).item())
            if stop:
                break
            progress.phase, progress.iteration = "training", iteration
            # Keeping models for evaluation is outside every step but inside the run's wall
            # time: its seconds are on record (snapshot_s) beside the step they follow.
            snapshot_s = kept_s + (
                snapshots.maybe_take(elapsed_s, iteration, model) if snapshots else 0.0) / dilation
            kept_s = 0.0

            if profiler is not None:
                profiler.at_iteration(iteration)
            end_compute.begin(iteration, elapsed_s)
            if work is not None:
                with part(profiler, "forward_backward"):
                    if batches is not None:
                        optimizer.zero_grad()
                    work.begin()
                    algorithm.compute(ctx, model, work)
                    loss = work.finish()
                    loss = None if loss is None else loss_for_line(loss)
            elif batches is None:
                if comm.network is None:
                    time.sleep(dilation * options.compute_ms / 1000)
                else:  # a modeled wait: its lateness counts against the run's fidelity
                    comm.network.wait(dilation * options.compute_ms / 1000, comm.network.clock())
                loss = None
            else:
                with part(profiler, "data"):
                    x, y = next(batches)
                    x, y = x.to(device), y.to(device)
                with part(profiler, "forward_backward"):
                    optimizer.zero_grad()  # set_to_none: no fill_ per parameter, as a plain loop
                    loss = workload.loss(net, (x, y))
                    loss.backward()  # DDP's hook may end compute in here (see compute_end.py)
                    loss = loss_for_line(loss)  # read when the line is written: no wait
            with part(profiler, "end_compute"):
                end_compute()
            if fault:
                fault.maybe_fire(rank, iteration)
            with part(profiler, "step"):
                comm.record_step()
                info = algorithm.step(ctx, model, optimizer)
                did = comm.recorded_step()
                if work is not None and info.samples is None:
                    info.samples = work.samples
            with part(profiler, "bookkeeping"):
                times = end_compute.step_done()
                cpu_now_s = time.process_time()
                process_cpu_s, cpu_mark_s = cpu_now_s - cpu_mark_s, cpu_now_s
                steps.add(times, iteration, loss, info, did, process_cpu_s, snapshot_s)
                iteration = (info.next_iteration if info.next_iteration is not None
                             else iteration + 1)
                if history is not None:  # after the step; its time goes in the next one's
                    kept_s = history.add(steps.ended_s(times), iteration, model) / dilation
                steps.write_ready()  # in batches (step_lines.py)
    except BaseException:
        with contextlib.suppress(Exception):  # the cause is what propagates, not this
            steps.close()
        raise
    else:
        steps.close()
    finally:
        log.close()
        if profiler is not None:
            profiler.close()
    return iteration


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
    progress = RankProgress()
    try:
        # HETBENCH_PLUGINS (the launchers pass bench's --plugin on): before the config, whose
        # algorithm and workload names they may register.
        progress.phase = "loading plugins"
        load_from_environment()
        progress.phase = "starting"
        config = RunConfig.from_dict(read_json(RunDir(args.run_dir).config))
        kind = launcher_kind(config.launcher)
        if not kind.collects_rank_output:
            log_to_run_dir(args.run_dir, rank)
            if os.environ.get(LAUNCHER_PID_ENV):  # started by `bench run`, not by hand
                exit_with(int(os.environ[LAUNCHER_PID_ENV]))
        note(rank, started_line(os.getpid(), socket.gethostname(), config.launcher))
        if kind.rank_answers_probes:  # no process of bench's on this host (hostwatch.py)
            publish_rank_probe(args.run_dir, rank)
        progress.phase = "rendezvous"
        rdzv = _join(config, args)
        rank = rdzv.rank
        with contextlib.ExitStack() as stack:
            services = _services(config, args.run_dir, rdzv, stack, progress)
            run_worker(args.run_dir, config, rdzv, services, progress)
        write_done(args.run_dir, rank, progress.done_record())
    except BaseException as exc:
        # On a full disk even this record may not be written: the launcher then names the
        # rank (and the disk) from what it sees, and the rank still ends here.
        with contextlib.suppress(OSError):
            write_error(args.run_dir, rank, {
                "exception": type(exc).__name__, "message": str(exc).strip()[:2000],
                "phase": progress.phase, "iteration": progress.iteration,
                "traceback": traceback.format_exc(),
                "time_ns": progress.failed_at_ns or now_ns(),
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
    fd = os.open(RunDir(run_dir).worker_log(rank), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _join(config: RunConfig, args: argparse.Namespace) -> Rendezvous:
    kind = launcher_kind(config.launcher)
    return kind.load(kind.joins)(rendezvous.JoinRequest(
        config.world_size, config.host_timeout_s, config.bind_host, Path(args.run_dir),
        args.rank, args.store_host, args.store_port))


def _services(config: RunConfig, run_dir: Path, rdzv: Rendezvous,
              stack: contextlib.ExitStack, progress: RankProgress) -> dict[str, Any]:
    """What the algorithm's services() yielded: from services.json when `bench run` launched the
    run and started them; else rank 0 starts them and passes their address through the store.

    Rank 0 also writes env.json then, since no launcher process on a machine of the run did.
    """
    path = run_dir / "services.json"
    if path.exists():
        return read_json(path)
    if rdzv.rank == 0:
        if not RunDir(run_dir).env.exists():
            write_json_atomic(RunDir(run_dir).env, environment())
        progress.phase = "starting services"
        services = stack.enter_context(config.algorithm_class().services(config, run_dir))
        rdzv.store.set(SERVICES_KEY, json.dumps(services))
        return services
    return json.loads(rdzv.store.get(SERVICES_KEY))


def end_finished_rank() -> None:
    """End a rank started as `python -m hetbench.harness.worker` (torchrun, mpirun, srun) whose
    records are written, as a rank of the local launcher ends (multiprocessing's os._exit):
    without the interpreter's teardown, where destructors of torch's C++ threads have aborted a
    finished rank ("terminate called without an active exception", SIGABRT), which its
    launcher then reports as a failed run. MPI is finalized first: mpirun counts a rank that
    exits without it as failed."""
    sys.stdout.flush()
    sys.stderr.flush()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    os._exit(0)


if __name__ == "__main__":
    main()
    end_finished_rank()
