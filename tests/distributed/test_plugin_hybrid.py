"""A plugin whose steps mix point to point and collectives, written from hetbench.api alone: a
ring-gossip exchange most iterations, every worker's average every `period` iterations. Its
declared wait rule attributes every step through the real CLI, those that met every worker
included, and `bench report` (its run the timeline's, no allreduce run beside it) ends well;
so does a report of Hop alone, whose steps may log no waited_on (issue 45)."""

import csv
import os

from tests.distributed.test_template_and_plugins import _install_plugin

HYBRID = '''
from dataclasses import dataclass

import torch

from hetbench.api import Algorithm, StepInfo, flat_params, opt, set_flat_params


@dataclass(frozen=True, kw_only=True)
class Options:
    period: int = opt(4, "iterations between averages of every worker's model")


class HybridGossip(Algorithm):
    name = "hybrid-gossip"
    description = "ring gossip each iteration, every worker's average every `period`"
    Config = Options
    # Its steps meet their ring neighbours (point to point) or every worker (a collective):
    # each step's waiting on the last of the ranks it met, inferred where the step logged none.
    wait_rule = "from"

    def setup(self, ctx, model, optimizer):
        self.steps = 0
        self.left = (ctx.rank - 1) % ctx.workers
        self.right = (ctx.rank + 1) % ctx.workers

    @torch.no_grad()
    def step(self, ctx, model, optimizer):
        optimizer.step()
        flat = flat_params(model)
        self.steps += 1
        if self.steps % self.config.period == 0:
            ctx.comm.average_(flat, members=ctx.worker_ranks)
            peers = ctx.workers - 1
        else:
            from_left, from_right = torch.empty_like(flat), torch.empty_like(flat)
            works = [ctx.comm.isend(flat, self.left, tag=1),
                     ctx.comm.isend(flat, self.right, tag=2),
                     ctx.comm.irecv(from_left, self.left, tag=2),
                     ctx.comm.irecv(from_right, self.right, tag=1)]
            for work in works:
                work.wait()
            flat = (flat + from_left + from_right) / 3
            peers = 2
        set_flat_params(model, flat)
        return StepInfo(peers=peers, staleness=0.0)
'''


def test_a_hybrid_plugin_is_attributed_at_every_step_and_reported(tmp_path, bench, cli_env):
    env = _install_plugin(tmp_path, HYBRID, "hybrid-gossip = my_plugin:HybridGossip", cli_env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env["PYTHONPATH"],
                                                       cli_env.get("PYTHONPATH")]))
    out = tmp_path / "out"
    ran = bench("run", "--algorithms", "hybrid-gossip", "--workloads", "svm", "--workers", "4",
                "--slowdown", "det:5@1", "--iterations", "24", "--pace-ms", "10", "--out", out,
                env=env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    report = bench("report", out, env=env, timeout=180)
    assert report.returncode == 0, report.stderr[-3000:]
    assert (out / "timeline.png").exists()
    rows = list(csv.DictReader((out / "waits.csv").open()))
    assert rows and {r["rule"] for r in rows} == {"from"}
    # Worker 3 is no ring neighbour of the straggler (1): it waited on it only at the steps
    # that met every worker, and those are attributed.
    on_straggler = {r["worker"]: float(r["wait_s"]) for r in rows
                    if r["waited_on"] == "1"}
    assert on_straggler.get("3", 0.0) > 0.05, rows


def test_a_report_of_hop_alone_ends_well(tmp_path, bench, cli_env):
    matrix = tmp_path / "hop.toml"
    matrix.write_text('name = "hop-only"\nalgorithms = ["hop"]\nworkloads = ["svm"]\n'
                      'workers = [4]\nslowdown = ["det:5@1"]\nseeds = [1]\niterations = 16\n'
                      'pace_ms = 10\n[algorithm.hop]\nbackup_workers = [0, 1]\n')
    out = tmp_path / "out"
    ran = bench("run", matrix, "--out", out)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    report = bench("report", out, timeout=180)
    assert report.returncode == 0, report.stderr[-3000:]
    assert "Traceback" not in report.stderr
