"""How an algorithm's waits are attributed to the workers waited on ("who waited for whom"):
the menu of rules an algorithm declares from (Algorithm.wait_rule), and the form of a rule it
supplies itself. The rules' code is the reports' (reports/wait_rules.py); this module holds
what an algorithm names, and imports nothing heavy, so that reports can read it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

#: How "who waited for whom" (`bench report`'s waits.csv, waits.png and timeline) attributes a
#: step's waiting to the worker it waited on: the rules an algorithm picks from with
#: Algorithm.wait_rule. Each reads the event log only; the report quotes the rule it applied.
WAIT_RULES: dict[str, str] = {
    "all": "every worker waits for the last arrival at each iteration (arrival = the end of "
           "compute + injected slowdown); its waiting, last arrival - own arrival (inferred "
           "where the log counts it inside comm_s), is attributed to the last worker. For "
           "collectives over every worker (all-reduce, a synchronous parameter server)",
    "neighbours": "a worker's logged wait at iteration k is attributed to the one of the "
                  "ranks its step met (the event's peer_ranks; a step that met every worker "
                  "logs none) whose step k arrived last, up to that arrival; the rest is "
                  "transfer, unattributed. For gossip with neighbours at the same iteration",
    "from": "like neighbours, and where the step logged no wait, its waiting is inferred from "
            "the arrivals as for all workers (a collective over the ranks it met); a step "
            "may name the senders it waited for and their iteration (awaited, "
            "awaited_iteration). For steps that mix collectives and point to point",
    "group": "each member's logged wait in a P-Reduce (event fields group and group_id, or "
             "schedule_step) is attributed to the member that entered it last (the one with "
             "the smallest logged wait); P-Reduces whose other members' steps are not in the "
             "log are unattributed",
    "peer": "an active worker's logged wait is attributed to the peer it asked (event field "
            "peer), whose reply ended it; a passive worker's wait for its own serving thread "
            "is unattributed",
    "server": "a worker's whole exchange with the server (its gradient out, the server's queue "
              "and update, the parameters back) is attributed to the server rank",
    "quorum": "the workers whose gradients made one update (same event field version, not "
              "dropped) wait for the last of them to arrive, which closed it; a dropped "
              "gradient's worker waited for nobody",
    "named": "each wait is attributed to the rank its step names (StepInfo.waited_on: rank -> "
             "seconds, e.g. the neighbour whose message made the condition waited on true); "
             "the rest of its logged wait is unattributed",
}


@dataclass(frozen=True)
class WaitRule:
    """A rule of "who waited for whom" that an algorithm supplies itself, where none of
    WAIT_RULES fits (Algorithm.wait_rule returns it).

    `attribute(events, config)` gets every worker's events ({rank: [event dict, ...]} in
    iteration order, fields as logged: t_start, compute_s, slowdown_s, wait_s, comm_s,
    peer_ranks, the algorithm's own fields) and the run's config.json as a dict, and yields
    (worker, iteration, waited_on, seconds) for each wait it explains: waited_on a rank, or
    -1 for waiting no rank explains. `description` is what the report quotes."""

    name: str
    description: str
    attribute: Callable[[dict[int, list[dict]], dict], Iterable[tuple[int, int, int, float]]]


def declared_wait_rule(algorithm: type, config: Any, workers: int) -> str | WaitRule | None:
    """What `algorithm` declares of its waits (Algorithm.wait_rule, a class attribute or a
    classmethod of (options, workers))."""
    rule = getattr(algorithm, "wait_rule", None)
    return rule(config, workers) if callable(rule) else rule


def wait_rule_name(rule: str | WaitRule | None) -> str | None:
    """The name summary.json records for a declared rule."""
    return rule.name if isinstance(rule, WaitRule) else rule
