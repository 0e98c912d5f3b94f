"""timeline.json: a whole run in the Chrome trace event format, for ui.perfetto.dev or
chrome://tracing.

One track (thread) per worker, in one process named by the run id. Each iteration becomes up to
five back-to-back "X" (complete) spans: compute, slowdown (injected), group generator (Prague's
request for its group: the event's gg_s, part of the logged comm_s), wait, comm. Their durations
are the logged seconds, so a worker's spans sum to its logged compute_s, slowdown_s, wait_s and
comm_s; where the log counts waiting inside communication (allreduce: the "all" rule of
reports/waits.py), the wait inferred from the arrivals is drawn as wait and the rest as comm
(with_inferred_waits; the wait span then says "inferred"). The harness stamps t_start and the
moment the step began (compute + slowdown before it),
and t_end; inside a step it logs only how long the algorithm was blocked, not when, so the order
group generator -> wait -> comm is inferred (Prague asks for its group before its P-Reduce; the
other algorithms' wait is drawn first as in the PNG timeline). Time between a step's end and the
next step's start (snapshots for the evaluation, the budget check) has no span: the log has its
length (snapshot_s) but not where it fell.

Args carry the iteration ("it"), the step's synchronization fields (group, group_id, peer,
peers, used neighbours) on its wait and comm spans, and "on": the worker the wait is attributed
to (reports/waits.py), on the wait span. Hop's skips are instant events.

Kept compact for whole runs: no indentation, short arg keys, times in microseconds relative to
the run's first step (3 decimals: ns), zero-length spans left out. 16 workers x 3000 iterations
is under 30 MB, which Perfetto's UI opens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hetbench.core.record import read_run_json
from hetbench.core.rundir import RunDir
from hetbench.errors import UserError
from hetbench.reports.waits import load_rank_events, run_waits, with_inferred_waits

#: Logged fields copied into the sync spans' args (what the step met).
SYNC_FIELDS = ("group", "group_id", "peer", "peers", "used", "served", "schedule_step")
PID = 1


def trace_events(run_dir: str | Path) -> dict[str, Any]:
    """The run's trace as a JSON-ready dict ({"traceEvents": [...], ...})."""
    run_dir = Path(run_dir)
    events = load_rank_events(run_dir)
    if not any(events.values()):
        raise UserError(f"run {run_dir.name} has no events to trace; pick another run")
    config = read_run_json(RunDir(run_dir).config)
    waits = run_waits(run_dir, events)
    events = with_inferred_waits(events, waits)
    slowed = waits.slowed()
    t0 = min(es[0]["t_start"] for es in events.values() if es)
    out: list[dict[str, Any]] = [
        {"ph": "M", "pid": PID, "name": "process_name", "args": {"name": run_dir.name}}]
    for rank, rank_events in events.items():
        name = f"worker {rank}" + (" (slowed)" if rank in slowed else "")
        out.append({"ph": "M", "pid": PID, "tid": rank, "name": "thread_name",
                    "args": {"name": name}})
        out.append({"ph": "M", "pid": PID, "tid": rank, "name": "thread_sort_index",
                    "args": {"sort_index": rank}})
        for e in rank_events:
            k = e["iteration"]
            sync = {key: e[key] for key in SYNC_FIELDS if key in e}
            on = waits.per_step.get((rank, k))
            gg_s = e.get("gg_s", 0.0) or 0.0
            phases = [("compute", e.get("compute_s", 0.0), {"it": k}),
                      ("slowdown", e.get("slowdown_s", 0.0), {"it": k}),
                      ("group generator", gg_s, {"it": k, **sync}),
                      ("wait", e.get("wait_s", 0.0), {"it": k, **sync}),
                      ("comm", e.get("comm_s", 0.0) - gg_s, {"it": k, **sync})]
            if on is not None:
                # The wait span says whom it waited on; where the log counted the wait inside
                # comm (allreduce), the span is the seconds inferred from the arrivals.
                phases[3][2]["on"] = on[0]
                if e.get("wait_inferred"):
                    phases[3][2]["inferred"] = True
            # Span edges on whole nanoseconds, each span starting where the previous one
            # ended: rounded separately, ts + dur could overlap the next span by a nanosecond,
            # and trace viewers then nest or drop it.
            # The logged seconds can add up to a nanosecond past t_end (float sums); the step
            # never ends after t_end, where the worker's next iteration may begin.
            t, limit = float(e["t_start"] - t0), e["t_end"] - t0
            start = round(t)
            for phase, seconds, args in phases:
                t += max(seconds, 0.0) * 1e9
                end = min(round(t), limit)
                if end > start:  # under 1 ns: float noise of the logged subtraction
                    out.append({"ph": "X", "pid": PID, "tid": rank, "name": phase,
                                "ts": start / 1e3, "dur": (end - start) / 1e3, "args": args})
                    start = end
            if "skip_ns" in e:
                out.append({"ph": "i", "s": "t", "pid": PID, "tid": rank, "name": "skip",
                            "ts": (e["skip_ns"] - t0) / 1e3,
                            "args": {"it": k, "to": e.get("skip_to"),
                                     "skipped": e.get("skipped")}})
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "otherData": {"run_id": run_dir.name, "t0_ns": t0,
                          "wait_rule": waits.rule or f"not attributed: {waits.reason}",
                          **{k: v if isinstance(v, str) else json.dumps(v)
                             for k, v in config.items()}}}


def write_trace(run_dir: str | Path, path: Path) -> Path:
    """Write `run_dir`'s trace to `path` (compact JSON); returns the path."""
    from hetbench.core.store import write_text_atomic

    write_text_atomic(path, json.dumps(trace_events(run_dir), separators=(",", ":")))
    return path
