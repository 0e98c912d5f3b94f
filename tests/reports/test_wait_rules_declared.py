"""Each algorithm declares how its waits are attributed (Algorithm.wait_rule); the reports apply
the declaration and keep no list of algorithm names (issue 45).

A plugin declares each rule of the menu (and one of its own) over a hand-made log in which
worker 2 arrives 40 ms after the others at iteration 0: "who waited for whom" pins the others'
waiting on it, by the declared rule."""

import ast
import json
from pathlib import Path

import pytest

from hetbench.api import Algorithm, StepInfo, WaitRule
from hetbench.core.config import RunConfig
from hetbench.core.registry import ALGORITHMS
from hetbench.core.waits import WAIT_RULES
from hetbench.reports.timeline import timeline_plot
from hetbench.reports.waits import load_rank_events, run_waits

MS = 1_000_000  # ns


def _event(rank, t_start_ms, compute_ms, wait_ms=0.0, comm_ms=1.0, iteration=0, **fields):
    t_end = t_start_ms + compute_ms + wait_ms + comm_ms
    return {"rank": rank, "iteration": iteration, "t_start": round(t_start_ms * MS),
            "t_end": round(t_end * MS), "compute_s": compute_ms / 1e3, "slowdown_s": 0.0,
            "comm_s": comm_ms / 1e3, "wait_s": wait_ms / 1e3, "samples": 1, **fields}


def _plugin(rule):
    class Plugin(Algorithm):
        name = f"plugin-{getattr(rule, 'name', rule)}"
        description = "declares a wait rule"
        wait_rule = rule

        def step(self, ctx, model, optimizer):
            return StepInfo()

    ALGORITHMS.add(Plugin.name, Plugin)
    return Plugin


def _run(tmp_path: Path, rule, events: dict[int, list[dict]], workers: int = 3,
         recorded: bool = True, algorithm: str | None = None) -> Path:
    name = algorithm or _plugin(rule).name
    run_dir = tmp_path / name
    run_dir.mkdir()
    config = RunConfig(algorithm=name, workload="mlp-digits", workers=workers)
    (run_dir / "config.json").write_text(json.dumps(config.to_dict()))
    summary = {"status": "ok", "simulated": False}
    if recorded:
        summary["wait_rule"] = rule if isinstance(rule, str) or rule is None else rule.name
    (run_dir / "summary.json").write_text(json.dumps(summary))
    for rank, rank_events in events.items():
        (run_dir / f"events.rank{rank}.jsonl").write_text(
            "".join(json.dumps(e) + "\n" for e in rank_events))
    return run_dir


def _waited(waits) -> dict[tuple[int, int], float]:
    return {(int(r.worker), int(r.waited_on)): r.wait_s for r in waits.table.itertuples()}


#: Per rule: the log it reads (worker 2 late), and the waiter expected to wait on 2.
LOGS = {
    # A collective over every worker: the wait is inside comm_s, inferred from arrivals.
    "all": {r: [_event(r, 0, 50 if r == 2 else 10, comm_ms=45 if r != 2 else 5, peers=2)]
            for r in range(3)},
    # A step that met every worker logs no peer_ranks (peers > 0): attributed all the same.
    "from": {r: [_event(r, 0, 50 if r == 2 else 10, comm_ms=45 if r != 2 else 5, peers=2)]
             for r in range(3)},
    "neighbours": {0: [_event(0, 0, 10, wait_ms=40, peer_ranks=[2], peers=1)],
                   1: [_event(1, 0, 10, peers=0)],
                   2: [_event(2, 0, 50, peer_ranks=[0], peers=1)]},
    "group": {0: [_event(0, 0, 10, wait_ms=40, group=[0, 2], group_id=7, peers=1)],
              1: [_event(1, 0, 10, peers=0)],
              2: [_event(2, 0, 50, group=[0, 2], group_id=7, peers=1)]},
    "peer": {0: [_event(0, 0, 10, wait_ms=40, peer=2, peers=1)], 1: [_event(1, 0, 10)],
             2: [_event(2, 0, 50)]},
    "quorum": {0: [_event(0, 0, 10, comm_ms=45, version=1, peers=2)],
               1: [_event(1, 0, 60, version=2, dropped=True, peers=2)],
               2: [_event(2, 0, 50, comm_ms=5, version=1, peers=2)]},
    "named": {0: [_event(0, 0, 10, wait_ms=40, waited_on={"2": 0.04}, peers=1)],
              1: [_event(1, 0, 10)], 2: [_event(2, 0, 50)]},
}


@pytest.mark.parametrize("rule", sorted(LOGS))
def test_a_plugin_declaring_a_rule_is_attributed_by_it(tmp_path, rule):
    waits = run_waits(_run(tmp_path, rule, LOGS[rule]))
    assert waits.rule == rule and waits.rule_text == WAIT_RULES[rule]
    assert _waited(waits)[(0, 2)] == pytest.approx(0.04, abs=1e-6)


def test_the_server_rule_pins_a_workers_exchange_on_the_server_rank(tmp_path):
    events = {r: [_event(r, 0, 10, wait_ms=30, comm_ms=10, peers=1)] for r in range(3)}
    waits = run_waits(_run(tmp_path, "server", events))
    assert waits.rule == "server"
    assert _waited(waits) == {(r, 3): pytest.approx(0.04) for r in range(3)}


def test_a_rule_of_the_plugins_own_is_applied_and_quoted(tmp_path):
    def everything_on_rank_1(events, config):
        assert config["algorithm"] == "plugin-mine"  # the run's config.json
        for rank, rank_events in events.items():
            for e in rank_events:
                if e["wait_s"] > 0:
                    yield rank, e["iteration"], 1, e["wait_s"]

    rule = WaitRule("mine", "every wait is on rank 1, by construction", everything_on_rank_1)
    events = {r: [_event(r, 0, 10, wait_ms=20 if r != 1 else 0)] for r in range(3)}
    waits = run_waits(_run(tmp_path, rule, events))  # summary says "mine": the class is read
    assert (waits.rule, waits.rule_text) == ("mine", "every wait is on rank 1, by construction")
    assert _waited(waits) == {(0, 1): pytest.approx(0.02), (2, 1): pytest.approx(0.02)}


def test_a_rule_the_log_cannot_support_is_not_applied_and_says_why(tmp_path):
    events = {r: [_event(r, 0, 10, wait_ms=5)] for r in range(3)}  # no waited_on anywhere
    waits = run_waits(_run(tmp_path, "named", events))
    assert waits.rule is None and "waited_on" in waits.reason


def test_an_undeclared_plugin_is_read_from_its_fields_and_an_old_summary_from_its_class(
        tmp_path):
    undeclared = run_waits(_run(tmp_path, None, LOGS["group"]))
    assert undeclared.rule == "group"  # what its log's fields imply
    # A summary written before wait_rule existed: the algorithm's class is asked.
    (tmp_path / "old").mkdir()
    old = run_waits(_run(tmp_path / "old", "neighbours", LOGS["neighbours"], recorded=False))
    assert old.rule == "neighbours"


def test_a_timeline_draws_lines_that_lack_a_field(tmp_path):
    """Some lines of a run hold peer_ranks and others do not (a plugin's run): the timeline
    reads them as every report reader does, a field absent where the line has none (through a
    DataFrame it was NaN, which passed for a list of ranks: bench report --timeline crashed)."""
    log = {0: [_event(0, 0, 10, wait_ms=40, peer_ranks=[2], peers=1),
               _event(0, 60, 10, iteration=1, peers=0)],
           1: [_event(1, 0, 10, peers=0), _event(1, 60, 10, iteration=1, peers=0)],
           2: [_event(2, 0, 50, peer_ranks=[0], peers=1),
               _event(2, 60, 10, iteration=1, peers=0)]}
    run_dir = _run(tmp_path, "from", log)
    by_rank = load_rank_events(run_dir)
    assert "peer_ranks" not in by_rank[1][0]
    assert _waited(run_waits(run_dir, by_rank))[(0, 2)] == pytest.approx(0.04)
    drawn = timeline_plot(run_dir, tmp_path / "timeline.png", warmup_iterations=0)
    assert drawn.stat().st_size > 0


def test_every_builtin_declares_a_rule_from_the_menu():
    for name in ALGORITHMS.builtin_order:
        run = RunConfig(algorithm=name, workload="mlp-digits", workers=4,
                        algorithm_options={"group_size": 2} if "prague-" in name
                        and name != "prague-static" else {})
        from hetbench.core.waits import declared_wait_rule

        assert declared_wait_rule(run.algorithm_class(), run.algorithm_config(),
                                  run.workers) in WAIT_RULES, name


def _code_strings(path: Path) -> set[str]:
    """String constants of a module's code, docstrings left out."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.FunctionDef | ast.ClassDef)
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
            and isinstance(node.value, str) and id(node) not in docstrings}


@pytest.mark.parametrize("module", ["reports/waits.py", "reports/wait_rules.py",
                                    "reports/texts.py", "reports/tables.py", "sim/model.py",
                                    "sim/fit.py"])
def test_no_rule_is_chosen_by_an_algorithms_name(module):
    import hetbench

    path = Path(hetbench.__file__).parent / module
    named = _code_strings(path) & set(ALGORITHMS.builtin_order) - {"allreduce"}
    # allreduce stays as the reports' default baseline (a flag chooses another), not a rule.
    assert not named, f"{module} names algorithms in its code: {sorted(named)}"
