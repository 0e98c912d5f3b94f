"""Batch balancing: synchronous data-parallel SGD in which each worker's batch is sized to its
measured speed, after LB-BSP (Chen, Weng, Wang, Li, Li: "Semi-dynamic load balancing: efficient
distributed learning in non-dedicated environments", SoCC 2020).

LB-BSP keeps bulk-synchronous SGD and its global batch, and at iteration boundaries (never
inside an iteration: "semi-dynamic") right-sizes each worker's share of the global batch to its
processing capability, so that every worker's compute ends at about the same time and the
synchronization barrier waits for nobody. What is implemented here is the rule of its CPU
clusters: worker i's batch is proportional to its sample processing speed v_i,

    x_i = X * v_i / sum_j v_j,    sum_i x_i = X = workers x the workload's batch size,

and every worker's gradient is averaged weighted by its samples (x_i / X), which is the
gradient of the union of the step's samples: the update of single-process SGD over the global
batch. A slow worker takes a smaller batch, and the all-reduce no longer waits for it.

Simplified, and said so:
- The speed a worker will have is predicted as its speed over the last `window` iterations
  (its samples over its compute seconds, slowdown included), not by the paper's learned
  predictor of the CPU case (a NARX model); nor is the GPU case's model of speed as a function
  of batch size used (here a worker's speed is taken as independent of its batch). Only
  compute enters the plan: a worker's communication time does not.
- Batches are integers: the proportional shares are rounded by largest remainder (ties to the
  lower rank), with a floor (`min_share`, and never below one sample) under which the rest is
  shared again in proportion.
- Batches are re-planned every `replan_every` iterations (1: at every iteration boundary).
- A worker planned above the workload's batch size computes its batch in micro-batches of at
  most that size (gradient accumulation), so its memory stays that of one batch.

Every worker computes the same plan: the measurements (each worker's samples and compute
seconds) ride in the first gradient bucket's all-reduce, and the plan is one pure
function of them (`plan_batches`, through `plan_from_window`), which the simulated and learning
halves call over the simulated measurements.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from hetbench.algorithms.dropcompute import average_by_samples_
from hetbench.core.algorithm import Algorithm, StepInfo
from hetbench.core.options import opt
from hetbench.core.tensors import buckets, params_of
from hetbench.core.work import split_batch
from hetbench.errors import UserError
from hetbench.sim.layout import ELEMENT_BYTES
from hetbench.sim.protocol import Protocol, Steps


@dataclass(frozen=True, kw_only=True)
class BatchBalanceOptions:
    window: int = opt(5, "iterations of measured speed (samples per second of compute, "
                         "slowdown included) that set the next batches")
    replan_every: int = opt(1, "re-plan the batches every this many iterations (1: at every "
                               "iteration boundary, as LB-BSP; window: once per window)")
    min_share: float = opt(0.0, "floor of a worker's batch as a share of the workload's batch "
                                "size (never below 1 sample)")
    bucket_mb: float = opt(25.0, "gradient bucket size in MB for the all-reduce")


def batch_floor(min_share: float, batch_size: int) -> int:
    """The fewest samples a worker's batch may hold: min_share of the batch size, at least 1."""
    # A hair below the product: 0.1 x 30 is 3.0000000000000004 in floats, a floor of 3.
    return max(1, math.ceil(min_share * batch_size - 1e-9))


def plan_batches(speeds, total: int, floor: int = 1) -> list[int]:
    """Each worker's batch for the next iteration(s): `total` samples in proportion to the
    workers' `speeds` (samples per second), each batch at least `floor`, integers summing to
    `total`. A worker whose share falls below the floor gets the floor and the rest is shared
    again among the others in proportion; then the largest-remainder rounding (ties to the
    lower index). Speeds that are not all finite and positive (nothing measured yet) give the
    even split."""
    n = len(speeds)
    if n == 0 or floor < 1 or n * floor > total:
        raise ValueError(f"cannot plan {total} samples over {n} workers with at least "
                         f"{floor} each")
    v = [float(s) for s in speeds]
    if not all(math.isfinite(s) and s > 0 for s in v):
        v = [1.0] * n
    floored: set[int] = set()
    while True:
        free = [i for i in range(n) if i not in floored]
        rest = total - floor * len(floored)
        rate = math.fsum(v[i] for i in free)
        ideal = {i: rest * v[i] / rate for i in free}
        low = [i for i in free if ideal[i] < floor]
        if not low:  # the ideals sum to rest >= floor x len(free): never all low
            break
        floored.update(low)
    batches = [floor] * n
    for i in free:
        batches[i] = math.floor(ideal[i])
    # The floors sum to within len(free) of rest (each ideal rounds down by less than one).
    left = rest - sum(batches[i] for i in free)
    for i in sorted(free, key=lambda i: (batches[i] - ideal[i], i))[:max(left, 0)]:
        batches[i] += 1
    return batches


def window_speeds(samples: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Each worker's speed over a window of iterations ([iterations, workers] arrays of the
    samples it computed and the seconds its compute took): its samples over its seconds
    (inf where it measured no time)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return samples.sum(axis=0) / seconds.sum(axis=0)


def plan_from_window(window, total: int, floor: int) -> list[int]:
    """The plan from the last iterations' measurements (`window`: (samples, seconds) pairs of
    per-worker arrays, oldest first): the one rule every half calls."""
    samples = np.array([s for s, _ in window], dtype=np.float64)
    seconds = np.array([t for _, t in window], dtype=np.float64)
    return plan_batches(window_speeds(samples, seconds).tolist(), total, floor)


def micro_batches_of(batch: int, batch_size: int) -> list[int]:
    """A worker's batch in micro-batches of at most the workload's batch size."""
    return split_batch(batch, max(1, math.ceil(batch / batch_size)))


def _speed(samples: float, seconds: float) -> float | None:
    return samples / seconds if seconds > 0 else None


class BatchBalance(Algorithm):
    name = "batch-balance"
    description = ("LB-BSP-like batch balancing: each worker's batch in proportion to its "
                   "measured speed, the global batch constant, a sample-weighted all-reduce "
                   "(Chen et al. 2020)")
    Config = BatchBalanceOptions
    wait_rule = "all"
    fact_units = {"batch_min": "samples", "batch_max": "samples",
                  "batch_share_min": "x even batch", "batch_share_max": "x even batch"}

    @classmethod
    def simulated_protocol(cls):
        return BatchBalanceSim

    @classmethod
    def validate(cls, config, workers):
        if config.window < 1:
            raise UserError(f"batch-balance window must be >= 1, got {config.window}")
        if config.replan_every < 1:
            raise UserError(f"batch-balance replan_every must be >= 1, got "
                            f"{config.replan_every}")
        if not 0.0 <= config.min_share <= 1.0:
            raise UserError(f"batch-balance min_share must be in [0, 1], got "
                            f"{config.min_share}")
        if config.bucket_mb <= 0:
            raise UserError(f"batch-balance bucket_mb must be > 0, got {config.bucket_mb}")

    @classmethod
    def summary_facts(cls, config, events, done):
        steps = [e for e in events if "batch" in e]
        if not steps:
            return {"batch_min": None, "batch_max": None, "batch_share_min": None,
                    "batch_share_max": None}
        by_rank: dict[int, list[int]] = {}
        for e in steps:
            by_rank.setdefault(e["rank"], []).append(e["batch"])
        # The even batch is the mean over every step: the global batch over the workers.
        even = math.fsum(e["batch"] for e in steps) / len(steps)
        shares = [math.fsum(b) / len(b) / even for b in by_rank.values()]
        return {"batch_min": min(e["batch"] for e in steps),
                "batch_max": max(e["batch"] for e in steps),
                "batch_share_min": min(shares), "batch_share_max": max(shares)}

    def setup(self, ctx, model, optimizer):
        self._buckets = buckets(params_of(model), int(self.config.bucket_mb * 2**20))
        self._window: deque = deque(maxlen=self.config.window)
        self._plan: list[int] | None = None
        self._total = self._floor = 0
        self._batch, self._seconds = 0, 0.0
        self._iteration = 0
        #: The last step's measurements, summed over the workers, still on the device.
        self._measured: torch.Tensor | None = None

    def _take_measurements(self, n: int) -> None:
        """The last step's measurements join the window, and the plan is made again every
        replan_every iterations. Read here, at the next compute, so that on a GPU the step
        never waits for its all-reduce."""
        measured = self._measured.to(torch.float64).cpu().numpy()
        self._measured = None
        self._window.append((measured[:n], measured[n:]))
        self._iteration += 1
        if self._iteration % self.config.replan_every == 0:
            self._plan = plan_from_window(self._window, self._total, self._floor)

    def compute(self, ctx, model, work):
        if self._measured is not None:
            self._take_measurements(ctx.workers)
        if self._plan is None:  # the even split until something is measured
            self._total = ctx.workers * work.batch_size
            self._floor = batch_floor(self.config.min_share, work.batch_size)
            self._plan = plan_batches([1.0] * ctx.workers, self._total, self._floor)
        self._batch = self._plan[ctx.rank]
        for size in micro_batches_of(self._batch, work.batch_size):
            work.compute(size)
        self._seconds = work.elapsed_s

    @torch.no_grad()
    def step(self, ctx, model, optimizer):
        n = ctx.workers
        # Every worker's samples and compute seconds, summed from zeros: the same numbers,
        # hence the same plan, on every worker.
        measured = torch.zeros(2 * n, dtype=torch.float64)
        measured[ctx.rank] = float(self._batch)
        measured[n + ctx.rank] = self._seconds
        self._measured = average_by_samples_(ctx, self._buckets, float(self._batch),
                                             carried=measured)
        optimizer.step()
        fields = {"batch": self._batch, "speed": _speed(self._batch, self._seconds)}
        return StepInfo(peers=n - 1, staleness=0.0, fields=fields)


# -- simulated protocol (bench sim): the same rule over the simulated measurements -------------

class BatchBalanceSim(Protocol):
    """Each worker computes its planned batch (its share of the batch's compute time, times
    its slowdown factor: what a real worker's micro-batches take), then everyone waits for the
    last worker and all-reduces the buckets (the sample-weighted average: the same bytes, the
    measurements' 2 x workers numbers in the first). At each iteration's end the same
    plan_from_window over the simulated samples and seconds sets the next batches."""

    #: Its collectives run through after_rings (fair transport: as flows).
    transport_ready = True

    lockstep = True

    def __init__(self, engine):
        super().__init__(engine)
        options = engine.config.timing_config.workload_options
        self.batch = options["batch_size"]
        self.total = self.n * self.batch
        self.floor = batch_floor(self.config.min_share, self.batch)
        self.plan = plan_batches([1.0] * self.n, self.total, self.floor)
        self.window: deque = deque(maxlen=self.config.window)
        # The measurements (2 x workers numbers) ride in the first bucket, as the real step's.
        first, *rest = engine.layout.bucket_bytes
        self.buckets = [first + 2 * self.n * ELEMENT_BYTES, *rest]
        #: Per iteration in progress: every worker's samples and compute seconds.
        self.measured: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        #: Per iteration not learned yet (a learned run only): every worker's batch.
        self.batches_at: dict[int, list[int]] = {}
        self.arrived: list[int] = []

    def work(self, w, k, compute_s, factor):
        batch = self.plan[w]
        compute = compute_s * batch / self.batch
        slowdown = (factor - 1.0) * compute
        samples, seconds = self.measured.setdefault(k, (np.zeros(self.n), np.zeros(self.n)))
        samples[w], seconds[w] = batch, compute + slowdown
        if self.engine.learner is not None:
            # Kept by iteration: played event by event, a worker may start k + 1 before the
            # last one's step k ends, which is when iteration k is learned.
            self.batches_at.setdefault(k, [0] * self.n)[w] = batch
        return compute, slowdown, batch

    def _fields(self, k) -> list[dict]:
        samples, seconds = self.measured[k]
        return [{"batch": int(samples[w]), "speed": _speed(samples[w], seconds[w])}
                for w in range(self.n)]

    def _after(self, k) -> None:
        """The end of iteration k: its measurements join the window, and the plan is made
        again every replan_every iterations."""
        self.window.append(self.measured.pop(k))
        if (k + 1) % self.config.replan_every == 0:
            self.plan = plan_from_window(self.window, self.total, self.floor)

    def ready(self, w):
        self.arrived.append(w)
        if len(self.arrived) < self.n:
            return
        start = self.engine.now  # events run in time order: the last arrival is now
        k = self.engine.iteration[w]
        fields = self._fields(k)
        self._after(k)  # before any step ends: the next iteration's work follows the plan
        arrived, self.arrived = self.arrived, []
        self.after_rings(range(self.n), self.buckets, start, self._reduced, start, arrived,
                         fields)

    def _reduced(self, end, start, arrived, fields):
        for x in arrived:
            self.engine.end_step(x, end, start - self.engine.t_sync[x], fields[x],
                                 peers=self.n - 1, staleness=0.0)

    def step_all(self, k, t_sync, full):
        start = float(t_sync.max())
        end = self.net.rings(range(self.n), self.buckets, start, self.n)
        fields = self._fields(k) if full else None
        steps = Steps(np.full(self.n, end), start - t_sync, self.n - 1, fields=fields)
        self._after(k)
        return steps

    def learn(self, k, learner):
        """The real step's math: each worker's gradient over its planned batch (the next
        samples of its stream, across its minibatches, as a real worker takes them), their
        sample-weighted mean on every worker, then each worker's optimizer step with it."""
        batches = self.batches_at.pop(k)
        if learner.batch_size != self.batch:  # [timing]'s batch planned: the same shares
            batches = plan_batches(batches, self.n * learner.batch_size,
                                   batch_floor(self.config.min_share, learner.batch_size))
        grads = learner.gradients(samples=batches, stream=True)
        learner.sgd_step(learner.mean_by_samples(grads, batches))
