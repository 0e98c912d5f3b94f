"""DiLoCo: distributed low-communication training (Douillard et al., "DiLoCo: Distributed
Low-Communication Training of Language Models", 2023, Algorithm 1).

Every worker takes H inner steps with its own optimizer (the workload's; the paper's AdamW is
one such), then all workers average the pseudo-gradient, the distance the round moved them:

    delta = theta_outer - theta_i          (theta_i: worker i's model after its H inner steps)
    theta_outer <- OuterOpt(theta_outer, mean_i delta)
    theta_i <- theta_outer                  (every worker starts the next round from it)

OuterOpt is SGD with Nesterov momentum (the paper's: learning rate 0.7, momentum 0.9), kept
identically on every worker, so the outer model needs no broadcast. Inner optimizer states stay
local across rounds, as in the paper. An outer step waits for every worker (an all-reduce of the
pseudo-gradient), so stragglers are met once every H steps instead of every step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hetbench.algorithms.template import LocalSGDSim
from hetbench.core.algorithm import Algorithm, StepInfo
from hetbench.core.options import opt
from hetbench.core.tensors import flat_params, float_buffers_of, set_flat_params
from hetbench.errors import UserError


@dataclass(frozen=True, kw_only=True)
class DiLoCoOptions:
    inner_steps: int = opt(20, "H: inner steps per outer step (the paper's 500 is for runs of "
                               "~88k steps; scale it to the run's length)")
    outer_lr: float = opt(0.7, "outer learning rate (the paper's 0.7)")
    outer_momentum: float = opt(0.9, "outer Nesterov momentum (the paper's 0.9)")


def check_outer_options(name: str, config) -> None:
    """The options DiLoCo and async DiLoCo share (inner_steps, outer_lr, outer_momentum):
    UserError (one line naming `name`) unless each is in range."""
    if config.inner_steps < 1:
        raise UserError(f"{name}: inner_steps must be >= 1, got {config.inner_steps}")
    if config.outer_lr <= 0:
        raise UserError(f"{name}: outer_lr must be > 0, got {config.outer_lr}")
    if not 0 <= config.outer_momentum < 1:
        raise UserError(f"{name}: outer_momentum must be in [0, 1), got "
                        f"{config.outer_momentum}")


def outer_optimizer(outer: torch.Tensor, config: DiLoCoOptions) -> torch.optim.Optimizer:
    """The paper's outer optimizer on the flat outer model (a leaf tensor)."""
    return torch.optim.SGD([outer], lr=config.outer_lr, momentum=config.outer_momentum,
                           nesterov=config.outer_momentum > 0)


class DiLoCo(Algorithm):
    name = "diloco"
    description = ("DiLoCo: H local inner steps, then an outer Nesterov step on the averaged "
                   "pseudo-gradient (Douillard et al. 2023)")
    Config = DiLoCoOptions
    wait_rule = "all"  # at its outer steps; inner steps meet nobody

    @classmethod
    def intended_sync_share(cls, config, workers):
        return 1 / config.inner_steps

    @classmethod
    def simulated_protocol(cls):
        return DiLoCoSim

    @classmethod
    def validate(cls, config, workers):
        check_outer_options("diloco", config)

    fact_units = {"outer_steps": "outer steps"}

    #: What DiLoCo produces is the outer model (the paper evaluates it): between outer steps
    #: a worker's own model is the outer model plus its inner steps of the round so far.
    evaluated_model = "outer model"

    def evaluated_state(self, model):
        # The outer model holds parameters only: its buffers (batch norm's statistics) are the
        # worker's own, as every algorithm keeps them.
        buffers = [b.detach().reshape(-1).to(self.outer.dtype) for b in float_buffers_of(model)]
        return torch.cat([self.outer, *buffers])

    @classmethod
    def summary_facts(cls, config, events, done):
        return {"outer_steps": max((e.get("outer_step", 0) for e in events), default=0)
                if events else None}

    def setup(self, ctx, model, optimizer):
        self.outer = flat_params(model).clone().requires_grad_(False)
        self.outer_optimizer = outer_optimizer(self.outer, self.config)
        self.steps = self.outer_steps = 0

    @torch.no_grad()
    def step(self, ctx, model, optimizer):
        optimizer.step()
        self.steps += 1
        if self.steps % self.config.inner_steps:
            return StepInfo(peers=0)
        pseudo_gradient = self.outer - flat_params(model)
        ctx.comm.average_(pseudo_gradient, members=ctx.worker_ranks)
        self.outer.grad = pseudo_gradient
        self.outer_optimizer.step()
        set_flat_params(model, self.outer)
        self.outer_steps += 1
        return StepInfo(peers=ctx.workers - 1, staleness=0.0,
                        fields={"outer_step": self.outer_steps})


class DiLoCoSim(LocalSGDSim):
    """Local SGD's timing with period H: inner steps end when their gradient is ready; every
    H-th waits for the last worker, then one ring all-reduce of the pseudo-gradient."""

    def __init__(self, engine):
        super().__init__(engine, period=engine.config.algorithm_config().inner_steps)
        self._outer = None

    def learn(self, k, learner):
        """The real step's math: an inner optimizer step; every H-th, the workers' mean
        pseudo-gradient (outer model - own model) fed to the one outer optimizer (the real
        step's outer_optimizer, Nesterov SGD), whose outer model every worker then takes.
        The outer model is the one the run scores (learner.evaluated_flat)."""
        if self._outer is None:  # the common starting model is the first outer model
            self._outer = learner.flat()[0].clone()
            self._outer_optimizer = outer_optimizer(self._outer, self.config)
            learner.evaluated_flat = self._outer  # the optimizer steps it in place
        learner.sgd_step(learner.gradients())
        if (k + 1) % self.period:
            return
        self._outer.grad = (self._outer.unsqueeze(0) - learner.flat()).mean(0)
        self._outer_optimizer.step()
        learner.set_flat(self._outer.unsqueeze(0).expand(self.n, -1))

    def stats(self):
        # Each collective is a round's outer step.
        return {"outer_steps": self.collectives}
