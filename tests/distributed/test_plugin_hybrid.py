"""A plugin whose steps mix point to point and collectives, written from hetbench.api alone, in
all three halves: a ring-gossip exchange most iterations, every worker's average every
`period` iterations. Its declared wait rule attributes every step through the real CLI, real
and simulated, those that met every worker included; `bench report` (its run the timeline's,
no allreduce run beside it) ends well, and so does a report of Hop alone, whose steps may log
no waited_on; its learning half ends with the real run's models (issue 45)."""

import csv
import os

import numpy as np
import pytest

from tests.distributed.test_template_and_plugins import _install_plugin
from tests.helpers import QUARTER_MINUTE_CASES, SLOW_VARIANT_CASES, final_models, skip_unless_today

HYBRID = '''
from dataclasses import dataclass

import numpy as np
import torch

from hetbench.api import (Algorithm, Partners, Protocol, StepInfo, Steps, flat_params, opt,
                          set_flat_params)


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

    @classmethod
    def simulated_protocol(cls):
        return HybridGossipSim

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


class HybridGossipSim(Protocol):
    """The same rules in simulated time: a step k waits for its partners' k-th gradients."""

    lockstep = True

    def __init__(self, engine):
        super().__init__(engine)
        self.partners = Partners(engine, self.partners_of)
        self.ends = {}  # iteration -> when its all-reduce ended (one per averaging step)

    def partners_of(self, w, k):
        if (k + 1) % self.config.period == 0:
            return range(self.n)
        return ((w - 1) % self.n, (w + 1) % self.n)

    def ready(self, w):
        for x, k, mine, latest in self.partners.ready(w):
            met = self.partners_of(x, k)
            if len(met) == self.n:  # everyone: one ring all-reduce of the models
                end = self.ends.get(k) or self.ends.setdefault(
                    k, self.net.ring(met, self.model_bytes, latest, self.engine.active))
            else:
                end = self.net.exchange(x, met, self.model_bytes, max(mine, latest),
                                        self.engine.active)
            self.engine.end_step(x, end, latest - mine, peers=min(len(met), self.n - 1),
                                 staleness=0.0, peer_ranks=met)

    def step_all(self, k, t_sync, full):
        if (k + 1) % self.config.period == 0:
            start = float(t_sync.max())
            end = self.net.ring(range(self.n), self.model_bytes, start, self.n)
            return Steps(np.full(self.n, end), start - t_sync, self.n - 1)
        latest = np.maximum(np.roll(t_sync, 1), np.roll(t_sync, -1))
        end = np.maximum(latest, t_sync) + self.net.exchange_s(2, self.model_bytes, self.n)
        ranks = [list(self.partners_of(w, k)) for w in range(self.n)] if full else None
        return Steps(end, latest - t_sync, 2, peer_ranks=ranks)

    def learn(self, k, learner):
        learner.sgd_step(learner.gradients())  # the real step's optimizer.step() first
        if (k + 1) % self.config.period == 0:
            learner.average_models()
            return
        own = torch.arange(self.n)
        learner.mix(torch.stack([own, (own - 1) % self.n, (own + 1) % self.n], dim=1),
                    torch.full((self.n, 3), 1 / 3))
'''


@pytest.mark.slow
def test_a_hybrid_plugin_is_attributed_at_every_step_and_reported(tmp_path, bench, cli_env):
    skip_unless_today("hybrid-plugin-attributed", SLOW_VARIANT_CASES, per_day=4)
    env = _install_plugin(tmp_path, HYBRID, "hybrid-gossip = my_plugin:HybridGossip", cli_env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env["PYTHONPATH"],
                                                       cli_env.get("PYTHONPATH")]))
    out = tmp_path / "out"
    ran = bench("run", "--algorithms", "hybrid-gossip", "--workloads", "svm", "--workers", "4",
                "--slowdown", "det:5@1", "--iterations", "24", "--pace-ms", "10", "--out", out,
                env=env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    report = bench("report", out, "--timeline", "hybrid-gossip", env=env, timeout=180)
    assert report.returncode == 0, report.stderr[-3000:]
    assert (out / "timeline.png").exists() and (out / "timeline.json").exists()
    rows = list(csv.DictReader((out / "waits.csv").open()))
    assert rows and {r["rule"] for r in rows} == {"from"}
    # Worker 3 is no ring neighbour of the straggler (1): it waited on it only at the steps
    # that met every worker, and those are attributed.
    on_straggler = {r["worker"]: float(r["wait_s"]) for r in rows
                    if r["waited_on"] == "1"}
    assert on_straggler.get("3", 0.0) > 0.05, rows


@pytest.mark.slow
def test_a_report_of_hop_alone_ends_well(tmp_path, bench, cli_env):
    skip_unless_today("report-of-hop-alone", SLOW_VARIANT_CASES, per_day=4)
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


def test_the_plugins_simulated_half_is_attributed_and_learns_what_the_real_half_does(
        tmp_path, bench, cli_env):
    """Its simulated half, written from hetbench.api (Partners, the costs' exchange and ring,
    end_step's peer_ranks), runs through `bench sim`, event by event and in lockstep alike,
    and is attributed at every step; its learning half with period 1 is All-Reduce SGD."""
    skip_unless_today("plugin-simulated-half", QUARTER_MINUTE_CASES, per_day=2)
    env = _install_plugin(tmp_path, HYBRID, "hybrid-gossip = my_plugin:HybridGossip", cli_env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env["PYTHONPATH"],
                                                       cli_env.get("PYTHONPATH")]))
    outs = {}
    for name, flags in (("lockstep", []), ("events", ["--seconds", "5"])):
        outs[name] = tmp_path / name
        ran = bench("sim", "--algorithms", "hybrid-gossip", "--workloads", "svm", "--workers",
                    "4", "--slowdown", "det:5@1", "--pace-ms", "10", "--events", "full",
                    *(flags or ["--iterations", "24"]), "--out", outs[name], env=env)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        report = bench("report", outs[name], env=env, timeout=180)
        assert report.returncode == 0, report.stderr[-3000:]
        rows = list(csv.DictReader((outs[name] / "waits.csv").open()))
        assert {r["rule"] for r in rows} == {"from"}, rows
        on_straggler = {r["worker"]: float(r["wait_s"]) for r in rows if r["waited_on"] == "1"}
        assert on_straggler.get("3", 0.0) > 0.05, (name, rows)  # at the global steps
    # The learning half against the real half: the same matrix run for real and learned in
    # the simulator ends with the same models (gossip steps and global ones).
    matrix = tmp_path / "learn.toml"
    matrix.write_text('name = "learn"\nalgorithms = ["hybrid-gossip"]\n'
                      'workloads = ["mlp-digits"]\nworkers = [4]\nslowdown = ["none"]\n'
                      'seeds = [1]\niterations = 10\nsave_models = true\npace_ms = 5\n'
                      '[algorithm.hybrid-gossip]\nperiod = 4\n')
    models = {}
    for command in ("run", "sim"):
        out = tmp_path / f"learn-{command}"
        ran = bench(command, matrix, *(["--learn"] if command == "sim" else []), "--out", out,
                    env=env)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        (run,) = [p for p in out.iterdir() if p.is_dir() and not p.name.startswith(".")]
        models[command] = final_models(run, 4)
    assert not np.allclose(models["run"][0], models["run"][1])  # gossip left them apart
    for real, learned in zip(models["run"], models["sim"], strict=True):
        np.testing.assert_allclose(learned, real, rtol=1e-4, atol=1e-6)
