"""Local SGD (periodic model averaging): a complete, small algorithm to copy when adding one.

Each worker takes `period` purely local SGD steps, then all workers replace their models with the
average. It is a real algorithm (with period = 1 and no momentum it is All-Reduce SGD), kept short
so that every part of an algorithm fits in one screen: its options (LocalSGDOptions), `validate`,
`setup` and `step` (the real half), LocalSGDSim (the simulated half: the event path `ready`, and
`step_all` in lockstep) and LocalSGDSim.learn (the learning half).

The rules each part follows are in one place, hetbench.api's module docstring (`python -c
"import hetbench.api; help(hetbench.api)"`). docs/plugins.md walks through a plugin written from
it, loaded with `--plugin` and shipped as an entry point. Import everything from hetbench.api, as
this file does: every other module of hetbench is internal and may move.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from hetbench.api import (
    Algorithm,
    Protocol,
    StepInfo,
    Steps,
    UserError,
    flat_params,
    opt,
    set_flat_params,
)


@dataclass(frozen=True, kw_only=True)
class LocalSGDOptions:
    period: int = opt(4, "local steps between two model averages")


class LocalSGD(Algorithm):
    name = "local-sgd"
    description = "local SGD: `period` local steps, then all workers average their models"
    Config = LocalSGDOptions
    #: How the reports attribute its waits (core.waits.WAIT_RULES): its averaging steps are
    #: collectives over every worker; its local steps meet nobody.
    wait_rule = "all"

    @classmethod
    def intended_sync_share(cls, config, workers):
        return 1 / config.period

    @classmethod
    def simulated_protocol(cls):
        return LocalSGDSim

    @classmethod
    def validate(cls, config, workers):
        if config.period < 1:
            raise UserError(f"local-sgd: period must be >= 1, got {config.period}")

    def setup(self, ctx, model, optimizer):
        self.steps = 0

    @torch.no_grad()
    def step(self, ctx, model, optimizer):
        optimizer.step()
        self.steps += 1
        if self.steps % self.config.period:
            return StepInfo(peers=0)
        params = flat_params(model)
        ctx.comm.average_(params, members=ctx.worker_ranks)
        set_flat_params(model, params)
        return StepInfo(peers=ctx.workers - 1, staleness=0.0)


class LocalSGDSim(Protocol):
    """Simulated local SGD: a local step ends as soon as its gradient is ready; every
    `period`-th step, everyone waits for the last worker, then one ring all-reduce of the
    model (what `average_` over the worker ranks does)."""

    #: Its collectives run through after_rings (fair transport: as flows).
    transport_ready = True

    def __init__(self, engine, period: int | None = None):
        super().__init__(engine)
        self.period = period or self.config.period
        self.arrived: list[int] = []

    def ready(self, w):
        steps = self.engine.iteration[w] + 1  # the real step counts from 1
        if steps % self.period:
            self.engine.end_step(w, self.engine.now, 0.0, peers=0)
            return
        self.arrived.append(w)
        if len(self.arrived) < self.n:
            return
        start = self.engine.now  # events run in time order: the last arrival is now
        arrived, self.arrived = self.arrived, []
        self.after_rings(range(self.n), (self.model_bytes,), start, self._averaged, start,
                         arrived)

    def _averaged(self, end, start, arrived):
        for x in arrived:
            self.engine.end_step(x, end, start - self.engine.t_sync[x], peers=self.n - 1,
                                 staleness=0.0)

    lockstep = True

    def learn(self, k, learner):
        """The real step's math: a local optimizer step; every `period`-th, then the mean."""
        learner.sgd_step(learner.gradients())
        if (k + 1) % self.period == 0:
            learner.average_models()

    def step_all(self, k, t_sync, full):
        if (k + 1) % self.period:  # a local step: over when its gradient is ready
            return Steps(t_sync.copy(), np.zeros(self.n), 0, staleness=None)
        start = float(t_sync.max())
        end = self.net.ring(range(self.n), self.model_bytes, start, self.n)
        return Steps(np.full(self.n, end), start - t_sync, self.n - 1)
