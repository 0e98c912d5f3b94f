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
from hetbench.algorithms.prague.schedule import check_layout, static_group
from hetbench.core.options import opt
from hetbench.errors import UserError

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
        grouped = sum(len(static_group(w, s, workers, config.workers_per_node)) > 1
                      for w in range(workers) for s in steps)
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
