"""What every Prague variant shares: local update, get a group, P-Reduce the model with it."""

from __future__ import annotations

import time
from abc import abstractmethod
from dataclasses import dataclass

import torch

from hetbench.algorithms.base import Algorithm, StepInfo
from hetbench.harness.options import opt
from hetbench.harness.tensors import params_of


@dataclass(frozen=True, kw_only=True)
class PragueOptions:
    cache_size: int = opt(64, "member-set communicators each worker keeps (LRU)")

    def __post_init__(self):
        if self.cache_size < 1:
            raise ValueError(f"cache_size must be >= 1, got {self.cache_size}")


class PragueBase(Algorithm):
    """Local SGD update, then the model becomes the mean over this iteration's group."""

    synchronous = False

    def setup(self, ctx, model, optimizer):
        ctx.comm.preduce_cache_size = self.config.cache_size
        self._params = params_of(model)
        self._flat = torch.cat([p.detach().reshape(-1) for p in self._params])

    @abstractmethod
    def next_group(self, ctx) -> tuple[tuple[int, ...], dict]:
        """This worker's group for its next P-Reduce, and fields for the event line."""

    @torch.no_grad()
    def p_reduce(self, ctx, members) -> float:
        """Average the model over `members`; returns seconds spent waiting for them."""
        if len(members) < 2:
            return 0.0
        torch.cat([p.reshape(-1) for p in self._params], out=self._flat)
        waited = ctx.comm.preduce_wait_s
        ctx.comm.p_reduce_(self._flat, members)
        offset = 0
        for p in self._params:
            p.copy_(self._flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        return ctx.comm.preduce_wait_s - waited

    def release(self, ctx) -> None:
        """Destroy this worker's member communicators (end of finish; no peer needs them)."""
        ctx.comm.close_member_groups()

    @torch.no_grad()
    def step(self, ctx, model, optimizer):
        optimizer.step()
        start = time.perf_counter()
        members, fields = self.next_group(ctx)
        gg_s = time.perf_counter() - start
        wait_s = self.p_reduce(ctx, members)
        return StepInfo(wait_s=wait_s, fields={"group": list(members), "gg_s": gg_s, **fields})
