"""What every Prague variant shares: local update, get a group, P-Reduce the model with it."""

from __future__ import annotations

import time
from abc import abstractmethod
from dataclasses import dataclass

import torch

from hetbench.comm.clock import now_ns
from hetbench.comm.comm import ReduceOp
from hetbench.core.algorithm import Algorithm, StepInfo
from hetbench.core.options import opt
from hetbench.core.tensors import params_of


@dataclass(frozen=True, kw_only=True)
class PragueOptions:
    cache_size: int = opt(64, "member-set communicators each worker keeps (LRU)")

    def __post_init__(self):
        if self.cache_size < 1:
            raise ValueError(f"cache_size must be >= 1, got {self.cache_size}")


class PragueBase(Algorithm):
    """Local SGD update, then the model becomes the mean over this iteration's group."""

    synchronous = False
    wait_rule = "group"

    def setup(self, ctx, model, optimizer):
        ctx.comm.configure_p_reduce(cache_size=self.config.cache_size)
        self._params = params_of(model)
        numel = sum(p.numel() for p in self._params)
        dtype = self._params[0].dtype
        # Waiting for the group is measured in band: the reduced buffer carries one slot per
        # worker after the model, and each member writes its arrival time into its own slot
        # (zeros elsewhere), so after the sum every member knows when the last one arrived.
        # No extra message; Comm's P-Reduce itself never waits on anyone outside the
        # collective. Times are seconds since a reference common to all workers (the earliest
        # set-up), small enough for float32 (0.25 ms resolution within the first hour). A
        # second block of slots carries each member's iteration the same way (exact in float32
        # to 2^24), for the staleness of what was averaged. Half-precision models get neither
        # (wait then counts as communication, staleness is not recorded).
        self._stamped = dtype in (torch.float32, torch.float64)
        extra = 2 * ctx.workers if self._stamped else 0
        self._buf = torch.zeros(numel + extra, dtype=dtype, device=ctx.device)
        self._flat = self._buf[:numel]
        self._stamps = self._buf[numel:numel + extra // 2]
        self._iterations = self._buf[numel + extra // 2:]
        self._steps = 0  # this worker's P-Reduces so far: its iteration, then finish()'s drain
        self._staleness: float | None = None
        ref = torch.tensor([now_ns() / 1e9], dtype=torch.float64, device=ctx.device)
        ctx.comm.all_reduce_(ref, ReduceOp.MIN, ctx.worker_ranks)  # every rank runs setup
        self._t_ref = ref.item()

    @abstractmethod
    def next_group(self, ctx) -> tuple[tuple[int, ...], dict]:
        """This worker's group for its next P-Reduce, and fields for the event line."""

    @torch.no_grad()
    def p_reduce(self, ctx, members) -> float:
        """Average the model over `members`; returns seconds spent waiting for them (and keeps
        the mean iteration gap to them in self._staleness)."""
        step, self._steps = self._steps, self._steps + 1
        self._staleness = None
        if len(members) < 2:
            return 0.0
        torch.cat([p.reshape(-1) for p in self._params], out=self._flat)
        if self._stamped:
            self._stamps.zero_()
            self._iterations.zero_()
            arrived = now_ns() / 1e9 - self._t_ref
            self._stamps[ctx.rank] = arrived
            self._iterations[ctx.rank] = step
        ctx.comm.p_reduce_(self._buf, members)  # the mean: slots come back divided by |G|
        offset = 0
        for p in self._params:
            p.copy_(self._flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        if not self._stamped:
            return 0.0
        size = len(set(members))
        peers = [m for m in members if m != ctx.rank]
        gaps = (self._iterations[peers] * size - step).abs().round()
        self._staleness = gaps.mean().item()
        last = self._stamps[list(members)].max().item() * size
        return max(0.0, last - arrived)

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
        return StepInfo(wait_s=wait_s, peers=len(set(members)) - 1, staleness=self._staleness,
                        fields={"group": list(members), "gg_s": gg_s, **fields})

    def drain(self, ctx, groups) -> dict[str, int]:
        """P-Reduce over each of `groups` after the last iteration (finish()); the count of
        those that averaged with a peer, for done.rank<r>.json."""
        averaged = 0
        for members in groups:
            self.p_reduce(ctx, members)
            averaged += len(set(members)) > 1
        return {"averagings_after_training": averaged}
