"""The run record: what a run's directory holds and what its summary says, for every launcher
and for the simulator.

results/<matrix>/<run_id>/
    config.json           the resolved RunConfig (written first)
    env.json              versions, machine, git sha ({"simulated": true} for bench sim)
    services.json         what the algorithm's services() yielded (its Group Generator's address)
    events.rank<r>.jsonl  one line per iteration per worker (EventLog; the simulator's EventSink)
    eval.jsonl            test loss/accuracy of the delivered model over time
    done.rank<r>.json     written by a rank that ended cleanly (what its finish() did)
    error.rank<r>.json    written by a rank that failed (the launchers' failure analysis reads it)
    summary.json          status ok|failed|interrupted, cause, throughput, sync health, ...

The files are written through core.store (atomic JSON, whole JSONL lines).
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import json
import numbers
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hetbench.comm.clock import now_ns
from hetbench.core.config import SCHEMA_VERSION, RunConfig
from hetbench.core.metrics import sync_health, time_breakdown
from hetbench.core.rundir import RunDir
from hetbench.core.store import SERVICE_CPU_FILE, read_json, read_jsonl, write_json_atomic
from hetbench.core.summary import SummaryInputs, summary_body


def run_dirs(path: Path) -> list[Path]:
    """Run directories (holding config.json) under `path`, skipping set-aside attempts."""
    path = Path(path)
    if RunDir(path).config.exists():
        return [path]
    return sorted(p.parent for p in path.rglob("config.json")
                  if not any(part.startswith(".") for part in p.relative_to(path).parts))


def finished_real_runs(results_dir: Path):
    """(run_dir, config dict, summary dict) of every real run in results_dir that finished ok
    (unreadable, failed and simulated runs skipped): what the simulator's fits learn from."""
    for run_dir in run_dirs(Path(results_dir)):
        try:
            config = read_json(RunDir(run_dir).config)
            summary = read_json(RunDir(run_dir).summary)
        except (OSError, ValueError):
            continue
        if summary.get("status") == "ok" and not summary.get("simulated"):
            yield run_dir, config, summary


def encode_fields(fields: dict) -> str:
    """Algorithm fields as the tail of an event line: ',"k":v,...' (JSON)."""
    return "," + json.dumps(fields, separators=(",", ":"))[1:-1] if fields else ""


def logged_peer_ranks(ranks, rank: int, workers: int) -> list[int] | None:
    """A step's peer_ranks as its event line holds them: the ranks it met, its own excluded;
    None (no field) when it met none, or every other worker (a list that would grow with the
    world: the reports read a step with peers = workers - 1 and no list as meeting every
    worker, reports/wait_rules.py's met_of)."""
    if ranks is None:
        return None
    met = {int(r) for r in ranks}
    met.discard(rank)
    # Every other worker, counted over the list rather than compared with a set of the whole
    # world, which would cost O(workers) for each step's few peers.
    others = workers - (0 <= rank < workers)
    if not met or (len(met) >= others and sum(0 <= r < workers for r in met) == others):
        return None
    return sorted(met)


#: The keys of an event line that the harness writes itself (step_event), which an algorithm's
#: fields may not set: they are the harness's measurements and the line's identity. Of the
#: harness's keys an algorithm may set only `samples` (the samples its step used), which then
#: stands where the batch size would (and is what throughput counts).
HARNESS_KEYS = frozenset({
    "schema_version", "run_id", "rank", "iteration", "t_start", "t_end", "compute_s",
    "slowdown_s", "comm_s", "wait_s", "loss", "snapshot_s", "process_cpu_s", "peers",
    "staleness", "peer_ranks", "waited_on", "samples_discarded"})


def step_event(run_id: str, rank: int, iteration: int, t_start_ns: int, t_end_ns: int,
               compute_s: float, slowdown_s: float, comm_s: float, wait_s: float,
               samples: int, *, loss: float = float("nan"), snapshot_s: float = 0.0,
               measured: dict[str, Any] | None = None, peers: int | None = None,
               staleness: float | None = None, peer_ranks: list[int] | None = None,
               discarded: bool = False, waited_on: dict[int, float] | None = None,
               fields: dict[str, Any] | None = None) -> dict[str, Any]:
    """One step of one worker as its event line says it, for real runs (the worker loop) and
    simulated ones (the simulator) alike: the step's times, samples (0 when the protocol
    threw its gradient away: samples_discarded says how many), its synchronization (peers,
    staleness, peer_ranks; waited_on: whose message ended its waits), what only a real host
    measures (`measured`: process_cpu_s), and the algorithm's own fields last.

    A field may set `samples` (the samples the step used: the line holds it once, in the
    batch size's place); a field naming another of HARNESS_KEYS is refused (ValueError): no
    key appears twice in a line, and no algorithm overwrites what the harness measured."""
    if fields:
        if not HARNESS_KEYS.isdisjoint(fields):
            raise ValueError(
                "an algorithm's event fields may not set "
                f"{', '.join(sorted(HARNESS_KEYS.intersection(fields)))}: the harness writes "
                "them (of its keys only samples, the samples the step used, may be set)")
        if "samples" in fields:
            samples = fields["samples"]
            if isinstance(samples, bool) or not isinstance(samples, numbers.Integral) \
                    or samples < 0:
                raise ValueError(f"an algorithm's event field samples must be a count of "
                                 f"samples (an int >= 0), got {samples!r}")
            samples = int(samples)
            fields = {key: value for key, value in fields.items() if key != "samples"}
    event = {"schema_version": SCHEMA_VERSION, "run_id": run_id, "rank": rank,
             "iteration": iteration, "t_start": t_start_ns, "t_end": t_end_ns,
             "compute_s": compute_s, "slowdown_s": slowdown_s, "comm_s": comm_s,
             "wait_s": wait_s, "samples": 0 if discarded else samples, "loss": loss,
             "snapshot_s": snapshot_s}
    if measured:
        event.update(measured)
    if peers is not None:
        event["peers"] = peers
        if staleness is not None:
            event["staleness"] = float(staleness)
    if peer_ranks is not None:
        event["peer_ranks"] = peer_ranks
    if waited_on:
        event["waited_on"] = {str(r): s for r, s in waited_on.items()}
    if discarded:
        event["samples_discarded"] = samples
    if fields:
        event.update(fields)
    return event


def summarize(config: RunConfig, run_dir: Path) -> dict[str, Any]:
    """Throughput, iterations and time breakdown of a finished run, from its files only
    (core.summary.summary_body over what they hold)."""
    events_by_rank, torn = [], 0
    for rank in range(config.workers):
        events, bad = read_events(run_dir, rank)
        events_by_rank.append(events)
        torn += bad
    evals, bad = read_jsonl(RunDir(run_dir).evaluations)
    done = done_records(config, run_dir)
    all_events = [e for events in events_by_rank for e in events]
    algorithm = config.algorithm_class()
    return summary_body(config, SummaryInputs(
        starts=[[e["t_start"] for e in events] for events in events_by_rank],
        ends=[[e["t_end"] for e in events] for events in events_by_rank],
        samples=[[e["samples"] for e in events] for events in events_by_rank],
        last_iterations=[events[-1]["iteration"] if events else None
                         for events in events_by_rank],
        sync=sync_health(all_events), times=time_breakdown(all_events),
        gradients_dropped=sum(1 for e in all_events if "samples_discarded" in e),
        evaluations=evals, averagings_after_training=averagings_after_training(done),
        facts=algorithm.facts_record(algorithm.summary_facts(
            config.algorithm_config(), all_events, done)),
        torn_lines=torn + bad, train_cpu_s=train_cpu_s(run_dir, done),
        host={**network_fidelity(config, done), **transport(done),
              **traffic_per_iteration(done, events_by_rank), **clock_alignment(done)}))


#: The absolute times (ns, the run's clock) an event line may hold.
EVENT_TIMES = ("t_start", "t_end", "skip_ns")


class _ReadOnce:
    """A run's files read so far in a runs_read_once() scope: event logs while they hold
    fewer than `limit` lines in all, and the small JSON files (config, summary, env, done
    records) by path."""

    def __init__(self, limit: int):
        self.limit, self.lines = limit, 0
        self.logs: dict[tuple[str, int], tuple[list[dict[str, Any]], int]] = {}
        self.files: dict[str, str] = {}


_read_once: contextvars.ContextVar[_ReadOnce | None] = contextvars.ContextVar(
    "hetbench_runs_read_once", default=None)


@contextlib.contextmanager
def runs_read_once(limit: int = 2_000_000) -> Iterator[None]:
    """Within it, each file of a run is read from disk once: read_events reads each rank's log
    once and later readers of that log get the same lines (as a new list: each reader copies a
    line it changes, as the report's do); read_run_json parses a config, summary, env or
    done record afresh from the text read the first time. A report reads every run's logs in its
    scan, its waits, its timeline and its trace, and its config and summary in the scan and the
    waits. The lines kept stay under `limit` (a simulated run's full events at 1,024 x 1,000
    are a million): beyond it, logs are read again. Nested scopes share the outermost one.
    Nothing may write a run's files within a scope (a report only reads)."""
    if _read_once.get() is not None:
        yield
        return
    token = _read_once.set(_ReadOnce(limit))
    try:
        yield
    finally:
        _read_once.reset(token)


def read_run_json(path: Path) -> Any:
    """read_json of a run's file; within runs_read_once(), the file is read from disk once
    (each call still returns a new object, which its reader may change). A file that cannot be
    read or parsed raises as read_json does, every time."""
    once = _read_once.get()
    if once is None:
        return read_json(path)
    key = str(Path(path).resolve())
    text = once.files.get(key)
    if text is None:
        text = once.files[key] = Path(path).read_text()
    return json.loads(text)


def read_events(run_dir: Path, rank: int) -> tuple[list[dict[str, Any]], int]:
    """A rank's event lines (and how many were torn), on rank 0's clock: the rank stamped
    them on its clock aligned at the start (comm/clock.py); what its clock drifted from rank
    0's by the end is removed here, taken as linear between the two estimates. Every reader
    that compares one rank's times with another's reads them through this; within
    runs_read_once(), each log once."""
    once = _read_once.get()
    if once is None:
        return _read_events(run_dir, rank)
    key = (str(Path(run_dir).resolve()), rank)
    if key not in once.logs:
        events, bad = _read_events(run_dir, rank)
        if once.lines + len(events) > once.limit:
            return events, bad
        once.logs[key] = (events, bad)
        once.lines += len(events)
    events, bad = once.logs[key]
    return list(events), bad


def _read_events(run_dir: Path, rank: int) -> tuple[list[dict[str, Any]], int]:
    events, bad = read_jsonl(RunDir(run_dir).events(rank))
    correct = drift_correction(run_dir, rank)
    if correct is not None:
        for event in events:
            for key in EVENT_TIMES:
                if key in event:
                    event[key] = correct(event[key])
    return events, bad


def drift_correction(run_dir: Path, rank: int):
    """t -> t less the drift of `rank`'s aligned clock from rank 0's by t (linear from 0 at
    the start estimate to the end estimate's), or None when there is none to remove: rank 0,
    ranks on rank 0's host (one clock), a run of an older hetbench or without an end estimate
    (it failed)."""
    try:
        clock = read_run_json(RunDir(run_dir).done(rank)).get("clock")
    except (OSError, ValueError):
        return None
    if not clock or not clock.get("aligned") or "end" not in clock:
        return None
    start, end = clock["start"], clock["end"]
    t_start = start["at_ns"] + start["offset_ns"]  # when the start estimate was made, aligned
    t_end, drift_ns = end["at_ns"], end["offset_ns"]
    if t_end <= t_start or drift_ns == 0:
        return None
    return lambda t: t + round(drift_ns * (t - t_start) / (t_end - t_start))


def clock_alignment(done: list[dict[str, Any] | None]) -> dict[str, Any]:
    """How far the ranks' clocks were from rank 0's and how well that is known, over every
    rank whose clock was aligned (on another host than rank 0's): `clock_hosts` (hosts the
    ranks ran on), `machines` (kernels they ran on: a test bed's hosts are one machine's),
    `clock_offset_ms` (the largest offset applied), `clock_error_ms` (the
    largest error bound of an estimate, start or end: how far apart two ranks' stamps may
    still be) and `clock_drift_ms` (the largest drift removed by the end). Nothing for a run
    on one host, or of an older hetbench."""
    clocks = [r["clock"] for r in done if r and r.get("clock")]
    if not clocks:
        return {}
    found: dict[str, Any] = {"clock_hosts": len({c["host"] for c in clocks})}
    machines = {c.get("machine") for c in clocks}
    if None not in machines:  # hosts of one test bed share one machine (its cores)
        found["machines"] = len(machines)
    aligned = [c for c in clocks if c.get("aligned")]
    if aligned:
        estimates = [c[when] for c in aligned for when in ("start", "end") if when in c]
        found.update(
            clock_offset_ms=max(abs(c["start"]["offset_ns"]) for c in aligned) / 1e6,
            clock_error_ms=max(e["error_ns"] for e in estimates) / 1e6,
            clock_drift_ms=max((abs(c["end"]["offset_ns"]) for c in aligned if "end" in c),
                               default=0) / 1e6)
    return found


def traffic_per_iteration(done: list[dict[str, Any] | None],
                          events_by_rank: list[list[dict]]) -> dict[str, Any]:
    """What a worker's operations moved per iteration, the mean over workers (their done
    records' `traffic`; none for a run of an older hetbench): point to point, sent plus
    received, and collectives' payload, in MB (1e6 bytes). Server ranks' traffic is the
    workers' other end, not added again."""
    per_worker = []
    for rank, events in enumerate(events_by_rank):
        record = done[rank] if rank < len(done) else None
        traffic = record.get("traffic") if record else None
        if traffic and events:
            per_worker.append(((traffic["p2p_sent_bytes"] + traffic["p2p_received_bytes"])
                               / len(events), traffic["collective_bytes"] / len(events)))
    if not per_worker:
        return {}
    return {"p2p_mb_per_iteration": sum(p for p, _ in per_worker) / len(per_worker) / 1e6,
            "collective_mb_per_iteration": sum(c for _, c in per_worker) / len(per_worker) / 1e6}


def transport(done: list[dict[str, Any] | None]) -> dict[str, Any]:
    """The backend the world used and each rank's device (their done records; none for a run
    of an older hetbench): `backend` reads "gloo, point to point via host" where ranks shared
    a GPU over gloo, which has no CUDA path for point to point."""
    records = [r.get("transport") if r else None for r in done]
    known = [r for r in records if r]
    if not known:
        return {}
    backends = sorted({r["backend"] + (", point to point via host"
                                       if r.get("host_staged_p2p") else "") for r in known})
    probed = [r["staged_p2p_mb_per_s"] for r in known if r.get("staged_p2p_mb_per_s")]
    return {"backend": "; ".join(backends),
            "devices": [r["device"] if r else None for r in records],
            **({"staged_p2p_mb_per_s": min(probed)} if probed else {})}


def network_fidelity(config: RunConfig, done: list[dict[str, Any] | None]) -> dict[str, Any]:
    """An emulated network's summary fields: `fidelity` ("high", "low", or "unknown" when a
    rank left no record) and `network`, what was emulated and how late the host made it.

    The late share is the lateness of every modeled operation (transfers, collectives, modeled
    waits) over their modeled time, summed over all ranks; above the network's max_lateness
    the host did not keep up and the run is `fidelity: low` (raise the dilation).
    """
    if not config.network:
        return {}
    records = [r.get("network") if r else None for r in done]
    info: dict[str, Any] = {
        "preset": config.network.get("preset", ""), "dilation": config.dilation,
        "description": config.cluster().describe(),
        "time": "cluster seconds (host seconds / dilation)"}
    if any(r is None for r in records):
        return {"fidelity": "unknown", "network": info}
    modeled = sum(r["modeled_s"] for r in records)
    late = sum(r["late_s"] for r in records)
    idle = [r["host_idle"] for r in records if r.get("host_idle") is not None]
    share = late / modeled if modeled > 0 else 0.0
    by_kind = late_by_kind(records)
    info.update({
        "late_share": share, "max_late_ms": max(r["max_late_s"] for r in records) * 1e3,
        "operations": sum(r["operations"] for r in records),
        "unmatched": sum(r["unmatched"] for r in records),
        "host_idle": sorted(idle)[len(idle) // 2] if idle else None,
        **({"late_by_kind": by_kind} if by_kind else {}),
    })
    low = share > config.network["max_lateness"]
    if low:
        latest = max(by_kind, key=lambda kind: by_kind[kind]["late_s"]) if by_kind else None
        where = (f", {by_kind[latest]['late_s'] / late:.0%} of it in "
                 f"{LATE_KIND_NAMES.get(latest, latest + 's')}" if latest and late > 0 else "")
        info["hint"] = (f"the host finished modeled operations {share:.0%} late (over "
                        f"{config.network['max_lateness']:.0%}{where}): raise dilation (now "
                        f"{config.dilation:g})")
    return {"fidelity": "low" if low else "high", "network": info}


#: How the low-fidelity hint names a kind of operation (others: the kind plus "s").
LATE_KIND_NAMES = {"rpc": "RPCs", "compute": "emulated compute waits"}


def late_by_kind(records: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """The ranks' lateness summed by kind of operation (collective, send, receive, rpc,
    compute): operations, late share of that kind's modeled time, late seconds, largest (ms).
    Empty for records written before kinds were kept."""
    sums: dict[str, list] = {}
    for record in records:
        for kind, tally in (record.get("by_kind") or {}).items():
            total = sums.setdefault(kind, [0, 0.0, 0.0, 0.0])
            total[0] += tally["operations"]
            total[1] += tally["modeled_s"]
            total[2] += tally["late_s"]
            total[3] = max(total[3], tally["max_late_s"])
    return {kind: {"operations": n, "late_share": late / modeled if modeled > 0 else 0.0,
                   "late_s": late, "max_late_ms": largest * 1e3}
            for kind, (n, modeled, late, largest) in sorted(sums.items())}


def done_records(config: RunConfig, run_dir: Path) -> list[dict[str, Any] | None]:
    """Each rank's done.rank<r>.json (None for a rank that has none: it failed)."""
    records: list[dict[str, Any] | None] = []
    for rank in range(config.world_size):
        try:
            records.append(read_run_json(RunDir(run_dir).done(rank)))
        except (OSError, ValueError):
            records.append(None)
    return records


def train_cpu_s(run_dir: Path, done: list[dict[str, Any] | None]) -> float | None:
    """CPU seconds the run's processes spent training: every rank's (its done record, common
    start to finish) plus its services' (SERVICE_CPU_FILE); None if a rank's is missing (it
    failed, or ran an older hetbench)."""
    total = 0.0
    for record in done:
        cpu = None if record is None else record.get("train_cpu_s")
        if not isinstance(cpu, int | float):
            return None
        total += cpu
    for path in sorted(run_dir.glob(SERVICE_CPU_FILE.format(name="*"))):
        try:
            total += float(read_json(path)["cpu_s"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
    return total


def averagings_after_training(done: list[dict[str, Any] | None]) -> int | None:
    """Averagings the ranks did after their last iteration (finish()), summed; None if no
    rank's algorithm recorded any."""
    values = [r["averagings_after_training"] for r in done
              if r is not None and isinstance(r.get("averagings_after_training"), int)]
    return sum(values) if values else None


def write_summary(config: RunConfig, run_dir: Path, status: str, cause: str | None,
                  started: float, ended: float | None = None) -> dict[str, Any]:
    """summary.json of a run (any launcher): its outcome beside what summarize() measures."""
    summary = {
        **summary_head(config, status, cause, started),
        "wall_s": (ended or time.time()) - started, "launcher": config.launcher,
        **summarize(config, run_dir),
    }
    write_json_atomic(RunDir(run_dir).summary, summary)
    return summary


def summary_head(config: RunConfig, status: str, cause: str | None,
                 started: float) -> dict[str, Any]:
    """What every summary.json starts with, real or simulated: the outcome and the config
    fields reports group by."""
    return {
        "schema_version": SCHEMA_VERSION, "run_id": config.run_id, "status": status,
        "cause": cause, "started_at": datetime.datetime.fromtimestamp(started).isoformat(),
        "algorithm": config.algorithm, "workload": config.workload,
        "workers": config.workers, "world_size": config.world_size,
        "slowdown": config.slowdown, "seed": config.seed, "pace_ms": config.pace_ms,
        "compute": config.compute, "synthetic": config.synthetic, "data": config.data_source,
    }


def write_done(run_dir: Path, rank: int, record: dict[str, Any]) -> None:
    """done.rank<r>.json: the rank ended cleanly (`bench summarize` and the launchers tell a
    finished rank from one that died without a word), with what its finish() did."""
    write_json_atomic(RunDir(run_dir).done(rank),
                      {"rank": rank, "time_ns": now_ns(), **record})


def write_error(run_dir: Path, rank: int, record: dict[str, Any]) -> None:
    """error.rank<r>.json: why the rank failed (launch.failures reads it)."""
    write_json_atomic(RunDir(run_dir).error(rank), {"rank": rank, **record})


def started_line(pid: int, host: str, launcher: str) -> str:
    """The first line a rank writes to worker.rank<r>.log (rank_hosts reads it back)."""
    return f"started (pid {pid}) on host {host} by launcher {launcher}"


def rank_hosts(run_dir: Path, world_size: int) -> dict[int, str]:
    """The host each rank ran on, from the first line of its worker log (ranks that never
    started are missing): how a failed run's cause names a lost host's ranks."""
    found = {}
    for rank in range(world_size):
        try:
            with open(RunDir(run_dir).worker_log(rank), errors="replace") as log:
                head = log.read(4096)
        except OSError:
            continue
        match = re.search(r"started \(pid \d+\) on host (\S+) by launcher", head)
        if match:
            found[rank] = match.group(1)
    return found


def last_iteration(run_dir: Path, rank: int) -> int | None:
    """The iteration of a worker's last event line (None before its first)."""
    events, _ = read_jsonl(RunDir(run_dir).events(rank))
    return events[-1]["iteration"] if events else None


def size(path: Path) -> int:
    """Bytes in `path` (0 before it exists): the launchers' sign of progress."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def events_logged(run_dir: Path, workers: int) -> int:
    """Event lines written so far by every worker (progress)."""
    total = 0
    for rank in range(workers):
        try:
            with RunDir(run_dir).events(rank).open("rb") as f:
                total += sum(1 for _ in f)
        except FileNotFoundError:
            pass
    return total
