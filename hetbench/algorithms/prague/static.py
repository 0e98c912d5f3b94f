"""prague-static: P-Reduce over the paper's fixed conflict-free schedule (schedule.py).

No server: every worker computes the schedule itself. Workers that stop at different iterations
(a wall-clock budget) would leave peers waiting in a later step's group. So the first worker to
stop announces a last step E through the store: its own step plus END_MARGIN (more than the
schedule lets any worker run ahead of another, since every 4 steps everyone depends on
everyone), rounded up to a whole cycle. Every worker runs each step below E, in finish() without
training if its budget ended first, and no step from E on syncs (a singleton group), so every
group of the schedule below E meets in full and none beyond it is waited for.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from hetbench.algorithms.prague.common import PragueBase, PragueOptions
from hetbench.algorithms.prague.schedule import check_layout, static_group, static_groups
from hetbench.core.options import opt
from hetbench.errors import UserError
from hetbench.sim.protocol import Meetings, Protocol, Steps

#: Steps past the first stopper's that everyone still runs (> the 4-step dependency horizon).
END_MARGIN = 8
END_KEY = "prague-static/end"


@dataclass(frozen=True, kw_only=True)
class PragueStaticOptions(PragueOptions):
    workers_per_node: int = opt(4, "workers per node of the schedule (must divide workers)")

    def __post_init__(self):
        super().__post_init__()
        if self.workers_per_node < 1:
            raise ValueError(f"workers_per_node must be >= 1, got {self.workers_per_node}")


class PragueStatic(PragueBase):
    name = "prague-static"
    description = "Prague, static GG: P-Reduce over a fixed conflict-free inter/intra-node schedule"
    Config = PragueStaticOptions

    @classmethod
    def simulated_protocol(cls):
        return PragueStaticSim

    @classmethod
    def validate(cls, config, workers):
        try:
            check_layout(workers, config.workers_per_node)
        except ValueError as exc:
            raise UserError(f"algorithm {cls.name}: {exc}") from None

    @classmethod
    def intended_sync_share(cls, config, workers):
        # The schedule leaves some workers alone on purpose (one per node in two of every four
        # steps, in the paper's layout): the share of (worker, step) in a group of two or more.
        steps = range(4)
        grouped = sum(len(group) for s in steps
                      for group in static_groups(s, workers, config.workers_per_node)
                      if len(group) > 1)
        return grouped / (workers * len(steps))

    def setup(self, ctx, model, optimizer):
        super().setup(ctx, model, optimizer)
        self._step = 0
        self._end: int | None = None

    def next_group(self, ctx):
        step = self._step
        self._step += 1
        if self._end is None and ctx.comm.store.check([END_KEY]):
            self._end = int(ctx.comm.store.get(END_KEY))
        if self._end is not None and step >= self._end:
            return (ctx.rank,), {"schedule_step": step}
        group = static_group(ctx.rank, step, ctx.workers, self.config.workers_per_node)
        return group, {"schedule_step": step}

    def finish(self, ctx, model):
        proposal = -(-(self._step + END_MARGIN) // 4) * 4
        # The first proposal wins; later stoppers read it back.
        self._end = int(ctx.comm.store.compare_set(END_KEY, "", str(proposal)))

        def remaining():
            while self._step < self._end:
                yield self.next_group(ctx)[0]

        record = self.drain(ctx, remaining())
        self.release(ctx)
        return record


# -- simulated protocol (bench sim): the same rules in simulated time ------------------------

class PragueStaticSim(Protocol):
    """The paper's fixed schedule; the first worker to stop fixes a last synchronized step."""

    #: Its collectives run through after_rings (fair transport: as flows).
    transport_ready = True

    def __init__(self, engine):
        super().__init__(engine)
        self.end_margin = END_MARGIN
        self.step = [0] * self.n
        self.end: int | None = None
        self.meetings = Meetings(self)
        self._by_step: dict[int, dict[int, tuple[int, ...]]] = {}

    def _group(self, w: int) -> tuple[int, tuple[int, ...]]:
        step = self.step[w]
        self.step[w] += 1
        if self.end is not None and step >= self.end:
            return step, (w,)
        return step, self._groups_of(step)[w]

    def _groups_of(self, step: int) -> dict[int, tuple[int, ...]]:
        """Each worker's group at `step`, from the schedule's own static_groups.

        A real worker calls static_group (O(workers)) for itself; n simulated workers doing so
        would cost O(n^2) per step, so each step's groups are computed once and kept while
        workers can still be at that step (they are at most a few steps apart).
        """
        groups = self._by_step.get(step)
        if groups is None:
            groups = {w: g for g in static_groups(step, self.n, self.config.workers_per_node)
                      for w in g}
            self._by_step[step] = groups
            self._by_step.pop(step - 64, None)
        return groups

    def ready(self, w):
        step, group = self._group(w)
        # A dict, encoded only where event lines are written (bench sim --events full).
        fields = {"group": list(group), "gg_s": 0.0, "schedule_step": step}
        if len(group) < 2:
            self.engine.end_step(w, self.engine.now, 0.0, fields, peers=0)
        else:
            self.meetings.join((step, group), group, w, self.engine.now, fields)

    lockstep = True

    def learn(self, k, learner):
        """The real step's math: a local optimizer step, then the P-Reduce of schedule step
        k's groups."""
        learner.sgd_step(learner.gradients())
        learner.average_groups(static_groups(k, self.n, self.config.workers_per_node))

    def learn_finish(self, learner, iterations: int) -> None:
        """finish()'s drain: the schedule's groups from the last iteration to the agreed end
        (every worker stopped at the same iteration), averaging without training."""
        end = -(-(iterations + self.end_margin) // 4) * 4
        for step in range(iterations, end):
            learner.average_groups(static_groups(step, self.n, self.config.workers_per_node))

    def step_all(self, k, t_sync, full):
        """Schedule step k of every worker (in training every worker's step is its iteration,
        so a group's members are at the same iteration: staleness 0, as Meetings computes)."""
        n, net = self.n, self.net
        self.step = [k + 1] * n
        groups = static_groups(k, n, self.config.workers_per_node)
        t_end = t_sync.copy()  # a worker alone ends its step at once, waiting for nobody
        wait_s = np.zeros(n)
        peers = np.zeros(n, dtype=np.int64)
        met = [g for g in groups if len(g) > 1]
        if met:
            members = np.fromiter(itertools.chain.from_iterable(met), dtype=np.int64)
            sizes = np.array([len(g) for g in met])
            bounds = np.concatenate(([0], np.cumsum(sizes)[:-1]))
            arrived = t_sync[members]
            start = np.maximum.reduceat(arrived, bounds)
            cost = {size: net.ring_allreduce(self.model_bytes, size, n)
                    for size in set(sizes.tolist())}
            setup = net.group_setup_s
            caches = self.meetings.caches
            ends = []
            for group, begin in zip(met, start.tolist(), strict=True):
                end = begin + cost[len(group)]
                if caches.use(group):
                    self.meetings.hits += 1
                else:
                    self.meetings.misses += 1
                    end += setup
                ends.append(end)
            starts_each = np.repeat(start, sizes)
            t_end[members] = np.repeat(ends, sizes)
            wait_s[members] = starts_each - arrived
            peers[members] = np.repeat(sizes - 1, sizes)
        fields = staleness = None
        if full:
            fields = [None] * n
            for group in groups:
                entry = {"group": list(group), "gg_s": 0.0, "schedule_step": k}
                for x in group:
                    fields[x] = entry
            staleness = [0.0 if p else None for p in peers.tolist()]
        return Steps(t_end, wait_s, peers, 0.0 if staleness is None else staleness, fields)

    def met(self, w, end, wait_s, fields, peers, staleness):
        if fields is None:  # a step of finish()
            self.engine.at(end, self._drain, w, end)
        else:
            self.engine.end_step(w, end, wait_s, fields, peers=peers, staleness=staleness)

    def finish(self, w, t):
        if self.end is None:
            self.end = -(-(self.step[w] + self.end_margin) // 4) * 4
        self._drain(w, t)

    def _drain(self, w, t):
        """finish(): run every schedule step below the agreed end, without training."""
        while self.step[w] < self.end:
            step, group = self._group(w)
            if len(group) > 1:
                self.meetings.join((step, group), group, w, t, None)
                return
        self.engine.done(w)
