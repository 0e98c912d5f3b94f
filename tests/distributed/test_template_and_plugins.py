"""The template algorithm is real, and a third-party plugin registers through an entry point."""

import json

import numpy as np
import pandas as pd
import pytest

from tests.helpers import (
    QUARTER_MINUTE_CASES,
    SLOW_VARIANT_CASES,
    final_models,
    run_config,
    skip_unless_today,
)


def test_local_sgd_with_period_1_equals_allreduce(tmp_path):
    common = dict(workload="mlp-digits", workers=3, iterations=10, warmup_iterations=2,
                  save_models=True, workload_options={"lr": 0.2})
    assert run_config(tmp_path / "a", algorithm="allreduce", **common)["status"] == "ok"
    summary = run_config(tmp_path / "l", algorithm="local-sgd",
                         algorithm_options={"period": 1}, **common)
    assert summary["status"] == "ok"
    # Without momentum, averaging models after each step is averaging the gradients.
    for a, b in zip(final_models(tmp_path / "a", 3), final_models(tmp_path / "l", 3),
                    strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    longer = run_config(tmp_path / "p", algorithm="local-sgd",
                        algorithm_options={"period": 4}, **common)
    models = final_models(tmp_path / "p", 3)
    # 10 iterations with period 4: the last 2 steps were local, so the models differ.
    assert longer["status"] == "ok" and not np.allclose(models[0], models[1])


PLUGIN = '''
from dataclasses import dataclass

import torch

from hetbench.api import Algorithm, StepInfo, opt


@dataclass(frozen=True, kw_only=True)
class Options:
    scale: float = opt(1.0, "multiplies the averaged gradient")


class ScaledAllReduce(Algorithm):
    name = "scaled-allreduce"
    description = "a third-party plugin: all-reduce of gradients times a scale"
    Config = Options

    @torch.no_grad()
    def step(self, ctx, model, optimizer):
        for p in model.parameters():
            ctx.comm.average_(p.grad)
            p.grad.mul_(self.config.scale)
        optimizer.step()
        return StepInfo(fields={"plugin": True})
'''


def _install_plugin(tmp_path, source: str, entry: str, cli_env) -> dict:
    """A plugin package on a PYTHONPATH with its entry point: the environment to run bench in."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "my_plugin.py").write_text(source)
    dist_info = site / "my_plugin-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-plugin\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text(f"[hetbench.algorithms]\n{entry}\n")
    return {**cli_env, "PYTHONPATH": str(site)}


@pytest.mark.slow
def test_entry_point_plugin_is_listed_and_runs(tmp_path, bench, cli_env):
    skip_unless_today("entry-point-plugin", SLOW_VARIANT_CASES, per_day=4)
    env = _install_plugin(tmp_path, PLUGIN, "scaled-allreduce = my_plugin:ScaledAllReduce",
                          cli_env)
    listed = bench("list", env=env, timeout=120)
    assert "scaled-allreduce" in listed.stdout and "scale = 1.0" in listed.stdout
    out = tmp_path / "out"
    ran = bench("run", "--algorithms", "scaled-allreduce,allreduce", "--workloads", "svm",
                "--workers", "2", "--iterations", "20", "--out", out, env=env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    events = next(out.glob("scaled-allreduce-*/events.rank0.jsonl")).read_text()
    assert '"plugin":true' in events
    report = bench("report", out, env=env, timeout=120)
    assert report.returncode == 0 and "scaled-allreduce" in (out / "report.csv").read_text()


def test_the_template_imports_only_the_public_api():
    """What a plugin author copies imports nothing internal, and every name it uses is public."""
    import ast
    from pathlib import Path

    import hetbench.algorithms.template as template
    import hetbench.api

    tree = ast.parse(Path(template.__file__).read_text())
    modules = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               and (node.module or "").startswith("hetbench")}
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
             and node.module == "hetbench.api" for alias in node.names}
    assert modules == {"hetbench.api"}
    assert names <= set(hetbench.api.__all__)


OLD_STYLE = '''
from dataclasses import dataclass

import torch

from hetbench.algorithms.base import Algorithm, StepInfo
from hetbench.harness.context import WorkerContext
from hetbench.harness.options import opt
from hetbench.harness.tensors import flat_params, set_flat_params


@dataclass(frozen=True, kw_only=True)
class Options:
    weight: float = opt(0.5, "weight of the own model in the average")


class OldStyle(Algorithm):
    """Written against the previous release's module paths."""

    name = "old-style"
    description = "a plugin of the previous release"
    Config = Options

    @torch.no_grad()
    def step(self, ctx: WorkerContext, model, optimizer):
        optimizer.step()
        params = flat_params(model)
        ctx.comm.average_(params, members=ctx.worker_ranks)
        set_flat_params(model, params)
        return StepInfo(peers=ctx.workers - 1, staleness=0.0)
'''


@pytest.mark.slow
def test_a_plugin_on_the_previous_paths_runs_and_is_told_the_new_import(tmp_path, bench,
                                                                         cli_env):
    env = _install_plugin(tmp_path, OLD_STYLE, "old-style = my_plugin:OldStyle", cli_env)
    out = tmp_path / "out"
    ran = bench("run", "--algorithms", "old-style", "--workloads", "svm", "--workers", "2",
                "--iterations", "12", "--out", out, env=env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    summary = json.loads(next(out.glob("old-style-*/summary.json")).read_text())
    assert summary["status"] == "ok" and summary["throughput"] > 0
    for old in ("hetbench.algorithms.base", "hetbench.harness.context",
                "hetbench.harness.options", "hetbench.harness.tensors"):
        assert f"{old} moved: import from hetbench.api instead" in ran.stderr, ran.stderr


LAZY = '''
from dataclasses import dataclass

from hetbench.algorithms.template import LocalSGD, LocalSGDOptions
from hetbench.core.options import opt


@dataclass(frozen=True, kw_only=True)
class Options(LocalSGDOptions):
    period: int = opt(1_000_000, "local steps between two averages")


class LazySGD(LocalSGD):
    """The template's local SGD, averaging once in a million steps: it never syncs, while its
    author claims it synchronizes every iteration like the baselines."""

    name = "lazy-sgd"
    description = "local SGD with a huge period"
    Config = Options

    @classmethod
    def intended_sync_share(cls, config, workers):
        return 1.0
'''


@pytest.mark.slow
def test_a_plugin_that_does_not_synchronize_is_flagged_in_every_report_file(tmp_path, bench,
                                                                            cli_env):
    env = _install_plugin(tmp_path, LAZY, "lazy-sgd = my_plugin:LazySGD", cli_env)
    out = tmp_path / "out"
    ran = bench("run", "--algorithms", "lazy-sgd,allreduce", "--workloads", "svm",
                "--workers", "2", "--iterations", "30", "--out", out, env=env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    report = bench("report", out, env=env, timeout=120)
    assert report.returncode == 0, report.stderr
    csv = pd.read_csv(out / "report.csv").set_index("algorithm")
    assert csv.loc["lazy-sgd", "sync_share"] == 0 and csv.loc["allreduce", "sync_share"] == 1
    assert "LOW SYNC" in csv.loc["lazy-sgd", "sync_flag"]
    assert pd.isna(csv.loc["allreduce", "sync_flag"])
    md = (out / "report.md").read_text()
    # On the page, above the tables: the warning line and the marked throughput cell.
    warning = md.index("**lazy-sgd on svm, 2 workers, none: LOW SYNC")
    assert warning < md.index("## Throughput normalised")
    assert "(low sync)" in md
    assert "lazy-sgd on svm, 2 workers, none: LOW SYNC" in (out / "report.html").read_text()


PAIRS = '''
import torch

from hetbench.api import Algorithm, StepInfo, flat_params, set_flat_params


class PairSGD(Algorithm):
    """Written from docs/plugins.md and hetbench.api's docstring: average with a different
    partner each step."""

    name = "pair-sgd"
    description = "pairs formed on the fly"

    def setup(self, ctx, model, optimizer):
        self.steps = 0

    @torch.no_grad()
    def step(self, ctx, model, optimizer):
        optimizer.step()
        partner = ctx.rank ^ (1 if self.steps % 2 == 0 else 2)
        self.steps += 1
        params = flat_params(model)
        ctx.comm.average_(params, members=[ctx.rank, partner])
        set_flat_params(model, params)
        return StepInfo(peers=1, staleness=0.0)
'''


@pytest.mark.slow
def test_a_plugin_averaging_with_a_new_partner_each_step_runs_under_a_straggler(
        tmp_path, bench, cli_env):
    # average_ over a set that had no group at setup used to go through torch's new_group,
    # which every rank of the world must call: under det:5@1 the run hung for the 30 s timeout.
    env = _install_plugin(tmp_path, PAIRS, "pair-sgd = my_plugin:PairSGD", cli_env)
    out = tmp_path / "out"
    ran = bench("run", "--algorithms", "pair-sgd", "--workloads", "svm", "--workers", "4",
                "--slowdown", "det:5@1", "--iterations", "20", "--out", out, env=env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    (summary,) = [json.loads(p.read_text()) for p in out.glob("pair-sgd-*/summary.json")]
    assert summary["status"] == "ok" and summary["sync_share"] == 1.0


SIMULATED = '''
import torch

from hetbench.core.algorithm import Algorithm, StepInfo
from hetbench.core.tensors import flat_params, set_flat_params
from hetbench.sim.protocol import Protocol


class RingPairs(Algorithm):
    """Written from docs/plugins.md and hetbench.api's docstring, both halves: each step,
    workers average with the next one on the ring, alternating direction (pairs formed on
    the fly)."""

    name = "ring-pairs"
    description = "a third-party plugin with a simulated half"
    synchronous = True

    @classmethod
    def simulated_protocol(cls):
        return RingPairsSim

    def setup(self, ctx, model, optimizer):
        self.steps = 0

    @torch.no_grad()
    def step(self, ctx, model, optimizer):
        optimizer.step()
        partner = pair_of(ctx.rank, self.steps, ctx.workers)
        self.steps += 1
        if partner is None:
            return StepInfo(peers=0)
        params = flat_params(model)
        ctx.comm.p_reduce_(params, members=sorted((ctx.rank, partner)))
        set_flat_params(model, params)
        return StepInfo(peers=1, staleness=0.0, fields={"partner": partner})


def pair_of(rank, step, workers):
    """The decision rule both halves share: even steps pair (0,1) (2,3) ..., odd steps
    (1,2) (3,4) ...; a worker left without a partner steps alone."""
    shift = step % 2
    if (rank - shift) % 2:
        partner = rank - 1
    else:
        partner = rank + 1
    return partner if shift <= min(rank, partner) and max(rank, partner) < workers else None


class RingPairsSim(Protocol):
    """The same pairs in simulated time: a pair's average starts when both have arrived."""

    def __init__(self, engine):
        super().__init__(engine)
        self.waiting = {}

    def ready(self, w):
        k = self.engine.iteration[w]
        partner = pair_of(w, k, self.n)
        if partner is None:
            self.engine.end_step(w, self.engine.now, 0.0, peers=0)
            return
        key = (k, min(w, partner))
        if key not in self.waiting:
            self.waiting[key] = w
            return
        other = self.waiting.pop(key)
        end = self.engine.now + self.net.p_reduce(self.model_bytes, 2, self.engine.active)
        for x in (w, other):
            self.engine.end_step(x, end, self.engine.now - self.engine.t_sync[x],
                              {"partner": w + other - x}, peers=1, staleness=0.0)
'''


def test_a_plugin_with_a_simulated_half_runs_in_bench_run_and_bench_sim(tmp_path, bench,
                                                                         cli_env):
    env = _install_plugin(tmp_path, SIMULATED, "ring-pairs = my_plugin:RingPairs", cli_env)
    flags = ["--algorithms", "ring-pairs", "--workloads", "mlp-digits", "--workers", "4",
             "--iterations", "20", "--pace-ms", "5"]
    real = bench("run", *flags, "--out", tmp_path / "real", env=env)
    assert real.returncode == 0, real.stdout + real.stderr
    simulated = bench("sim", *flags, "--out", tmp_path / "sim", env=env)
    assert simulated.returncode == 0, simulated.stdout + simulated.stderr
    summaries = [json.loads(next((tmp_path / kind).glob("ring-pairs-*/summary.json")).read_text())
                 for kind in ("real", "sim")]
    for summary in summaries:
        assert summary["status"] == "ok" and summary["iterations"] == 4 * 20
    real_summary, sim_summary = summaries
    assert sim_summary["simulated"] is True and not real_summary.get("simulated")
    # Both halves follow the same rule: the same partner at every step of every worker, and
    # the same share of steps that averaged (the edge workers sit out every other step).
    for rank in range(4):
        partners = [[e.get("partner") for e in map(json.loads, next(
            (tmp_path / kind).glob(f"ring-pairs-*/events.rank{rank}.jsonl")).read_text()
            .splitlines())] for kind in ("real", "sim")]
        assert partners[0] == partners[1], rank
    assert real_summary["sync_share"] == sim_summary["sync_share"] == 0.75


def test_bench_sim_refuses_a_plugin_without_a_simulated_half(tmp_path, bench, cli_env):
    env = _install_plugin(tmp_path, PLUGIN, "scaled-allreduce = my_plugin:ScaledAllReduce",
                          cli_env)
    result = bench("sim", "--algorithms", "scaled-allreduce", "--workloads", "mlp-digits",
                   "--workers", "4", "--pace-ms", "10", "--out", tmp_path / "o", env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "has no simulated protocol" in lines[0], result.stderr
    assert "local-sgd" in lines[0]  # it names what bench sim plays


HYPERCUBE = '''
import torch

from hetbench.api import Algorithm, Protocol, StepInfo, UserError, flat_params, set_flat_params


def partner(rank, t, workers):
    """The rule both halves share: the neighbour across dimension t mod d of the hypercube."""
    return rank ^ (1 << (t % (workers.bit_length() - 1)))


class Hypercube(Algorithm):
    """Hypercube gossip: a local step, then the average with rank XOR 2^(t mod d)."""

    name = "hypercube"
    description = "hypercube gossip, written from README and hetbench.api alone"
    synchronous = False  # each pair meets on its own

    @classmethod
    def validate(cls, config, workers):
        if workers < 2 or workers & (workers - 1):
            raise UserError(f"hypercube: workers must be a power of 2, got {workers}")

    @classmethod
    def simulated_protocol(cls):
        return HypercubeSim

    def setup(self, ctx, model, optimizer):
        self.t = 0

    @torch.no_grad()
    def step(self, ctx, model, optimizer):
        optimizer.step()
        other = partner(ctx.rank, self.t, ctx.workers)
        self.t += 1
        params = flat_params(model)
        ctx.comm.p_reduce_(params, [ctx.rank, other])
        set_flat_params(model, params)
        return StepInfo(peers=1, staleness=0.0)  # whom it met: the harness records it


class HypercubeSim(Protocol):
    def __init__(self, engine):
        super().__init__(engine)
        self.arrived = {}

    def ready(self, w):
        other = partner(w, self.engine.iteration[w], self.n)
        self.arrived[w] = self.engine.now
        if other not in self.arrived:
            return  # the first of the pair waits for the other
        start = self.engine.now
        end = self.net.ring((w, other), self.model_bytes, start, self.engine.active)
        for x in (w, other):
            self.engine.end_step(x, end, start - self.arrived.pop(x), peers=1, staleness=0.0,
                                 peer_ranks=[w + other - x])
'''


def test_a_hypercube_plugin_from_the_public_api_is_attributed_real_and_simulated(
        tmp_path, bench, cli_env):
    """The issue's proof: a plugin without timing code of its own, beside allreduce under a
    fixed straggler; "who waited for whom" pins its waiting on the straggler, real and
    simulated."""
    skip_unless_today("hypercube-plugin", QUARTER_MINUTE_CASES, per_day=2)
    from hetbench.reports.waits import run_waits, waits_summary

    env = _install_plugin(tmp_path, HYPERCUBE, "hypercube = my_plugin:Hypercube", cli_env)
    flags = ["--algorithms", "hypercube,allreduce", "--workloads", "mlp-digits", "--workers",
             "4", "--slowdown", "det:5@1", "--iterations", "30", "--pace-ms", "10"]
    for kind in ("run", "sim"):
        out = tmp_path / kind
        ran = bench(kind, *flags, "--out", out, env=env)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        run = next(out.glob("hypercube-*/"))
        assert json.loads((run / "summary.json").read_text())["status"] == "ok"
        waits = run_waits(run)
        assert waits.rule == "from", waits.reason
        assert waits_summary([waits]).iloc[0]["most_waited_on"] == "1 *", waits.per_worker()
        # Only partners are ever waited on: worker 2 meets 3 and 0, never the straggler.
        assert waits.matrix().loc[2, 1] == 0
        report = bench("report", out, env=env, timeout=120)
        assert report.returncode == 0, report.stderr
        section = (out / "report.md").read_text().split("## Who waited for whom")[1]
        assert "hypercube: " not in section.split("\n## ")[0].split("Not attributed:")[-1]
    # Its simulated half has no learning half: --learn refuses it in one line.
    refused = bench("sim", "--learn", *flags, "--out", tmp_path / "learn", env=env)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert "algorithm hypercube has no learning half" in lines[0]
