"""prague-static: P-Reduce over the paper's fixed conflict-free schedule (schedule.py).

No server: every worker computes the schedule itself. Workers that stop at different iterations
(a wall-clock budget) would leave peers waiting in a later step's group, so finish() agrees on
the last step through the store and runs the remaining steps' P-Reduces without training.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetbench.algorithms.prague.common import PragueBase, PragueOptions
from hetbench.algorithms.prague.schedule import check_layout, static_group
from hetbench.errors import UserError
from hetbench.harness.options import opt


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

    def setup(self, ctx, model, optimizer):
        super().setup(ctx, model, optimizer)
        self._step = 0

    def next_group(self, ctx):
        group = static_group(ctx.rank, self._step, ctx.workers, self.config.workers_per_node)
        self._step += 1
        return group, {"schedule_step": self._step - 1}

    def finish(self, ctx, model):
        store = ctx.comm.store
        store.set(f"prague-static/steps/{ctx.rank}", str(self._step))
        last = max(int(store.get(f"prague-static/steps/{w}")) for w in range(ctx.workers))
        while self._step < last:
            members, _ = self.next_group(ctx)
            self.p_reduce(ctx, members)
