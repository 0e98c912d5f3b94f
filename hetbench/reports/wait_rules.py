"""The rules of "who waited for whom" (reports/waits.py): each yields, from a run's events,
(worker, iteration, worker waited on or UNATTRIBUTED, seconds) for every wait it can explain.
core/waits.py's WAIT_RULES states each in words (an algorithm declares which applies to it);
the report quotes them."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

#: The waited_on value of waiting that no worker's arrival explains.
UNATTRIBUTED = -1
#: Seconds below which a difference of float stamps is rounding, not waiting (1 ns).
EPS = 1e-9


def arrival(e: dict) -> float:
    """ns at which the worker entered the step (its gradient/model ready to send)."""
    return e["t_start"] + (e.get("compute_s", 0.0) + e.get("slowdown_s", 0.0)) * 1e9


def step_seconds(e: dict) -> float:
    return e.get("wait_s", 0.0) + e.get("comm_s", 0.0)


def all_workers(events: dict[int, list[dict]]):
    """Waits of a collective over every worker, iteration by iteration."""
    by_iteration: dict[int, dict[int, dict]] = defaultdict(dict)
    for rank, rank_events in events.items():
        for e in rank_events:
            by_iteration[e["iteration"]][rank] = e
    for iteration, met in by_iteration.items():
        if len(met) < len(events):
            continue  # not every worker logged it (a run cut short): no meeting to judge
        # A step that met nobody (local SGD's local steps: peers = 0) waited for nobody.
        met = {r: e for r, e in met.items() if e.get("peers") != 0}
        if len(met) < 2:
            continue
        last = max(met, key=lambda r: arrival(met[r]))
        latest = arrival(met[last])
        for rank, e in met.items():
            if rank != last:
                waited = min((latest - arrival(e)) / 1e9, step_seconds(e))
                if waited > EPS:
                    yield rank, iteration, last, waited


def groups(events: dict[int, list[dict]]):
    meetings: dict[Any, list[tuple[int, dict]]] = defaultdict(list)
    for rank, rank_events in events.items():
        for e in rank_events:
            members = tuple(sorted(set(e.get("group") or ())))
            if len(members) < 2:
                continue
            key = (("id", e["group_id"]) if "group_id" in e else
                   ("step", e.get("schedule_step", e["iteration"]), members))
            meetings[key].append((rank, e))
    for met in meetings.values():
        members = set(met[0][1]["group"])
        if {rank for rank, _ in met} != members or len(met) != len(members):
            for rank, e in met:  # a member's side is not in the log (drained after training)
                if e.get("wait_s", 0.0) > EPS:
                    yield rank, e["iteration"], UNATTRIBUTED, e["wait_s"]
            continue
        last, _ = min(met, key=lambda m: (m[1].get("wait_s", 0.0), -arrival(m[1])))
        for rank, e in met:
            waited = e.get("wait_s", 0.0)
            if waited > EPS:
                yield rank, e["iteration"], (last if rank != last else UNATTRIBUTED), waited


def met_of(e: dict, rank: int, workers: int) -> list[int]:
    """The ranks step `e` of worker `rank` synchronized with: the senders it names as awaited
    (osgp), else its peer_ranks (what its Comm operations met, or what its StepInfo said),
    else its `from`; a step with none of them that mixed in every other worker (peers =
    workers - 1) met them all, since the harness logs no list for those (it would grow with
    the world). Any other step without a list names nobody (its wait stays unattributed)."""
    ranks = e.get("awaited", e.get("peer_ranks", e.get("from")))
    if ranks:
        return [int(r) for r in ranks if int(r) != rank]
    if e.get("peers") == workers - 1 and workers > 1:
        return [r for r in range(workers) if r != rank]
    return []


def _on_the_last(events: dict[int, list[dict]], workers: int, infer: bool):
    """Each step's waiting, on the latest arrival at its iteration among the ranks it met (or,
    where the step says it waited for messages of an earlier iteration, `awaited` at
    `awaited_iteration`: osgp's messages up to max_delay old, on the senders' arrivals there).
    With `infer`, a step that logged no wait (a collective's, inside comm_s) waited from its
    own arrival to the last one's, up to its step's length."""
    arrivals = {rank: {e["iteration"]: arrival(e) for e in rank_events}
                for rank, rank_events in events.items()}
    for rank, rank_events in events.items():
        for e in rank_events:
            logged = e.get("wait_s", 0.0)
            if logged <= EPS and not infer:
                continue
            met = met_of(e, rank, workers)
            k, own = e.get("awaited_iteration", e["iteration"]), arrival(e)
            theirs = {j: arrivals.get(j, {}).get(k) for j in met}
            if not theirs:
                if logged > EPS:
                    yield rank, e["iteration"], UNATTRIBUTED, logged
                continue
            if any(t is None for t in theirs.values()):
                if logged > EPS:
                    yield rank, e["iteration"], UNATTRIBUTED, logged
                continue
            last = max(theirs, key=theirs.get)
            on_last = min(max(0.0, (theirs[last] - own) / 1e9),
                          logged if logged > EPS else step_seconds(e))
            if on_last > EPS:
                yield rank, e["iteration"], last, on_last
            if logged - on_last > EPS:
                yield rank, e["iteration"], UNATTRIBUTED, logged - on_last


def neighbours(events: dict[int, list[dict]], workers: int):
    """A step's logged wait on the last to arrive of the ranks it met (its graph neighbours
    at this iteration), the rest unattributed."""
    return _on_the_last(events, workers, infer=False)


def met_ranks(events: dict[int, list[dict]], workers: int):
    """As neighbours, and a step that logged no wait is inferred from the arrivals."""
    return _on_the_last(events, workers, infer=True)


def one_peer(events: dict[int, list[dict]]):
    for rank, rank_events in events.items():
        for e in rank_events:
            waited = e.get("wait_s", 0.0)
            if waited > EPS:
                yield rank, e["iteration"], int(e["peer"]) if "peer" in e else UNATTRIBUTED, waited


def quorum(events: dict[int, list[dict]]):
    """allreduce-backup: the steps whose gradients made update `version` (the first n - b to
    reach the aggregator, in arrival order) wait for the last of them, which closed it."""
    closed: dict[int, list[tuple[int, dict]]] = defaultdict(list)
    for rank, rank_events in events.items():
        for e in rank_events:
            if not e.get("dropped", False) and "version" in e:
                closed[e["version"]].append((rank, e))
    for met in closed.values():
        if len(met) < 2:
            continue
        last, last_event = max(met, key=lambda m: arrival(m[1]))
        latest = arrival(last_event)
        for rank, e in met:
            if rank != last:
                waited = min((latest - arrival(e)) / 1e9, step_seconds(e))
                if waited > EPS:
                    yield rank, e["iteration"], last, waited


def to_server(events: dict[int, list[dict]], server: int):
    """ps-async: a worker's whole exchange (its gradient out, the server's queue and update,
    the parameters back) waits on the server rank alone."""
    for rank, rank_events in events.items():
        for e in rank_events:
            waited = step_seconds(e)
            if waited > EPS:
                yield rank, e["iteration"], server, waited


def named(events: dict[int, list[dict]]):
    """A step that names whom each of its waits ended on (event field `waited_on`: rank ->
    seconds; hop's receiver sees which neighbour's message made a wait's condition true):
    those seconds on those ranks, the rest of its logged wait unattributed."""
    for rank, rank_events in events.items():
        for e in rank_events:
            logged, named_s = e.get("wait_s", 0.0), 0.0
            for on, seconds in (e.get("waited_on") or {}).items():
                seconds = min(float(seconds), logged - named_s)
                if seconds > EPS:
                    named_s += seconds
                    yield rank, e["iteration"], int(on), seconds
            if logged - named_s > EPS:
                yield rank, e["iteration"], UNATTRIBUTED, logged - named_s
