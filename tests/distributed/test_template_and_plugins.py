"""The template algorithm is real, and a third-party plugin registers through an entry point."""

import textwrap

import numpy as np

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

from hetbench.algorithms.base import Algorithm, StepInfo
from hetbench.harness.options import opt


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


def test_entry_point_plugin_is_listed_and_runs(tmp_path, bench, cli_env):
    site = tmp_path / "site"
    site.mkdir()
    (site / "my_plugin.py").write_text(PLUGIN)
    dist_info = site / "my_plugin-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-plugin\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text(textwrap.dedent("""
        [hetbench.algorithms]
        scaled-allreduce = my_plugin:ScaledAllReduce
    """))
    env = {**cli_env, "PYTHONPATH": str(site)}
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
