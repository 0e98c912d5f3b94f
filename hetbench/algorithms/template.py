"""Local SGD (periodic model averaging): a complete, small algorithm to copy when adding one.

Each worker takes `period` purely local SGD steps, then all workers replace their models with the
average. It is a real algorithm (with period = 1 and no momentum it is All-Reduce SGD), kept short
so that every part of an algorithm fits in one screen: its options (LocalSGDOptions), `validate`,
`setup` and `step` (the real half), LocalSGDSim (the simulated half: it declares each
iteration's collective, `sizes(k)`, and Collective derives the event and lockstep paths) and
LocalSGDSim.learn (the learning half).

The rules each part follows are in one place, hetbench.api's module docstring (`python -c
"import hetbench.api; help(hetbench.api)"`). docs/plugins.md walks through a plugin written from
it, loaded with `--plugin` and shipped as an entry point. Import everything from hetbench.api, as
this file does: every other module of hetbench is internal and may move.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hetbench.api import (
    Algorithm,
    Collective,
    StepInfo,
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


class LocalSGDSim(Collective):
    """Simulated local SGD: a local step ends as soon as its gradient is ready; every
    `period`-th step, everyone waits for the last worker, then one ring all-reduce of the
    model (what `average_` over the worker ranks does). Collective derives the event path,
    the lockstep path and the fair transport's flows from `sizes(k)` alone."""

    def __init__(self, engine, period: int | None = None):
        super().__init__(engine)
        self.period = period or self.config.period

    def sizes(self, k):
        """Iteration k's ring all-reduces: the model's bytes every `period`-th step (the real
        step counts from 1), none otherwise."""
        return None if (k + 1) % self.period else (self.model_bytes,)

    def learn(self, k, learner):
        """The real step's math: a local optimizer step; every `period`-th, then the mean."""
        learner.sgd_step(learner.gradients())
        if (k + 1) % self.period == 0:
            learner.average_models()
