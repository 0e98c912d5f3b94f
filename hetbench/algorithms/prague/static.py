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

from dataclasses import dataclass

from hetbench.algorithms.prague.common import PragueBase, PragueOptions
from hetbench.algorithms.prague.schedule import check_layout, static_group, static_groups
from hetbench.core.options import opt
from hetbench.errors import UserError
from hetbench.sim.synchronous import GroupAverage, meeting_key

#: Steps past the first stopper's that everyone still runs (> the 4-step dependency horizon).
END_MARGIN = 8
END_KEY = "prague-static/end"


def agreed_end(step: int, margin: int = END_MARGIN) -> int:
    """The last step E a worker stopping at `step` proposes: `margin` steps on, rounded up to
    a whole cycle of the schedule's 4 steps."""
    return -(-(step + margin) // 4) * 4


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
        proposal = agreed_end(self._step)
        # The first proposal wins; later stoppers read it back.
        self._end = int(ctx.comm.store.compare_set(END_KEY, "", str(proposal)))

        def remaining():
            while self._step < self._end:
                yield self.next_group(ctx)[0]

        record = self.drain(ctx, remaining())
        self.release(ctx)
        return record


# -- simulated protocol (bench sim): the same rules in simulated time ------------------------

class PragueStaticSim(GroupAverage):
    """The paper's fixed schedule; the first worker to stop fixes a last synchronized step."""

    def __init__(self, engine):
        super().__init__(engine)
        self.step = [0] * self.n
        self.end: int | None = None

    def groups(self, k):
        return static_groups(k, self.n, self.config.workers_per_node)

    def group_fields(self, k, group):
        return {"group": list(group), "gg_s": 0.0, "schedule_step": k}

    def _group(self, w: int) -> tuple[int, tuple[int, ...]]:
        step = self.step[w]
        self.step[w] += 1
        if self.end is not None and step >= self.end:
            return step, (w,)
        return step, self.group_of(w, step)

    def ready(self, w):
        step, group = self._group(w)  # its schedule step, which finish() runs on past training
        # No event lines: no fields to format (a member's copy of a 4,096-member group each
        # was O(g^2) a step); "" is not None, which met() reads as a step of finish().
        fields = self.group_fields(step, group) if self.engine.full_events else ""
        self.meet(w, step, group, fields)

    def learn(self, k, learner):
        """The real step's math: a local optimizer step, then the P-Reduce of schedule step
        k's groups."""
        learner.sgd_step(learner.gradients())
        learner.average_groups(self.groups(k))

    def learn_finish(self, learner, iterations: int) -> None:
        """finish()'s drain: the schedule's groups from the last iteration to the agreed end
        (every worker stopped at the same iteration), averaging without training."""
        end = agreed_end(iterations)
        for step in range(iterations, end):
            learner.average_groups(self.groups(step))

    def step_all(self, k, t_sync, full):
        self.step = [k + 1] * self.n  # in training every worker's step is its iteration
        return super().step_all(k, t_sync, full)

    def met(self, w, end, wait_s, fields, peers, staleness):
        if fields is None:  # a step of finish()
            self.engine.at(end, self._drain, w, end)
        else:
            super().met(w, end, wait_s, fields, peers, staleness)

    def finish(self, w, t):
        if self.end is None:
            self.end = agreed_end(self.step[w])
        self._drain(w, t)

    def _drain(self, w, t):
        """finish(): run every schedule step below the agreed end, without training."""
        while self.step[w] < self.end:
            step, group = self._group(w)
            if len(group) > 1:
                self.meetings.join(meeting_key(step, group), group, w, t, None)
                return
        self.engine.done(w)
