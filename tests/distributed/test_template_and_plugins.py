"""The template algorithm is real, and a third-party plugin registers through an entry point."""

import json

import numpy as np
import pandas as pd

from tests.helpers import final_models, run_config


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

from hetbench.core.algorithm import Algorithm, StepInfo
from hetbench.core.options import opt


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


def test_entry_point_plugin_is_listed_and_runs(tmp_path, bench, cli_env):
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

from hetbench.core.algorithm import Algorithm, StepInfo
from hetbench.core.tensors import flat_params, set_flat_params


class PairSGD(Algorithm):
    """Written from the README: average with a different partner each step."""

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
