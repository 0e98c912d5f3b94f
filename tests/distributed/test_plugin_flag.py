"""Plugins without installing them (`--plugin PATH_OR_MODULE`, HETBENCH_PLUGINS), and results
that follow the code: a plugin whose source changed is run (and simulated) again, through the
real CLI (issue 55)."""

import json

import pytest

from tests.helpers import QUARTER_MINUTE_CASES, SLOW_VARIANT_CASES, skip_unless_today

#: An uninstalled plugin with both halves: all-reduce of gradients, and its simulated protocol.
PLUGIN = '''
import torch

from hetbench.api import Algorithm, Protocol, StepInfo


class LoosePlugin(Algorithm):
    name = "loose-plugin"
    description = "a plugin loaded with --plugin, never installed"
    fact_units = {"loose_steps": "steps"}

    @classmethod
    def summary_facts(cls, config, events, done):
        return {"loose_steps": sum(1 for e in events if "loose" in e)}

    @classmethod
    def simulated_protocol(cls):
        return LoosePluginSim

    @torch.no_grad()
    def step(self, ctx, model, optimizer):
        for p in model.parameters():
            ctx.comm.average_(p.grad)
        optimizer.step()
        return StepInfo(peers=ctx.workers - 1, staleness=0.0, fields={"loose": ctx.rank})


class LoosePluginSim(Protocol):
    def __init__(self, engine):
        super().__init__(engine)
        self.arrived = []

    def ready(self, w):
        self.arrived.append(w)
        if len(self.arrived) < self.n:
            return
        start = self.engine.now
        end = self.net.ring(tuple(range(self.n)), self.model_bytes, start, self.engine.active)
        for x in self.arrived:
            self.engine.end_step(x, end, start - self.engine.t_sync[x], {"loose": x},
                                 peers=self.n - 1, staleness=0.0)
        self.arrived = []
'''
RUN = ["--algorithms", "loose-plugin", "--workloads", "svm", "--workers", "2",
       "--iterations", "12"]


def _plugin(tmp_path):
    path = tmp_path / "plugins" / "loose_plugin.py"
    path.parent.mkdir()
    path.write_text(PLUGIN)
    return path


def _env(cli_env):
    """The CLI's environment without any plugin on it: the flag alone must find it."""
    env = {**cli_env, "COLUMNS": "1000"}
    env.pop("HETBENCH_PLUGINS", None)
    return env


def _run_dir(out):
    (run_dir,) = out.glob("loose-plugin-*/")
    return run_dir


def _loaded_on_every_rank(run_dir, workers=2):
    for rank in range(workers):
        lines = (run_dir / f"events.rank{rank}.jsonl").read_text().splitlines()
        assert len(lines) == 12 and all(json.loads(line)["loose"] == rank for line in lines)


@pytest.mark.slow
def test_plugin_flag_runs_an_uninstalled_plugin_and_reruns_it_when_its_source_changes(
        tmp_path, bench, cli_env, monkeypatch):
    skip_unless_today("plugin-flag-uninstalled", SLOW_VARIANT_CASES, per_day=4)
    plugin, env, out = _plugin(tmp_path), _env(cli_env), tmp_path / "out"
    monkeypatch.chdir(tmp_path)  # a relative path (made absolute for the ranks)
    ran = bench("run", "--plugin", "plugins/loose_plugin.py", *RUN, "--out", out, env=env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    run_dir = _run_dir(out)
    _loaded_on_every_rank(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    code = summary["code"]
    assert code["algorithm"].startswith("source ") and code["workload"].startswith("hetbench ")
    assert json.loads((run_dir / "env.json").read_text())["code"] == code

    # Its own facts reach the report (issue 55): 12 steps of 2 workers.
    reported = bench("report", "--plugin", plugin, out, env=env)
    assert reported.returncode == 0, reported.stderr
    _facts_reported(out, 24)

    again = bench("run", "--plugin", plugin, *RUN, "--out", out, env=env)
    assert again.returncode == 0 and "skip loose-plugin svm" in again.stdout, again.stdout
    assert not (out / ".attempts").exists()

    plugin.write_text(PLUGIN + "\n# an edit\n")
    edited = bench("run", "--plugin", plugin, *RUN, "--out", out, env=env)
    assert edited.returncode == 0, edited.stdout + edited.stderr
    said = next(line for line in edited.stdout.splitlines() if line.startswith("rerun"))
    assert f"its code changed (algorithm {code['algorithm']} -> source " in said, said
    (kept,) = (out / ".attempts").iterdir()
    assert json.loads((kept / "summary.json").read_text())["code"] == code
    assert json.loads((_run_dir(out) / "summary.json").read_text())["code"] != code


def _facts_reported(out, steps):
    """report.csv's fact column and report.md's table of the plugin's own facts."""
    import pandas as pd

    csv = pd.read_csv(out / "report.csv").set_index("algorithm")
    assert csv.loc["loose-plugin", "fact:loose_steps"] == steps
    md = (out / "report.md").read_text()
    facts = md.split("## Algorithms' own facts")[1].split("\n## ")[0]
    assert "### loose-plugin" in facts and "loose_steps (steps)" in facts


def test_plugin_flag_reaches_the_ranks_that_torchrun_starts(tmp_path, bench, cli_env):
    skip_unless_today("plugin-torchrun", QUARTER_MINUTE_CASES, per_day=2)
    plugin, out = _plugin(tmp_path), tmp_path / "out"
    ran = bench("run", "--plugin", plugin, "--launcher", "torchrun", *RUN, "--out", out,
                env=_env(cli_env))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    run_dir = _run_dir(out)
    assert json.loads((run_dir / "summary.json").read_text())["launcher"] == "torchrun"
    _loaded_on_every_rank(run_dir)


#: A rank whose interpreter teardown aborts, as the destructors of torch's C++ threads have
#: aborted a finished torchrun rank ("terminate called without an active exception"): only in
#: a rank that `python -m hetbench.harness.worker` started, not in bench itself.
ABORT_AT_TEARDOWN = """
import atexit
import os
import sys

if getattr(getattr(sys.modules["__main__"], "__spec__", None), "name", "") == (
        "hetbench.harness.worker"):
    atexit.register(os.abort)
"""


@pytest.mark.slow
def test_a_torchrun_rank_ends_without_the_interpreters_teardown(tmp_path, bench, cli_env):
    # Its records are written when its teardown would run: a rank that aborted there (SIGABRT)
    # was reported by torchrun, and so by bench, as a failed run.
    plugin, out = _plugin(tmp_path), tmp_path / "out"
    plugin.write_text(ABORT_AT_TEARDOWN + PLUGIN)
    ran = bench("run", "--plugin", plugin, "--launcher", "torchrun", *RUN, "--out", out,
                env=_env(cli_env))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    summary = json.loads((_run_dir(out) / "summary.json").read_text())
    assert summary["status"] == "ok", summary.get("cause")
    _loaded_on_every_rank(_run_dir(out))


def test_unknown_names_and_bad_plugins_are_one_line_that_says_how_plugins_load(
        tmp_path, bench, cli_env):
    env = _env(cli_env)
    unknown = bench("run", "--algorithms", "loose-plugin", "--workloads", "svm", "--workers",
                    "2", "--out", tmp_path / "o", env=env)
    assert unknown.returncode == 2, unknown.stderr
    (line,) = unknown.stderr.strip().splitlines()
    assert line.startswith("error: unknown algorithm 'loose-plugin'"), line
    assert "--plugin PATH_OR_MODULE" in line and "HETBENCH_PLUGINS" in line
    assert "entry points `hetbench.algorithms`" in line
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_dependency_of_this_plugin\n")
    for args, extra, said in (
            (["--plugin", tmp_path / "missing.py"], {},
             f"error: plugin '{tmp_path / 'missing.py'}': no such file or directory"),
            ([], {"HETBENCH_PLUGINS": str(broken)},
             f"error: plugin {broken} failed to import: ModuleNotFoundError")):
        result = bench("list", *args, env={**env, **extra}, timeout=120)
        assert result.returncode == 2, (args, result.stderr)
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(said), line


def test_bench_sim_skips_a_finished_simulation_and_force_or_an_edit_redoes_it(
        tmp_path, bench, cli_env):
    skip_unless_today("sim-skip-force", QUARTER_MINUTE_CASES, per_day=2)
    plugin, env, out = _plugin(tmp_path), _env(cli_env), tmp_path / "sim"
    args = ["sim", "--plugin", plugin, "--algorithms", "loose-plugin,allreduce",
            "--workloads", "svm", "--workers", "2", "--iterations", "12", "--pace-ms", "5",
            "--out", out]

    def started():
        return {p.parent.name.split("-svm")[0]: json.loads(p.read_text())["started_at"]
                for p in out.glob("*/summary.json")}

    first = bench(*args, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    before = started()
    assert set(before) == {"loose-plugin", "allreduce"}
    # A simulated run's facts come from its protocol's fields, as a real run's (issue 55).
    reported = bench("report", "--plugin", plugin, out, env=env)
    assert reported.returncode == 0, reported.stderr
    _facts_reported(out, 24)

    plain = bench(*args, env=env)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.count("already simulated (same config, costs and code)") == 2
    assert "predicted throughput vs allreduce" in plain.stdout  # skipped runs still count
    assert started() == before

    forced = bench(*args, "--force", env=env)
    assert forced.returncode == 0 and "already simulated" not in forced.stdout, forced.stdout
    after_force = started()
    assert all(after_force[k] != before[k] for k in before)

    plugin.write_text(PLUGIN + "\n# an edit\n")
    edited = bench(*args, env=env)
    assert edited.returncode == 0, edited.stderr
    assert "resimulate loose-plugin svm w=2 none seed=1: its code changed" in edited.stdout
    assert "skip allreduce svm" in edited.stdout  # a built-in's code did not change
    now = started()
    assert now["loose-plugin"] != after_force["loose-plugin"]
    assert now["allreduce"] == after_force["allreduce"]
