"""Fitting the simulator's cost models to real runs (`bench sim --fit-from RESULTS`): compute
time per workload and pace, alpha and CPU per message from allreduce runs at two sizes, the
P-Reduce communicator's set-up and the Group Generator's time per request from prague runs."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from hetbench.core.config import RunConfig
from hetbench.core.record import finished_real_runs
from hetbench.core.rundir import RunDir
from hetbench.errors import UserError
from hetbench.sim.model import ComputeModel, layout


def fit_compute(results_dir: Path) -> ComputeModel:
    """Compute times of unslowed, post-warm-up iterations of real runs, per (workload, pace),
    and per (workload, pace, algorithm) those of iterations that computed the workload's whole
    batch: an algorithm that computes its batch its own way (DropCompute's micro-batches, each
    a pass of its own) costs its own time on the host, which a simulated run of it draws
    from when the fit has it (ComputeModel.sampler).

    A real iteration's compute is compute_s plus the part of slowdown_s that was not injected
    (the sleep overshoot), so an iteration counts only where the run's injector, rebuilt from
    its config, says the factor was 1. The worker loop's own time between two steps (writing
    the event line, the stop check: t_start less the previous t_end) belongs to the iteration
    too, as the simulator starts the next compute when a step ends; so a sample is that gap +
    compute_s + slowdown_s, i.e. the previous step's end to this one's start.
    """
    from hetbench.core.store import read_jsonl
    from hetbench.slowdown import parse_slowdown

    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise UserError(f"--fit-from {results_dir}: no such directory")
    samples: dict[tuple[str, float], list[float]] = {}
    own: dict[tuple[str, float, str], list[float]] = {}
    for run_dir, config, _ in finished_real_runs(results_dir):
        try:
            injector = parse_slowdown(config["slowdown"], seed=config["seed"])
            injector.validate(config["workers"])
        except UserError:
            continue  # a trace file that moved: the slowed iterations cannot be told apart
        key = (config["workload"], float(config.get("pace_ms", 0.0)))
        batch = config.get("workload_options", {}).get("batch_size")
        warmup = config.get("warmup_iterations", 0)
        for rank in range(config["workers"]):
            events, _ = read_jsonl(RunDir(run_dir).events(rank))
            if not events:
                continue
            t0 = events[0]["t_start"]
            for before, e in zip(events[max(warmup, 1) - 1:], events[max(warmup, 1):],
                                 strict=False):
                if injector.factor(rank, e["iteration"], (e["t_start"] - t0) / 1e9) == 1.0:
                    gap = max(e["t_start"] - before["t_end"], 0) / 1e9
                    seconds = gap + e["compute_s"] + e["slowdown_s"]
                    samples.setdefault(key, []).append(seconds)
                    if batch is not None and e.get("samples") == batch:
                        own.setdefault((*key, config["algorithm"]), []).append(seconds)
    if not samples:
        raise UserError(f"--fit-from {results_dir}: no finished real runs with events there")
    return ComputeModel(fitted={k: tuple(sorted(v)) for k, v in samples.items()},
                        fitted_by_algorithm={k: tuple(sorted(v)) for k, v in own.items()},
                        fitted_from=str(results_dir))


def fit_gg_request(results_dir: Path) -> float | None:
    """Seconds the Group Generator spends per request, from real prague-smart/random runs: the
    CPU its process spent serving (service-gg.cpu.json) over the run's iterations (one request
    each); the median over runs. Python gRPC, not the grouping, is most of it, which is why
    it is fitted from the service's CPU rather than from GroupGenerator.request."""
    from hetbench.core.store import SERVICE_CPU_FILE, read_json

    per_request = []
    for run_dir, _, summary in finished_real_runs(Path(results_dir)):
        try:  # runs whose algorithm ran the Group Generator (its service wrote its CPU)
            cpu = float(read_json(run_dir / SERVICE_CPU_FILE.format(name="gg"))["cpu_s"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if summary.get("iterations"):
            per_request.append(cpu / summary["iterations"])
    return statistics.median(per_request) if per_request else None


def fit_alpha(results_dir: Path, beta_bytes_per_s: float) -> float | None:
    """Per-message latency that makes the ring all-reduce formula match real allreduce runs
    (no CPU term): the median over runs of `allreduce_hops`' per-hop cost; None if none."""
    hops = allreduce_hops(results_dir, beta_bytes_per_s)
    return statistics.median(h for _, _, h in hops) if hops else None


def allreduce_hops(results_dir: Path, beta_bytes_per_s: float) -> list[tuple[int, int, float]]:
    """(workers, cores, seconds per hop) of every finished real allreduce run without slowdown.

    A run's hop cost: per post-warm-up iteration, the comm_s of the worker whose gradient was
    ready last (it waited for nobody: real allreduce counts waiting for a late peer as
    communication, and the simulator draws that jitter from the fitted compute), the median
    over iterations, less the bandwidth term, over the ring formula's 2(n-1) hops per bucket.
    Runs with slowdown are left out: while a straggler sleeps the others are blocked and leave
    the cores free, so their collectives are cheaper than a run's usual ones. cores: env.json's
    cpu_count.
    """
    from hetbench.core.store import read_jsonl

    hops = []
    for run_dir, raw, _ in finished_real_runs(results_dir):
        if raw.get("algorithm") != "allreduce" or raw.get("slowdown") != "none":
            continue
        config = RunConfig.from_dict(raw)
        n = config.workers
        last: dict[int, tuple[int, float]] = {}  # iteration -> (ready at, comm_s) of the last
        for r in range(n):
            for e in read_jsonl(RunDir(run_dir).events(r))[0][config.warmup_iterations:]:
                ready = e["t_start"] + round((e["compute_s"] + e["slowdown_s"]) * 1e9)
                if ready > last.get(e["iteration"], (-1, 0.0))[0]:
                    last[e["iteration"]] = (ready, e["comm_s"])
        if not last:
            continue
        buckets = layout(config).bucket_bytes
        bandwidth = sum(2 * (n - 1) / n * b / beta_bytes_per_s for b in buckets)
        comm = statistics.median(c for _, c in last.values())
        hops.append((n, run_cores(run_dir) or 1,
                     max(comm - bandwidth, 0.0) / (2 * (n - 1) * len(buckets))))
    return hops


def run_cores(run_dir: Path) -> int | None:
    """The cpu_count a real run's env.json records (None if it does not)."""
    from hetbench.core.store import read_json

    try:
        cores = read_json(RunDir(run_dir).env).get("cpu_count")
    except (OSError, ValueError):
        return None
    return cores if isinstance(cores, int) and cores >= 1 else None


@dataclass(frozen=True)
class LatencyFit:
    """alpha and cpu_s fitted from real allreduce runs, and the cores they shared."""

    alpha_s: float
    cpu_s: float
    cores: int | None
    runs: int


def fit_latency(results_dir: Path, beta_bytes_per_s: float) -> LatencyFit | None:
    """alpha and the CPU time per message from real allreduce runs at several worker counts.

    All of an all-reduce's n processes are in the collective at once, so each of its hops costs
    alpha + cpu_s * max(1, n / cores) (NetworkModel.hop with active = n). A least-squares line
    through the runs' (max(1, n / cores), hop cost) points gives alpha (intercept) and cpu_s
    (slope), both kept >= 0. With one sharing level only (e.g. one worker count) the two cannot
    be told apart: cpu_s = 0 and alpha is the median hop. None without such runs.
    """
    hops = allreduce_hops(results_dir, beta_bytes_per_s)
    if not hops:
        return None
    cores = sorted({c for _, c, _ in hops})
    machine = cores[0] if len(cores) == 1 else None
    xs = [max(1.0, n / c) for n, c, _ in hops]
    ys = [h for _, _, h in hops]
    if len(set(xs)) < 2:
        return LatencyFit(statistics.median(ys), 0.0, machine, len(hops))
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = (sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
             / sum((x - mx) ** 2 for x in xs))
    intercept = my - slope * mx
    if slope < 0:
        slope, intercept = 0.0, my
    elif intercept < 0:  # through the origin
        slope, intercept = sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(
            x * x for x in xs), 0.0
    return LatencyFit(intercept, slope, machine, len(hops))


def fit_group_setup(results_dir: Path) -> float | None:
    """Seconds to build a P-Reduce member communicator, from real prague-smart/random runs.

    Their events name each step's group (members, group_id) but not whether its communicator
    was built or found: the members' LRU caches of `cache_size` member sets are replayed over
    the groups in the order they were used (their first end), as the simulator keeps them (a
    use is a miss when any member lacks the set). A run's estimate: the median post-warm-up
    comm_s of misses less that of hits; the median over runs with at least 3 misses and 3
    hits. None without such runs.
    """
    from hetbench.core.store import read_jsonl
    from hetbench.sim.protocol import MemberCaches

    estimates = []
    for run_dir, raw, _ in finished_real_runs(results_dir):
        config = RunConfig.from_dict(raw)
        # Groups P-Reduced through member caches (the algorithm's options size them); their
        # events name each group (group_id), as below.
        cache_size = getattr(config.algorithm_config(), "cache_size", None)
        if cache_size is None:
            continue
        events = [read_jsonl(RunDir(run_dir).events(r))[0]
                  for r in range(config.workers)]
        first_end: dict[int, tuple[int, tuple[int, ...]]] = {}
        for rank_events in events:
            for e in rank_events:
                if "group_id" not in e or len(e.get("group", ())) < 2:
                    continue
                members = tuple(sorted(e["group"]))
                seen = first_end.get(e["group_id"])
                if seen is None or e["t_end"] < seen[0]:
                    first_end[e["group_id"]] = (e["t_end"], members)
        caches = MemberCaches(config.workers, cache_size)
        missed = {group_id: not caches.use(members) for group_id, (_, members)
                  in sorted(first_end.items(), key=lambda kv: kv[1][0])}
        hits, misses = [], []
        for rank_events in events:
            for e in rank_events[config.warmup_iterations:]:
                if e.get("group_id") in missed:
                    (misses if missed[e["group_id"]] else hits).append(e["comm_s"])
        if len(misses) >= 3 and len(hits) >= 3:
            estimates.append(max(statistics.median(misses) - statistics.median(hits), 0.0))
    return statistics.median(estimates) if estimates else None
