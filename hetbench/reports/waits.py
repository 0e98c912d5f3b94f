"""Who waited for whom: each worker's waiting in a run, attributed to the worker it waited on.

The event logs say, per step, how long a worker was blocked (wait_s; for collectives the time
is inside comm_s) and whom it synchronized with (every worker, its group, its neighbours, the peer
it asked). A worker's *arrival* at a step is when its gradient or model was ready to send:
t_start + compute_s + slowdown_s (the harness stamps t_sync there and logs the two phases before
it, so this is exact to the nanosecond, on one clock: multi-node runs need synchronized clocks).
Which rule applies is the algorithm's own declaration (Algorithm.wait_rule: a name from
core/waits.py's WAIT_RULES, which says what each means, or a WaitRule of its own); the run's
summary.json records it, and the report quotes the rule it applied. The rules
(reports/wait_rules.py):

- all: a step of iteration k meets every worker's step k. Every worker waits for the last
  arrival; its waiting is last arrival - own arrival (capped at its step's length), attributed
  to that last worker. A collective logs no wait_s (the wait is inside comm_s, or inside
  backward where compute ends at DDP's last bucket), so here the waiting is inferred from the
  arrivals. A step that met nobody (peers = 0: a local step) waited for nobody.
- group: the members of one P-Reduce (same group_id, or same schedule step and members) wait
  for the member that entered it last. Each member's logged wait_s is exactly the last
  member's entry stamp minus its own, so the last member is the one with the smallest wait_s;
  every other member's wait_s is attributed to it.
- neighbours: worker i's step k waits for the ranks it met at step k (its event's peer_ranks,
  as the harness recorded them from its Comm operations or StepInfo said; a step that met
  every worker logs no list and counts as meeting them all). Its logged wait_s up to the
  latest of their arrivals is attributed to that rank; the rest (after everyone had arrived)
  is transfer time, left unattributed.
- from: as neighbours; where the step logged no wait_s, its waiting is inferred from the
  arrivals as for all workers. A step may name the senders it waited for and their iteration
  (`awaited`, `awaited_iteration`: messages over a delay bound old).
- peer: an active worker's wait_s is the round trip of its request, ended by the reply of the
  peer it asked (event field `peer`): attributed to that peer. A passive worker waits only for
  its own serving thread's lock: unattributed.
- quorum: the steps whose gradients made one update (same `version`, not dropped) wait for
  the last of them to arrive, which closed it; a dropped step waited for nobody.
- server: a worker's exchange waits on the server rank alone (its queue of other workers'
  gradients, its update, the reply).
- named: the step names the rank whose message ended each wait (event field `waited_on`).

Waiting that a rule cannot pin on a worker is counted as UNATTRIBUTED, never guessed; an
algorithm whose log says none of the above is not attributed, and the report says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from hetbench.core.record import read_events, read_run_json
from hetbench.core.rundir import RunDir
from hetbench.core.waits import WAIT_RULES, WaitRule, declared_wait_rule
from hetbench.reports.wait_rules import (
    EPS,
    UNATTRIBUTED,
    all_workers,
    groups,
    met_ranks,
    named,
    neighbours,
    one_peer,
    quorum,
    to_server,
)

NAN = float("nan")

#: Each rule's meaning, quoted in the report (algorithms declare theirs: Algorithm.wait_rule).
RULES = WAIT_RULES


@dataclass
class RunWaits:
    """One run's attributed waiting: `table` has a row per (worker, waited_on) with seconds."""

    run_id: str
    algorithm: str
    workers: int
    rule: str | None
    reason: str | None = None
    #: What the rule says, as the report quotes it (a plugin's own rule brings its own).
    rule_text: str | None = None
    table: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: Injected slowdown seconds per worker (for marking the slowed ones).
    slowdown_s: dict[int, float] = field(default_factory=dict)
    #: Compute seconds per worker (a slowdown stands out only against it).
    compute_s: dict[int, float] = field(default_factory=dict)
    #: (rank, iteration) -> (waited_on, seconds), for the trace's span args.
    per_step: dict[tuple[int, int], tuple[int, float]] = field(default_factory=dict)

    @property
    def attributed(self) -> bool:
        return self.rule is not None

    def label(self, rank: int, slowed: set[int]) -> str:
        """A rank as the tables name it: * for a slowed worker, (server) past the workers."""
        server = " (server)" if rank >= self.workers else ""
        return f"{rank}{' *' if rank in slowed else ''}{server}"

    def slowed(self) -> set[int]:
        """Workers whose injected slowdown stands out: more than twice the median of the other
        workers' and over 10% of their own compute (a det:/trace: straggler; prob: slows
        everyone alike, so it marks none)."""
        marked = set()
        for rank, seconds in self.slowdown_s.items():
            others = sorted(s for r, s in self.slowdown_s.items() if r != rank)
            if not others:
                continue
            middle = len(others) // 2
            median = others[middle] if len(others) % 2 else (others[middle - 1]
                                                             + others[middle]) / 2
            if seconds > 2 * median and seconds > 0.1 * self.compute_s.get(rank, 0.0):
                marked.add(rank)
        return marked

    def matrix(self) -> pd.DataFrame:
        """Seconds waited: a row per waiting worker, a column per worker waited on (and one for
        unattributed waiting when there is any)."""
        if self.table.empty:
            return pd.DataFrame()
        pivot = self.table.pivot_table(index="worker", columns="waited_on", values="wait_s",
                                       aggfunc="sum", fill_value=0.0)
        ranks = range(self.workers)
        servers = sorted(r for r in pivot.columns if r >= self.workers)  # ps-async's server
        columns = [*ranks, *servers, *([UNATTRIBUTED] if UNATTRIBUTED in pivot.columns else [])]
        return pivot.reindex(index=ranks, columns=columns, fill_value=0.0)

    def per_worker(self) -> pd.DataFrame:
        """A row per worker: seconds waited, the worker most waited on and its share, and every
        worker waited on with its seconds."""
        matrix = self.matrix()
        slowed = self.slowed()
        rows = []
        for worker in range(self.workers):
            waited = matrix.loc[worker] if not matrix.empty else pd.Series(dtype=float)
            total = float(waited.sum())
            on = waited.drop(UNATTRIBUTED, errors="ignore")
            on = on[on > 0].sort_values(ascending=False)
            top = int(on.index[0]) if len(on) else None
            rows.append({
                "worker": f"{worker}{' *' if worker in slowed else ''}",
                "injected_slowdown_s": self.slowdown_s.get(worker, 0.0),
                "waited_s": total,
                "most_waited_on": "" if top is None else self.label(top, slowed),
                "share_on_it": float(on.iloc[0]) / total if top is not None and total else NAN,
                "unattributed_s": float(waited.get(UNATTRIBUTED, 0.0)),
                "waited_on": ", ".join(f"{int(r)}: {s:.3g} s" for r, s in on.items()),
            })
        return pd.DataFrame(rows)


def _declared(config: dict[str, Any], summary: dict[str, Any]) -> tuple[Any, str]:
    """(the rule the run's algorithm declares, "") or (None, why it cannot be known). The
    summary records its name (`wait_rule`), so the algorithm is imported only for a rule of its
    own (whose code the report runs) or a run whose summary predates the field."""
    if "wait_rule" in summary and (summary["wait_rule"] is None
                                   or summary["wait_rule"] in WAIT_RULES):
        return summary["wait_rule"], ""
    try:
        from hetbench.core.config import RunConfig

        run = RunConfig.from_dict(config)
        return declared_wait_rule(run.algorithm_class(), run.algorithm_config(),
                                  run.workers), ""
    except Exception as exc:  # a plugin no longer installed, a hand-edited config
        return None, f"its algorithm's wait rule cannot be read ({type(exc).__name__}: {exc})"


def _rule_of(config: dict[str, Any], events: dict[int, list[dict]],
             summary: dict[str, Any]) -> tuple[str | WaitRule | None, str]:
    """(rule, "") for a run whose log supports the rule its algorithm declares (or, for one
    that declares none, the rule its log's fields imply), else (None, why not)."""
    declared, why = _declared(config, summary)
    if why:
        return None, why
    logged = {key for rank_events in events.values() for e in rank_events for key in e}
    if declared is None:  # an algorithm older than wait_rule: what its fields imply
        for rule, needs in (("named", "waited_on"), ("group", "group"),
                            ("from", "peer_ranks")):
            if needs in logged:
                return rule, ""
        return None, "its log does not say which workers each step synchronized with"
    if isinstance(declared, WaitRule):
        return declared, ""
    if declared not in WAIT_RULES:
        return None, (f"its wait_rule {declared!r} is none of {', '.join(WAIT_RULES)} (nor a "
                      "WaitRule of its own)")
    needs = {"named": "waited_on", "group": "group", "peer": "peer", "quorum": "version"}
    if declared in needs and events and needs[declared] not in logged:
        return None, (f"its rule is {declared!r}, and its log has no {needs[declared]!r} "
                      f"field (a simulated run may not log it)")
    return declared, ""


def load_rank_events(run_dir: Path) -> dict[int, list[dict]]:
    """Each worker's events in iteration order (torn lines skipped, as every reader does)."""
    events = {}
    for rank, _ in RunDir(run_dir).event_logs():
        records, _ = read_events(Path(run_dir), rank)  # on rank 0's clock
        events[rank] = sorted(records, key=lambda e: e["iteration"])
    return dict(sorted(events.items()))


def run_waits(run_dir: str | Path, events: dict[int, list[dict]] | None = None) -> RunWaits:
    """Attribute one run's waiting (`events`: its load_rank_events, when already read)."""
    run_dir = Path(run_dir)
    config = read_run_json(RunDir(run_dir).config)
    events = load_rank_events(run_dir) if events is None else events
    workers = int(config.get("workers", len(events)))
    try:
        summary = read_run_json(RunDir(run_dir).summary)
    except (OSError, ValueError):  # no summary yet (a run in progress), or unreadable
        summary = {}
    rule, reason = _rule_of(config, events, summary)
    if not events and RunDir(run_dir).workers.exists():
        rule, reason = None, ("simulated with one record per worker, no event lines "
                              "(`bench sim --events full` writes them)")
    custom = rule if isinstance(rule, WaitRule) else None
    result = RunWaits(run_dir.name, config.get("algorithm", ""), workers,
                      custom.name if custom else rule, reason or None,
                      custom.description if custom else WAIT_RULES.get(rule))
    result.slowdown_s = {r: sum(e.get("slowdown_s", 0.0) for e in es) for r, es in events.items()}
    result.compute_s = {r: sum(e.get("compute_s", 0.0) for e in es) for r, es in events.items()}
    if rule is None or not events:
        return result
    if custom is not None:
        found = custom.attribute(events, config)
    elif rule == "all":
        found = all_workers(events)
    elif rule == "group":
        found = groups(events)
    elif rule == "neighbours":
        found = neighbours(events, workers)
    elif rule == "from":
        found = met_ranks(events, workers)
    elif rule == "quorum":
        found = quorum(events)
    elif rule == "server":
        found = to_server(events, server=workers)
    elif rule == "named":
        found = named(events)
    else:
        found = one_peer(events)
    rows = []
    for rank, iteration, on, seconds in found:
        rows.append((rank, on, seconds))
        if on != UNATTRIBUTED:
            result.per_step[(rank, iteration)] = (on, seconds)
    result.table = pd.DataFrame(rows, columns=["worker", "waited_on", "wait_s"])
    if not result.table.empty:
        result.table = result.table.groupby(["worker", "waited_on"], as_index=False)[
            "wait_s"].sum()
    return result


def with_inferred_waits(events: dict[int, list[dict]], waits: RunWaits
                        ) -> dict[int, list[dict]]:
    """The events as the worker spent them: where the log counts waiting inside communication
    (the "all" rule: allreduce's wait for the last arrival is inside its collective, so its
    wait_s is 0; and "from" for a step that logged no wait_s), the inferred seconds move from
    comm_s to wait_s and the step's line says `wait_inferred`. Timelines and traces draw these,
    so a straggler shows as waiting, not as a slow network. Other steps are returned as they are."""
    if waits.rule not in ("all", "from", "quorum") or not waits.per_step:
        return events
    drawn = {}
    for rank, rank_events in events.items():
        drawn[rank] = []
        for e in rank_events:
            found = waits.per_step.get((rank, e["iteration"]))
            if found is None or e.get("wait_s", 0.0) > EPS:
                drawn[rank].append(e)
                continue
            moved = min(found[1], max(e.get("comm_s", 0.0), 0.0))
            drawn[rank].append({**e, "wait_s": moved, "comm_s": e.get("comm_s", 0.0) - moved,
                                "wait_inferred": True})
    return drawn


def waits_long(all_waits: list[RunWaits]) -> pd.DataFrame:
    """waits.csv: a row per (run, worker, waited_on) with seconds and whether each is slowed."""
    frames = []
    for w in all_waits:
        if w.table.empty:
            continue
        frame = w.table.copy()
        slowed = w.slowed()
        frame.insert(0, "run_id", w.run_id)
        frame["waited_on"] = frame["waited_on"].map(
            lambda r: "unattributed" if r == UNATTRIBUTED else str(int(r)))
        frame["worker_slowed"] = frame["worker"].isin(slowed)
        frame["waited_on_slowed"] = frame["waited_on"].isin({str(r) for r in slowed})
        frame["rule"] = w.rule
        frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=["run_id", "worker", "waited_on", "wait_s", "worker_slowed",
                                     "waited_on_slowed", "rule"])
    return pd.concat(frames, ignore_index=True)


def waits_summary(all_waits: list[RunWaits]) -> pd.DataFrame:
    """A row per run: its rule (or why none), total waiting, and the worker most waited on."""
    rows = []
    for w in all_waits:
        row = {"run_id": w.run_id, "rule": w.rule or "not attributed"}
        if w.attributed and not w.table.empty:
            total = float(w.table["wait_s"].sum())
            on = w.table[w.table["waited_on"] != UNATTRIBUTED].groupby("waited_on")[
                "wait_s"].sum().sort_values(ascending=False)
            slowed = w.slowed()
            top = int(on.index[0]) if len(on) else None
            row.update({
                "waited_s": total,
                "most_waited_on": "" if top is None else w.label(top, slowed),
                "share_on_it": float(on.iloc[0]) / total if top is not None and total else NAN,
                "unattributed_s": max(0.0, total - float(on.sum())),  # not -1e-16
                "slowed": ", ".join(map(str, sorted(slowed))),
            })
        elif w.attributed:
            row.update({"waited_s": 0.0, "slowed": ", ".join(map(str, sorted(w.slowed())))})
        else:
            row["why not"] = w.reason
        rows.append(row)
    return pd.DataFrame(rows)


def waits_heatmap(waits: RunWaits, path: Path) -> Path:
    """waits.png: seconds each worker (row) waited on each worker (column); slowed marked *."""
    from hetbench.reports.plots import new_figure

    matrix = waits.matrix()
    slowed = waits.slowed()
    labels = [f"{r} *" if r in slowed else str(r) for r in range(waits.workers)]
    servers = [f"{r} (server)" for r in matrix.columns if r >= waits.workers]
    columns = [*labels, *servers, *(["?"] if UNATTRIBUTED in matrix.columns else [])]
    size = 2.2 + 0.35 * len(columns)
    fig = new_figure(size + 1.2, 1.6 + 0.35 * waits.workers)
    ax = fig.subplots()
    image = ax.imshow(matrix.to_numpy(), cmap="Oranges", aspect="auto")
    ax.set_xticks(range(len(columns)), columns)
    ax.set_yticks(range(waits.workers), labels)
    ax.set_xlabel("waited on (? = unattributed)")
    ax.set_ylabel("worker")
    if waits.workers <= 16:
        peak = float(matrix.to_numpy().max()) or 1.0
        for (i, j), value in pd.DataFrame(matrix.to_numpy()).stack().items():
            if value > 0:
                ax.text(j, i, f"{value:.2g}", ha="center", va="center", fontsize=7,
                        color="white" if value > 0.6 * peak else "black")
    fig.colorbar(image, ax=ax, label="seconds waited")
    ax.set_title(f"who waited for whom: {waits.run_id}\n(* = slowed worker)", fontsize=8)
    fig.savefig(path)
    return path
