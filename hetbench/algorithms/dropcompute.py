"""DropCompute: synchronous data-parallel SGD in which each worker stops computing at a time
threshold (Giladi, Gottlieb, Lavi, Hoffer, Soudry: "DropCompute: simple and more robust
distributed synchronous training via compute variance reduction", NeurIPS 2023, Algorithm 1).

A worker's batch is M micro-batches (gradient accumulation). It computes them one after another
and, once its own compute time has reached the threshold tau, drops the rest of its batch; then
every worker's accumulated gradient is averaged, weighted by the samples it computed (the
gradient of every sample computed anywhere), in one all-reduce, and every worker takes the same
step. A straggler computes fewer micro-batches, so the all-reduce no longer waits for its whole
batch: the mean iteration time falls, at the price of fewer samples per step.

tau is the option `threshold_ms`, or chosen as the paper proposes (its section 4.3): for the
first `calibration_iterations` iterations every worker computes its whole batch and records
when each micro-batch ended, and how long its all-reduce took; then every worker takes the same
tau, the one that maximises the samples computed per second over those iterations (each lasting
until its slowest worker stopped, plus the all-reduce), among the recorded end times and no
threshold at all.

The rule is one pure function (`keep_computing`), which the real step calls live and the
simulated and learning halves call over the same per-micro-batch durations.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from hetbench.comm.comm import ReduceOp
from hetbench.core.algorithm import Algorithm, StepInfo
from hetbench.core.options import opt
from hetbench.core.tensors import buckets, params_of
from hetbench.core.work import split_batch
from hetbench.errors import UserError
from hetbench.sim.protocol import Protocol, Steps


@dataclass(frozen=True, kw_only=True)
class DropComputeOptions:
    micro_batches: int = opt(4, "M: micro-batches a batch is computed in (gradient "
                                "accumulation); a worker may stop after any of them")
    threshold_ms: float = opt(0.0, "tau: stop computing once this iteration's compute has "
                                   "taken this long (ms, the run's time); 0: chosen "
                                   "automatically after calibration_iterations")
    calibration_iterations: int = opt(10, "iterations every worker computes its whole batch "
                                          "and records its micro-batches' end times, before "
                                          "the automatic tau is chosen (threshold_ms = 0)")
    bucket_mb: float = opt(25.0, "gradient bucket size in MB for the all-reduce")


def keep_computing(elapsed_s: float, threshold_s: float) -> bool:
    """Algorithm 1's test after each micro-batch: go on while this iteration's compute has
    taken less than tau (the micro-batch that crosses tau is kept; the rest are dropped)."""
    return elapsed_s < threshold_s


def micro_batches_within(ends_s, threshold_s: float) -> int:
    """How many micro-batches a worker computes whose micro-batches would end at `ends_s`
    (cumulative seconds from the iteration's start) under tau = `threshold_s`: the same rule,
    for the simulated and learning halves and for choosing tau."""
    for done, end_s in enumerate(ends_s, start=1):
        if not keep_computing(end_s, threshold_s):
            return done
    return len(ends_s)


#: Candidate thresholds choose_threshold scores at most (recorded ends, evenly spaced in
#: order): a simulation calibrating 1,024 workers records tens of thousands.
MAX_CANDIDATES = 512


def choose_threshold(ends_s: np.ndarray, comm_s: np.ndarray) -> float:
    """The paper's automatic tau from calibration iterations: `ends_s[i, w, j]` is when worker
    w's micro-batch j ended in iteration i (cumulative seconds), `comm_s[i]` what that
    iteration's all-reduce itself took. Each candidate (the recorded ends, up to
    MAX_CANDIDATES of them, and inf: drop nothing) is scored by the micro-batches computed per
    second over those iterations, an iteration lasting until its slowest worker stopped plus
    its all-reduce. The stops are micro_batches_within's, for every worker and iteration at
    once.

    The best candidate c stops the same micro-batches as every tau between the candidate
    below it and c (and so do the equally scoring candidates next to it, which stop the
    same ones): tau is the middle of that span, not its top. The top is a recorded end
    itself, and where compute is quantized (a pace floor, a constant factor) later
    iterations' same micro-batch ends a hair before or after it, so a tau there would stop
    it in some iterations and not others. inf, where it scores best or ties the top of the
    best span, drops nothing."""
    ends_s = np.asarray(ends_s, dtype=np.float64)
    m = ends_s.shape[2]
    candidates = np.unique(ends_s)
    if len(candidates) > MAX_CANDIDATES:
        candidates = candidates[np.linspace(0, len(candidates) - 1, MAX_CANDIDATES).astype(int)]
    best_rate, span = -1.0, (0.0, math.inf)
    below, below_rate = 0.0, None  # the previous candidate and its score
    for tau in [*candidates.tolist(), math.inf]:
        # keep_computing over each worker's ends: the first end at or past tau is the last
        # micro-batch computed (all m when none is).
        stops = np.minimum((ends_s < tau).sum(axis=2) + 1, m)
        stopped_at = np.take_along_axis(ends_s, stops[:, :, None] - 1, axis=2)[:, :, 0]
        seconds = float((stopped_at.max(axis=1) + comm_s).sum())
        rate = float(stops.sum()) / seconds if seconds > 0 else 0.0
        if rate > best_rate:
            best_rate, span = rate, (below, tau)
        elif rate == best_rate:  # the largest among equals, as one span where they touch
            span = (span[0] if below_rate == best_rate else below, tau)
        below, below_rate = tau, rate
    low, high = span
    return math.inf if math.isinf(high) else (low + high) / 2


#: Gradient dtypes whose floats carry counts and seconds exactly enough to share them in a
#: gradient bucket's all-reduce (a half-precision gradient would round a count past 2,048).
_CARRIES = (torch.float32, torch.float64)


@torch.no_grad()
def average_by_samples_(ctx, grad_buckets, samples: float, total: float | None = None,
                        carried: torch.Tensor | None = None) -> torch.Tensor | None:
    """Every worker's p.grad (the mean over its own `samples`) becomes the gradient over every
    sample computed anywhere (`total`, summed over the workers): one all-reduce per bucket of
    gradients times samples, divided by the total. The sample-weighted average of every
    algorithm whose workers compute unequal amounts (DropCompute, batch-balance).

    With `total` unknown, each worker's count rides in the first bucket's all-reduce, and so
    do `carried` numbers (a 1-D tensor, returned summed over the workers, on the device): no
    collective of their own (on a cluster a small all-reduce costs its latency, on shared
    cores a whole round of scheduling), and on a GPU no read by the host (which would drain
    the stream)."""
    divisor = None if total is None else float(total)
    summed = None
    for i, bucket in enumerate(grad_buckets):
        grads = [p.grad for p in bucket]
        first = grads[0]
        tail = []  # what rides in this bucket: the count, then the carried numbers
        if i == 0:
            tail = [first.new_full((1,), float(samples))] if divisor is None else []
            if carried is not None:
                tail.append(carried.reshape(-1).to(first.device))
            if tail and first.dtype not in _CARRIES:  # too coarse: a collective of their own
                summed = torch.cat([t.to(torch.float64) for t in tail])
                ctx.comm.all_reduce_(summed, ReduceOp.SUM, ctx.worker_ranks)
                tail = []
        flat = _flatten_dense_tensors([*grads, *(t.to(first.dtype) for t in tail)])
        width = flat.numel() - sum(t.numel() for t in tail)
        flat[:width].mul_(samples)
        ctx.comm.all_reduce_(flat, ReduceOp.SUM, ctx.worker_ranks)
        if tail:  # the sums carried (a copy: the gradients' part is divided next)
            summed, flat = flat[width:].clone(), flat[:width]
        if divisor is None:  # the total, read on the device
            divisor, summed = summed[:1], summed[1:]
        flat.div_(divisor)
        # Each gradient becomes its view of the averaged bucket (as allreduce.py's step).
        for param, averaged in zip(bucket, _unflatten_dense_tensors(flat, grads), strict=True):
            param.grad = averaged
    return summed if carried is not None else None


class DropCompute(Algorithm):
    name = "dropcompute"
    description = ("DropCompute: each worker stops computing micro-batches at a time threshold, "
                   "then a sample-weighted all-reduce (Giladi et al. 2023)")
    Config = DropComputeOptions
    wait_rule = "all"
    fact_units = {"dropped_micro_batches": "micro-batches", "dropped_share": "share",
                  "threshold_ms": "ms"}

    @classmethod
    def simulated_protocol(cls):
        return DropComputeSim

    @classmethod
    def validate(cls, config, workers):
        if config.micro_batches < 1:
            raise UserError(f"dropcompute micro_batches must be >= 1, got {config.micro_batches}")
        if config.threshold_ms < 0:
            raise UserError(f"dropcompute threshold_ms must be >= 0, got {config.threshold_ms}")
        if config.threshold_ms == 0 and config.calibration_iterations < 1:
            raise UserError("dropcompute: an automatic threshold (threshold_ms = 0) needs "
                            "calibration_iterations >= 1")
        if config.bucket_mb <= 0:
            raise UserError(f"dropcompute bucket_mb must be > 0, got {config.bucket_mb}")

    @classmethod
    def summary_facts(cls, config, events, done):
        computed = [e for e in events if "dropped_micro_batches" in e]
        if not computed:
            return {"dropped_micro_batches": None, "dropped_share": None, "threshold_ms": None}
        dropped = sum(e["dropped_micro_batches"] for e in computed)
        thresholds = [e["threshold_ms"] for e in computed if e.get("threshold_ms") is not None]
        return {"dropped_micro_batches": dropped,
                "dropped_share": dropped / (len(computed) * config.micro_batches),
                "threshold_ms": thresholds[-1] if thresholds else None}

    def setup(self, ctx, model, optimizer):
        self._buckets = buckets(params_of(model), int(self.config.bucket_mb * 2**20))
        self.threshold_s = (self.config.threshold_ms / 1e3 if self.config.threshold_ms > 0
                            else math.inf)
        self._calibrating = self.config.threshold_ms == 0
        #: Per calibration iteration: each micro-batch's end, then the all-reduce's seconds.
        self._calibration: list[list[float]] = []
        self._iteration = 0
        self._sizes: list[int] | None = None
        self._computed = 0

    def compute(self, ctx, model, work):
        if self._sizes is None:
            if self.config.micro_batches > work.batch_size:
                raise UserError(f"dropcompute micro_batches = {self.config.micro_batches} is "
                                f"more than the batch of {work.batch_size} samples")
            self._sizes = split_batch(work.batch_size, self.config.micro_batches)
        # Without a threshold to meet or one to choose, nothing reads the clock (on a GPU a
        # read waits for the queued micro-batches).
        timed = self._calibrating or not math.isinf(self.threshold_s)
        ends = []
        for j, size in enumerate(self._sizes):
            work.compute(size)
            if not timed:
                continue
            ends.append(work.elapsed_s)
            if not keep_computing(ends[-1], self.threshold_s):
                work.skip(sum(self._sizes[j + 1:]))  # dropped: never computed, never reused
                break
        self._computed = work.micro_batches
        if self._calibrating:
            self._calibration.append(ends)

    @torch.no_grad()
    def step(self, ctx, model, optimizer):
        used = float(sum(self._sizes[:self._computed])) if self._sizes else 0.0
        started_s = time.perf_counter()
        average_by_samples_(ctx, self._buckets, used)
        if self._calibrating:  # the last worker to arrive waited for nobody: its is the cost
            self._calibration[-1].append(time.perf_counter() - started_s)
        optimizer.step()
        fields = {"micro_batches": self._computed,
                  "dropped_micro_batches": self.config.micro_batches - self._computed,
                  "threshold_ms": None if math.isinf(self.threshold_s)
                  else self.threshold_s * 1e3}
        self._iteration += 1
        if self._calibrating and self._iteration == self.config.calibration_iterations:
            self._choose_threshold(ctx)
        return StepInfo(peers=ctx.workers - 1, staleness=0.0, fields=fields)

    def _choose_threshold(self, ctx) -> None:
        """Every worker's calibration end times, shared, and the same tau chosen on each."""
        m, iterations = self.config.micro_batches, len(self._calibration)
        ends = torch.zeros(iterations, ctx.workers, m + 1, dtype=torch.float64,
                           device=ctx.device)
        ends[:, ctx.rank, :] = torch.tensor(self._calibration, dtype=torch.float64)
        ctx.comm.all_reduce_(ends, ReduceOp.SUM, ctx.worker_ranks)
        ends = ends.cpu().numpy()
        # Host seconds measured, cluster seconds compared: elapsed_s is the run's time, and
        # so is the all-reduce's share here under a network model's dilation.
        self.threshold_s = choose_threshold(ends[:, :, :m], ends[:, :, m].min(axis=1)
                                            / ctx.dilation)
        self._calibrating = False


# -- simulated protocol (bench sim): the same rule over the same per-micro-batch durations ----

class DropComputeSim(Protocol):
    """Each worker computes micro-batches until keep_computing says stop (over the durations
    a real run's micro-batches take: their share of the batch's compute, times the worker's
    slowdown factor), then everyone waits for the last worker and all-reduces the buckets
    (the sample-weighted average: the same bytes, and a scalar)."""

    #: Its collectives run through after_rings (fair transport: as flows).
    transport_ready = True

    lockstep = True

    def __init__(self, engine):
        super().__init__(engine)
        options = engine.config.timing_config.workload_options
        self.batch = options["batch_size"]
        if self.config.micro_batches > self.batch:
            raise UserError(f"dropcompute micro_batches = {self.config.micro_batches} is more "
                            f"than the batch of {self.batch} samples")
        self.sizes = split_batch(self.batch, self.config.micro_batches)
        self.buckets = engine.layout.bucket_bytes
        self.threshold_s = (self.config.threshold_ms / 1e3 if self.config.threshold_ms > 0
                            else math.inf)
        self.calibrating = self.config.threshold_ms == 0
        #: Per calibration iteration, each worker's micro-batch ends.
        self.calibration: dict[int, list] = {}
        #: Micro-batches each worker computed, by iteration, until the iteration is learned or
        #: its steps end: played event by event (shared cores, a cluster), a worker may begin
        #: iteration k + 1 before the last step of k ends and learn(k) runs.
        self.computed: dict[int, list[int]] = {}
        self.arrived: list[int] = []

    def work(self, w, k, compute_s, factor):
        ends = np.cumsum([compute_s * size / self.batch * factor for size in self.sizes])
        m = micro_batches_within(ends.tolist(), self.threshold_s)
        if self.calibrating:
            self.calibration.setdefault(k, [None] * self.n)[w] = ends
        self.computed.setdefault(k, [self.config.micro_batches] * self.n)[w] = m
        used = sum(self.sizes[:m])
        compute = compute_s * used / self.batch
        return compute, (factor - 1.0) * compute, used

    def _fields(self, k, w) -> dict:
        m = self.computed[k][w]
        return {"micro_batches": m, "dropped_micro_batches": self.config.micro_batches - m,
                "threshold_ms": None if math.isinf(self.threshold_s)
                else self.threshold_s * 1e3}

    def _after(self, k) -> None:
        """The end of iteration k: the last calibration iteration chooses tau for all; its
        counts are kept only for a learning run's learn(k)."""
        if self.engine.learner is None:
            self.computed.pop(k, None)
        if self.calibrating and k == self.config.calibration_iterations - 1:
            ends = np.array([self.calibration[i] for i in sorted(self.calibration)])
            # What the all-reduce itself lasts on idle links (a real worker measures the one
            # it ran last, which waited for nobody); rings() would queue one on a cluster's
            # NICs, booking them, and give its end on the clock.
            comm_s = sum(self.net.ring_allreduce(nbytes, self.n, self.n)
                         for nbytes in self.buckets)
            self.threshold_s = choose_threshold(ends, np.full(len(ends), comm_s))
            self.calibrating = False

    def ready(self, w):
        self.arrived.append(w)
        if len(self.arrived) < self.n:
            return
        start = self.engine.now  # events run in time order: the last arrival is now
        k = self.engine.iteration[w]
        fields = [self._fields(k, x) for x in range(self.n)]
        arrived, self.arrived = self.arrived, []
        self.after_rings(range(self.n), self.buckets, start, self._reduced, start, arrived,
                         k, fields)

    def _reduced(self, end, start, arrived, k, fields):
        for x in arrived:
            self.engine.end_step(x, end, start - self.engine.t_sync[x], fields[x],
                                 peers=self.n - 1, staleness=0.0)
        self._after(k)

    def step_all(self, k, t_sync, full):
        start = float(t_sync.max())
        end = self.net.rings(range(self.n), self.buckets, start, self.n)
        fields = [self._fields(k, w) for w in range(self.n)] if full else None
        steps = Steps(np.full(self.n, end), start - t_sync, self.n - 1, fields=fields)
        self._after(k)
        return steps

    def learn(self, k, learner):
        """The real step's math: each worker's gradient over the micro-batches it computed
        (the first of its batch), their sample-weighted mean on every worker, then each
        worker's optimizer step with it."""
        sizes = split_batch(learner.batch_size, self.config.micro_batches)
        used = [sum(sizes[:m]) for m in self.computed.pop(k)]
        learner.sgd_step(learner.mean_by_samples(learner.gradients(samples=used), used))
