"""All-Reduce: gradients averaged over all workers every step with a ring all-reduce.

Three implementations of the same algorithm (option `impl`):

- "buckets" (default): gradients are reduced in buckets of concatenated tensors after backward,
  through ctx.comm, so the event log separates compute from communication.
- "ddp": torch's DistributedDataParallel, which overlaps the bucketed all-reduce with backward.
  Compute ends (pace floor, injected slowdown) when the last bucket is ready, so the wait for
  the last all-reduce is communication, not compute (harness/compute_end.py). The reference
  implementation others are checked against.
- "horovod": horovod.torch's DistributedOptimizer on horovod's own gloo controller (its hooks
  start each gradient's all-reduce during backward, step() waits for them). Horovod is not a
  dependency: `make horovod` builds it into .venv, and it is imported only when asked for.

Gradient compression (option `compression = "powersgd"`, impl = "ddp"): PowerSGD (Vogels,
Karimireddy, Jaggi, NeurIPS 2019), rank-r power iteration with error feedback and warm start,
through torch DDP's communication hook (torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook).
It cuts the bytes each all-reduce moves, not the synchronization: everyone still waits for the
slowest. torch's hook all-reduces uncompressed for its first `powersgd_start_iter` iterations
(DDP rebuilds its buckets after the first; 2 is the least it allows) and for any tensor that
would not shrink by `powersgd_min_compression_rate`; 1-D tensors (biases) always go uncompressed.

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
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD

from hetbench.core.algorithm import Algorithm, StepInfo
from hetbench.core.options import opt
from hetbench.core.tensors import buckets, params_of
from hetbench.errors import UserError
from hetbench.sim.synchronous import Collective

IMPLS = ("buckets", "ddp", "horovod")
COMPRESSIONS = ("none", "powersgd")


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

    compression: Literal["none", "powersgd"] = opt(
        "none", "none, or powersgd (low-rank gradients with error feedback, Vogels et al. "
                "2019; needs impl = ddp and real compute)", added_later=True)
    powersgd_rank: int = opt(1, "PowerSGD's matrix approximation rank r", added_later=True)
    powersgd_start_iter: int = opt(
        2, "iterations all-reduced uncompressed before PowerSGD starts (torch's hook needs >= 2)",
        added_later=True)
    powersgd_min_compression_rate: float = opt(
        2.0, "a tensor is compressed only if that shrinks it at least this much (torch's "
             "default; 0 compresses every matrix)", added_later=True)

    def __post_init__(self):
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {', '.join(COMPRESSIONS)}, "
                             f"got {self.compression!r}")
        if self.powersgd_rank < 1:
            raise ValueError(f"powersgd_rank must be >= 1, got {self.powersgd_rank}")
        if self.powersgd_start_iter < 2:
            raise ValueError("powersgd_start_iter must be >= 2 (torch's PowerSGD hook with "
                             f"error feedback), got {self.powersgd_start_iter}")
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


def _ending_compute_first(ctx, hook):
    """`hook` behind the harness's end of compute: the last bucket is ready once every
    gradient is computed, and backward then blocks on its all-reduce, which must not be timed
    (or slowed down) as compute. Earlier buckets' all-reduces overlap compute, as DDP intends."""

    @functools.wraps(hook)
    def ending_compute_first(state, bucket):
        if bucket.is_last():
            ctx.end_compute()
        return hook(state, bucket)

    return ending_compute_first


def _counted(ctx, hook):
    """`hook` with its bucket's bytes on the rank's traffic record: DDP calls the process group
    itself, past Comm, which would otherwise count nothing."""

    @functools.wraps(hook)
    def counted(state, bucket):
        buffer = bucket.buffer()
        ctx.comm.traffic.collective_bytes += buffer.numel() * buffer.element_size()
        return hook(state, bucket)

    return counted


class AllReduce(Algorithm):
    name = "allreduce"
    description = "ring all-reduce of gradients every step; everyone waits for the slowest"
    Config = AllReduceOptions
    wait_rule = "all"

    @classmethod
    def optional_features(cls):
        return {"impl=horovod": "not installed (make horovod)" if horovod_missing() else None}

    @classmethod
    def simulated_protocol(cls):
        return AllReduceSim

    fact_units = {"powersgd_compression_rate": "x (dense bytes / sent bytes)"}

    @classmethod
    def summary_facts(cls, config, events, done):
        if config.compression == "none":
            return {}
        first = done[0] if done else None
        return {"powersgd_compression_rate":
                first.get("powersgd_compression_rate") if first else None}

    @classmethod
    def needs_real_compute(cls, config):
        if config.compression != "none":
            return (f"compression = {config.compression} runs in DDP's communication hook, "
                    "during backward")
        return None

    @classmethod
    def outside_comm(cls, config):
        if config.impl in ("ddp", "horovod"):
            return f"impl = {config.impl} communicates through {config.impl}, not Comm"
        return None

    @classmethod
    def one_host_only(cls, config):
        if config.impl == "horovod":
            # Its ranks would need horovodrun's host assignments (local and cross ranks per
            # host) and its rendezvous on an address every host reaches; hetbench serves one
            # host's, and no Horovod is built here to prove more.
            return ("impl = horovod meets through a rendezvous hetbench serves for one host's "
                    "ranks only; impl = \"ddp\" runs the same ring all-reduce across hosts")
        return None

    @classmethod
    def validate(cls, config, workers):
        # Checked when the matrix is expanded, before any process starts.
        if config.compression != "none" and config.impl != "ddp":
            raise UserError(f"allreduce compression = {config.compression} runs through torch "
                            f"DDP's communication hook: set impl = \"ddp\" (got {config.impl})")
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
        self._ddp = self._hvd_optimizer = self._powersgd = None
        self._forward_wrapped = False
        if self.config.impl == "ddp":
            self._ddp = _DDP(model, process_group=ctx.comm.group(ctx.worker_ranks),
                             device_ids=[ctx.device] if ctx.device.type == "cuda" else None,
                             bucket_cap_mb=self.config.bucket_mb)
            if self.config.compression == "powersgd":
                self._powersgd = self._powersgd_state(ctx)
                state, hook = self._powersgd, powerSGD.powerSGD_hook
            else:
                state, hook = ctx.comm.group(ctx.worker_ranks), _counted(
                    ctx, default_hooks.allreduce_hook)
            self._ddp.register_comm_hook(state, _ending_compute_first(ctx, hook))
        elif self.config.impl == "horovod":
            self._hvd_optimizer = self._horovod_setup(ctx, model, optimizer)

    def _powersgd_state(self, ctx):
        return powerSGD.PowerSGDState(
            process_group=ctx.comm.group(ctx.worker_ranks),
            matrix_approximation_rank=self.config.powersgd_rank,
            start_powerSGD_iter=self.config.powersgd_start_iter,
            min_compression_rate=self.config.powersgd_min_compression_rate,
            use_error_feedback=True, warm_start=True,
            # Same seed on every rank: the hook's random initial Q must agree across ranks.
            random_seed=ctx.seed,
        )

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
        if self.config.compression != "none":  # needs_real_compute keeps this from happening
            raise RuntimeError(f"allreduce compression = {self.config.compression} needs DDP's "
                               "forward/backward, which this run does not make")
        # impl = buckets, or ddp without forward passes (emulated compute): average here.
        for bucket in self._buckets:
            grads = [p.grad for p in bucket]
            flat = _flatten_dense_tensors(grads)
            ctx.comm.average_(flat, members=ctx.worker_ranks)
            # Each gradient becomes its view of the averaged bucket, as DDP's
            # gradient_as_bucket_view does: no copy back. (torch._utils' flatten/unflatten are
            # the C++ helpers DDP and apex use.) Cheaper in thread CPU than concatenating in
            # Python and copying slices back one by one (measured in
            # docs/results/benchmarks-history.md, "On the CPU, where the harness's own time went").
            for param, averaged in zip(bucket, _unflatten_dense_tensors(flat, grads),
                                       strict=True):
                param.grad = averaged
        optimizer.step()
        return self._synced(ctx)

    @staticmethod
    def _synced(ctx) -> StepInfo:
        """Every worker's gradient of this very iteration went into the average."""
        return StepInfo(peers=ctx.workers - 1, staleness=0.0)

    def finish(self, ctx, model):
        if self._powersgd is not None:
            # What the compression saved, over the iterations after the uncompressed start.
            rate = self._powersgd.compression_stats()[0]
            return {"powersgd_compression_rate": float(rate),
                    "powersgd_iterations": int(self._powersgd.iter)}
        if self.config.impl == "horovod":
            import horovod.torch as hvd

            # Stop horovod's background thread now: ranks end with os._exit (no atexit).
            hvd.shutdown()


# -- simulated protocol (bench sim): the same rules in simulated time ------------------------

class AllReduceSim(Collective):
    """Everyone waits for the last gradient, then one ring all-reduce per bucket."""

    def __init__(self, engine):
        super().__init__(engine)
        if self.config.compression != "none":
            raise UserError(f"bench sim does not model allreduce compression = "
                            f"{self.config.compression} (its messages' sizes); simulate "
                            "compression = \"none\" or measure with bench run")
        self.buckets = engine.layout.bucket_bytes

    def sizes(self, k):
        return self.buckets

    def learn(self, k, learner):
        """The real step's math: every worker's gradient averaged over the workers, then
        each worker's optimizer step with the average."""
        learner.sgd_step(learner.mean_over_workers(learner.gradients()))
