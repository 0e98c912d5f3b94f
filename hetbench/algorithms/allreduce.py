"""All-Reduce: gradients averaged over all workers every step with a ring all-reduce.

Gradients are reduced in buckets of concatenated tensors, after backward, so the event log can
separate compute from communication (DDP would overlap the two and blur the timeline). Every
worker waits for the slowest one: the baseline that stragglers hurt most.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hetbench.algorithms.base import Algorithm, StepInfo
from hetbench.harness.options import opt
from hetbench.harness.tensors import buckets, params_of


@dataclass(frozen=True, kw_only=True)
class AllReduceOptions:
    bucket_mb: float = opt(25.0, "gradient bucket size in MB (as torch DDP's default)")

    def __post_init__(self):
        if self.bucket_mb <= 0:
            raise ValueError(f"bucket_mb must be > 0, got {self.bucket_mb}")


class AllReduce(Algorithm):
    name = "allreduce"
    description = "ring all-reduce of gradients every step; everyone waits for the slowest"
    Config = AllReduceOptions

    def setup(self, ctx, model, optimizer):
        self._buckets = buckets(params_of(model), int(self.config.bucket_mb * 2**20))

    @torch.no_grad()
    def step(self, ctx, model, optimizer):
        for bucket in self._buckets:
            grads = [p.grad for p in bucket]
            flat = torch.cat([g.reshape(-1) for g in grads])
            ctx.comm.average_(flat, members=ctx.worker_ranks)
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
        optimizer.step()
        return StepInfo()
