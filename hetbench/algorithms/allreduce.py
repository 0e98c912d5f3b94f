"""All-Reduce: gradients averaged over all workers every step with a ring all-reduce.

Three implementations of the same algorithm (option `impl`):

- "buckets" (default): gradients are reduced in buckets of concatenated tensors after backward,
  through ctx.comm, so the event log separates compute from communication.
- "ddp": torch's DistributedDataParallel, which overlaps the bucketed all-reduce with backward;
  the communication then shows up inside compute_s. The reference implementation others are
  checked against.
- "horovod": horovod.torch's DistributedOptimizer on horovod's own gloo controller (its hooks
  start each gradient's all-reduce during backward, step() waits for them). Horovod is not a
  dependency: `make horovod` builds it into .venv, and it is imported only when asked for.

Every worker waits for the slowest one: the baseline that stragglers hurt most.
"""

from __future__ import annotations

import functools
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from hetbench.core.algorithm import Algorithm, StepInfo
from hetbench.core.options import opt
from hetbench.core.tensors import buckets, params_of
from hetbench.errors import UserError
from hetbench.sim.protocol import Protocol

IMPLS = ("buckets", "ddp", "horovod")


@functools.cache
def horovod_missing() -> str | None:
    """None when horovod.torch imports here, else why not (for errors and `bench list`)."""
    try:
        import horovod.torch  # noqa: F401
    except Exception as exc:  # a half-built install raises more than ImportError
        return f"{type(exc).__name__}: {exc}"
    return None


@dataclass(frozen=True, kw_only=True)
class AllReduceOptions:
    bucket_mb: float = opt(25.0, "gradient bucket size in MB (as torch DDP's default; also DDP's "
                                 "bucket_cap_mb and Horovod's fusion threshold)")
    impl: Literal["buckets", "ddp", "horovod"] = opt(
        "buckets", "buckets (all-reduce after backward), ddp (torch DDP) or horovod "
                   "(horovod.torch on gloo; `make horovod` builds it)")

    def __post_init__(self):
        if self.bucket_mb <= 0:
            raise ValueError(f"bucket_mb must be > 0, got {self.bucket_mb}")
        if self.impl not in IMPLS:
            raise ValueError(f"impl must be one of {', '.join(IMPLS)}, got {self.impl!r}")


class _DDP(nn.parallel.DistributedDataParallel):
    """DDP that also answers attribute look-ups of the wrapped model (svm's loss reads
    model.weight for its L2 term), so workloads need not know they are wrapped."""

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)


class AllReduce(Algorithm):
    name = "allreduce"
    description = "ring all-reduce of gradients every step; everyone waits for the slowest"
    Config = AllReduceOptions

    @classmethod
    def optional_features(cls):
        return {"impl=horovod": "not installed (make horovod)" if horovod_missing() else None}

    @classmethod
    def simulated_protocol(cls):
        return AllReduceSim

    @classmethod
    def validate(cls, config, workers):
        # Checked when the matrix is expanded, before any process starts.
        if config.impl == "horovod" and (why := horovod_missing()):
            raise UserError("allreduce impl = horovod needs horovod.torch, which does not import "
                            f"({why.splitlines()[0]}): run `make horovod` to build it into .venv")

    @classmethod
    @contextmanager
    def services(cls, run, run_dir: Path):
        if run.algorithm_config().impl != "horovod":
            yield {}
            return
        # Horovod's gloo controller meets its peers through horovod's own HTTP rendezvous
        # server (what horovodrun would start); it serves the whole run from the launcher.
        from horovod.runner.common.util.hosts import HostInfo, get_host_assignments
        from horovod.runner.http.http_server import RendezvousServer

        host, workers = run.bind_host, run.workers
        server = RendezvousServer()
        port = server.start()
        try:
            # All ranks of a local run are on this host: one host with `workers` slots.
            server.init(get_host_assignments([HostInfo("localhost", workers)], workers))
            yield {"horovod_rendezvous": [host, port]}
        finally:
            server.stop()

    def setup(self, ctx, model, optimizer):
        self._buckets = buckets(params_of(model), int(self.config.bucket_mb * 2**20))
        self._ddp = self._hvd_optimizer = None
        self._forward_wrapped = False
        if self.config.impl == "ddp":
            self._ddp = _DDP(model, process_group=ctx.comm.group(ctx.worker_ranks),
                             device_ids=[ctx.device] if ctx.device.type == "cuda" else None,
                             bucket_cap_mb=self.config.bucket_mb)
        elif self.config.impl == "horovod":
            self._hvd_optimizer = self._horovod_setup(ctx, model, optimizer)

    def _horovod_setup(self, ctx, model, optimizer):
        import horovod.torch as hvd

        if ctx.device.type != "cpu":
            raise RuntimeError("allreduce impl = horovod runs on CPU tensors only (`make horovod` "
                               "builds Horovod without CUDA): set device = \"cpu\"")
        host, port = ctx.services["horovod_rendezvous"]
        # What horovodrun's gloo launcher would put in each rank's environment.
        os.environ.update({
            "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": str(host), "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
            "HOROVOD_HOSTNAME": "localhost",
            "HOROVOD_RANK": str(ctx.rank), "HOROVOD_SIZE": str(ctx.workers),
            "HOROVOD_LOCAL_RANK": str(ctx.rank), "HOROVOD_LOCAL_SIZE": str(ctx.workers),
            "HOROVOD_CROSS_RANK": "0", "HOROVOD_CROSS_SIZE": "1",
            "HOROVOD_GLOO_TIMEOUT_SECONDS": str(int(ctx.comm.timeout.total_seconds())),
            "HOROVOD_FUSION_THRESHOLD": str(int(self.config.bucket_mb * 2**20)),
        })
        if str(host).startswith("127."):
            # Gloo otherwise picks the interface its host name resolves to.
            os.environ["HOROVOD_GLOO_IFACE"] = "lo"
        hvd.init()
        if hvd.size() != ctx.workers or hvd.rank() != ctx.rank:
            raise RuntimeError(f"horovod joined as rank {hvd.rank()} of {hvd.size()}, "
                               f"expected {ctx.rank} of {ctx.workers}")
        # Every rank built the same seeded model; the broadcast is what horovod scripts do,
        # and it exercises horovod's collectives before the timed loop.
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        return hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    def forward_module(self, model):
        if self._ddp is None:
            return model
        self._forward_wrapped = True
        return self._ddp

    @torch.no_grad()
    def step(self, ctx, model, optimizer):
        if self._hvd_optimizer is not None:
            # Waits for the all-reduces the backward hooks started (and starts those of
            # gradients no hook saw, e.g. under emulated compute), then the local update.
            self._hvd_optimizer.step()
            return self._synced(ctx)
        if self._forward_wrapped:
            optimizer.step()  # DDP averaged the gradients during backward
            return self._synced(ctx)
        # impl = buckets, or ddp without forward passes (emulated compute): average here.
        for bucket in self._buckets:
            grads = [p.grad for p in bucket]
            flat = torch.cat([g.reshape(-1) for g in grads])
            ctx.comm.average_(flat, members=ctx.worker_ranks)
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
        optimizer.step()
        return self._synced(ctx)

    @staticmethod
    def _synced(ctx) -> StepInfo:
        """Every worker's gradient of this very iteration went into the average."""
        return StepInfo(peers=ctx.workers - 1, staleness=0.0)

    def finish(self, ctx, model):
        if self.config.impl == "horovod":
            import horovod.torch as hvd

            # Stop horovod's background thread now: ranks end with os._exit (no atexit).
            hvd.shutdown()


# -- simulated protocol (bench sim): the same rules in simulated time ------------------------

class AllReduceSim(Protocol):
    """Everyone waits for the last gradient, then one ring all-reduce per bucket."""

    def __init__(self, engine):
        super().__init__(engine)
        self.buckets = engine.layout.bucket_bytes
        self.arrived: list[int] = []

    def ready(self, w):
        self.arrived.append(w)
        if len(self.arrived) < self.n:
            return
        start = self.eng.now  # events run in time order: the last arrival is now
        active = self.eng.active
        cost = sum(self.net.ring_allreduce(b, self.n, active) for b in self.buckets)
        for x in self.arrived:
            self.eng.end_step(x, start + cost, start - self.eng.t_sync[x], peers=self.n - 1,
                              staleness=0.0)
        self.arrived = []
