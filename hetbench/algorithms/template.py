"""Local SGD (periodic model averaging): a complete, small algorithm to copy when adding one.

Each worker takes `period` purely local SGD steps, then all workers replace their models with the
average. It is a real algorithm (with period = 1 and no momentum it is All-Reduce SGD), kept short
so the whole Algorithm contract is visible in one screen:

1. Options: a frozen kw_only dataclass; each field's `opt(default, doc)` shows up in `bench list`
   and can be set from a matrix file as `[algorithm.local-sgd] period = 8`. hetbench checks
   each value against the field's type annotation (int, float, bool, str, Literal[...]) and
   refuses a mismatch in one line before any process starts; `validate` is for the rest.
   Import everything from `hetbench.api` (the public plugin API; every other module of
   hetbench is internal and may move), as this file does.
2. `validate` rejects bad values before any process starts (raise UserError, one line).
3. `setup` runs on every rank before the clock starts: create process groups here.
4. `step` is called after forward/backward with gradients in p.grad: apply the local update and
   synchronize through ctx.comm (never torch.distributed directly; `help(Comm)` says which
   primitive serves which pattern: groups formed on the fly use p_reduce_). Point-to-point
   tags are yours, except those hetbench reserves on the world group: 71 (evaluation's
   search for the time to target, after training), 72 (a staged message's speed) and 73 (the
   clocks' exchanges), both before and after training; keep clear of them. Return a
   StepInfo: how many peers' models went into this step's update (peers; 0 for a local step)
   and how stale they were (staleness, in iterations): reports show them as synchronization
   health beside throughput. Add any fields for the event log. No timing code: the harness
   records whom the step's Comm operations met and how long its point-to-point ones blocked
   (its wait_s), and the reports infer a collective's wait from every member's arrival. Set
   wait_s yourself only for waits Comm cannot see (a condition a receiving thread fills), and
   `waited_on` ({rank: seconds}) when your step knows whose message ended each wait.
   Declare how the reports attribute your steps' waits ("who waited for whom"): `wait_rule`,
   one of hetbench.api's WAIT_RULES ("all" here: the averaging steps are collectives over
   every worker), or a WaitRule of your own.
5. `intended_sync_share` says how often the protocol means to average (here 1 step in
   `period`); a report flags a run that averages markedly less than that. Without it the
   harness assumes every iteration.
6. `synchronous = True` because every worker takes part in every average. Set it True only
   when every worker runs the same collective at every iteration in the same order: a
   wall-clock budget (`seconds`) is then agreed each iteration by a collective, so no worker
   leaves while its peers still wait for it. Anything else (pairs, groups formed on the fly, a
   server, a serving thread) sets it False, and drains in `finish` what peers may still ask.
7. The simulated half (optional; `bench sim` refuses an algorithm without one): a Protocol
   subclass that plays the same rules in simulated time, named by `simulated_protocol`. The
   engine (`self.engine`) calls `ready(w)` when worker w's gradient is ready (at `self.engine.now`);
   the protocol decides when w's step ends and calls `self.engine.end_step(w, t_end, wait_s,
   fields, peers=..., staleness=...)` with what the real step's StepInfo would say. Costs come
   from `self.net` (hetbench.api's docstring lists them: `ring(members, nbytes, at, active)`
   for a ring all-reduce, `message_to(src, dst, nbytes, at, active)` for a message,
   `p_reduce(...)`, `rpc_one_way(w)`), sizes from `self.model_bytes`; draw any randomness
   from the same seeds the real step uses. A pairwise protocol (worker w averages with one
   partner p) looks like this:

       def ready(self, w):
           p = self.partner(w)
           self.arrived[w] = self.engine.now
           if p not in self.arrived:
               return                      # the first of the pair waits for the other
           start = self.engine.now            # events run in time order: now is the later arrival
           end = self.net.ring((w, p), self.model_bytes, start, self.engine.active)
           for x in (w, p):
               self.engine.end_step(x, end, start - self.arrived.pop(x), peers=1, staleness=0.0)

   `lockstep = True` (with `step_all`, as below) lets the engine play every worker's k-th step
   at once, far faster at thousands of workers; it is allowed only when worker w's k-th step
   ends at a time the k-th gradients alone decide, whatever order events run in. Protocols
   whose costs depend on what else happens at that instant (a NIC queue other messages are
   in, a count of active processes that varies with who is computing) or on the order of
   arrivals (pairs formed by who comes first) do not qualify: leave lockstep False. The
   event path is the reference; tests/unit/test_sim_lockstep.py checks a lockstep protocol
   against it.
   Default costs are a generic machine's: `bench sim --fit-from RESULTS` fits them to real
   runs of yours (throughput and messages) before you trust a prediction, and `--against
   RESULTS` then shows each cell's error.

To ship your own as a plugin, put the class in your package and declare an entry point:

    [project.entry-points."hetbench.algorithms"]
    my-algo = "my_package.my_module:MyAlgorithm"

`bench list` then shows it and `bench run --algorithms my-algo,allreduce` compares it.
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
