"""Asynchronous DiLoCo: asynchronous Local-SGD with an outer Nesterov optimizer on a server (Liu,
Chhaparia, Douillard, Kale, Rusu, Shen, Szlam, Ranzato: "Asynchronous Local-SGD Training for
Language Modeling", 2024), with its two remedies, Delayed Nesterov (DN) and Dynamic Local
Updates (DyLU), as options.

Every worker takes H local inner steps with its own optimizer (the workload's; its state stays
the worker's across rounds, as in DiLoCo), then pushes its pseudo-gradient to the server rank
(rank `workers`) and waits for the reply:

    delta_w = theta_start_w - theta_w       (the outer model w started the round from, minus
                                             its model after its inner steps)

The server applies each pseudo-gradient on arrival, one at a time in the order it takes them,
with the outer optimizer below, and replies with its outer model (and its update count, and
w's H for the next round); the worker starts its next round from that model. No worker waits
for another, only for the server's queue. The server's outer model is what the run evaluates
(`evaluated_model = "server"`).

The outer step, exactly (`outer_step`, one pure function for the real server and both
simulated halves): N = dn_period, beta = outer_momentum, eps = outer_lr, Delta_t the t-th
pseudo-gradient the server applies (t = 1, 2, ...), m = 0 and a = 0 at the start:

    a <- a + Delta_t
    t mod N != 0:   theta <- theta - eps * Delta_t / N                  (plain SGD, no momentum)
    t mod N == 0:   m <- beta * m + a / N
                    theta <- theta - eps * (Delta_t / N + beta * m)     (the Nesterov step)
                    a <- 0

With N = 1 this is torch.optim.SGD(lr=eps, momentum=beta, nesterov=True) applied to each
pseudo-gradient, the same operations in the same order (on the CPU, the same bits): the naive
async DiLoCo that the paper finds converges worse, since momentum compounds stale pseudo-gradients
at every update. With N > 1 it is Delayed Nesterov as we read the paper (its momentum
activation c taken as 0): the momentum buffer is updated, and its term applied, only every
N-th update, with the mean of the N pseudo-gradients since the previous one; in between, each
pseudo-gradient is applied by plain SGD, scaled by 1/N. Over N updates the outer model moves
by -eps * (mean of the N pseudo-gradients + beta * m): one Nesterov step on their mean, as
synchronous DiLoCo takes on N workers' mean (N = the number of workers spans about one push
per worker). A variant with c > 0 (a share c * beta * m of the momentum applied at the
intermediate updates too) is not implemented.

DyLU (`dylu = true`; `dylu_local_steps`, the same pure function in every half): worker w's H
for its next round is H_w = max(1, round(H * s_fast / s_w)), i.e. H * speed_w / speed_max,
where s_w is w's seconds per inner step over its latest round and s_fast the smallest s among
the workers measured so far (the fastest's), including w's. A worker measures its own round,
on its own clock (divided by an emulated network's dilation): from the end of its previous
push (its reply received) to the moment its pseudo-gradient is ready, over the round's inner
steps; its first round, which has no earlier push, from the end of its first compute, over
the round's steps after it (none when H = 1: no measure). The measure travels with the push;
the server keeps each worker's latest and returns H_w in the reply. Without DyLU every round
takes H. A worker unmeasured so far takes H.

Staleness of a pseudo-gradient (the push step's StepInfo.staleness): the server updates made
between the reply its worker started the round from and its own update (0: nobody else's
update came in between). A worker's inner steps after its last push when its budget ends are
not pushed (finish() tells the server it is done, as ps-async's workers do); the done record
counts them.

Messages (point to point, float32): a push is the flat pseudo-gradient then [flag (0: a
pseudo-gradient, 1: done), w's seconds per inner step (-1: not measured), the round's H]; a
reply is the flat outer model then [the server's update count, w's next H].
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hetbench.algorithms.diloco import check_outer_options
from hetbench.core.algorithm import Algorithm, StepInfo
from hetbench.core.options import opt
from hetbench.core.tensors import flat_params, set_flat_params
from hetbench.errors import UserError
from hetbench.network.transport import ANY
from hetbench.sim.protocol import Protocol

PUSH_TAG = 1
REPLY_TAG = 2
PSEUDO_GRADIENT, DONE = 0.0, 1.0
#: Elements a push carries after the pseudo-gradient (flag, seconds per step, H), and a reply
#: after the outer model (update count, next H).
PUSH_EXTRA, REPLY_EXTRA = 3, 2


@dataclass(frozen=True, kw_only=True)
class AsyncDiLoCoOptions:
    inner_steps: int = opt(20, "H: inner steps per round (a worker's steps between pushes; "
                               "with dylu, the fastest worker's)")
    outer_lr: float = opt(0.7, "outer learning rate (DiLoCo's 0.7)")
    outer_momentum: float = opt(0.9, "outer Nesterov momentum (DiLoCo's 0.9)")
    dn_period: int = opt(1, "Delayed Nesterov: the momentum is updated and applied every "
                            "dn_period server updates, plain SGD steps of pseudo-gradient / "
                            "dn_period in between; 1: Nesterov at every update (naive "
                            "async DiLoCo); the number of workers spans about one push each")
    dylu: bool = opt(False, "Dynamic Local Updates: each worker's H scaled by its speed "
                            "relative to the fastest worker's, max(1, round(H * speed / "
                            "fastest speed)), speeds measured over each worker's latest round")


@dataclass
class OuterState:
    """The outer optimizer's state beside the outer model: updates applied, the momentum buffer,
    and the pseudo-gradients summed since the last momentum update (dn_period > 1)."""

    updates: int = 0
    momentum: torch.Tensor | None = None
    accumulated: torch.Tensor | None = None


@torch.no_grad()
def outer_step(outer: torch.Tensor, pseudo_gradient: torch.Tensor, state: OuterState,
               config: AsyncDiLoCoOptions) -> None:
    """One server update of the flat outer model in place with one pseudo-gradient: the module
    docstring's formula (dn_period = 1: torch.optim.SGD's Nesterov step, bit for bit)."""
    period, beta = config.dn_period, config.outer_momentum
    state.updates += 1
    scaled = pseudo_gradient if period == 1 else pseudo_gradient / period
    if period > 1:
        if state.accumulated is None:
            state.accumulated = torch.zeros_like(outer)
        state.accumulated.add_(pseudo_gradient)
    if state.updates % period:
        outer.add_(scaled, alpha=-config.outer_lr)
        return
    if state.momentum is None:
        # Zeros: beta * 0 + g is g exactly, torch.optim.SGD's first buffer.
        state.momentum = torch.zeros_like(outer)
    mean = pseudo_gradient if period == 1 else state.accumulated / period
    state.momentum.mul_(beta).add_(mean)
    outer.add_(scaled.add(state.momentum, alpha=beta), alpha=-config.outer_lr)
    if state.accumulated is not None:
        state.accumulated.zero_()


def dylu_local_steps(inner_steps: int, seconds_per_step: Sequence[float | None], w: int) -> int:
    """DyLU's H for worker w's next round: max(1, round(H * s_fast / s_w)) (speed ratio
    speed_w / speed_max), s_fast the smallest of the workers' measured seconds per inner step
    (None: not measured yet); H while w itself is unmeasured."""
    mine = seconds_per_step[w]
    if mine is None:
        return inner_steps
    fastest = min(s for s in seconds_per_step if s is not None)
    return max(1, round(inner_steps * fastest / mine))


def next_local_steps(config: AsyncDiLoCoOptions, seconds_per_step: Sequence[float | None],
                     w: int) -> int:
    """The H the server sends worker w for its next round."""
    if not config.dylu:
        return config.inner_steps
    return dylu_local_steps(config.inner_steps, seconds_per_step, w)


class AsyncDiLoCo(Algorithm):
    name = "async-diloco"
    description = ("asynchronous DiLoCo: H local inner steps, then the pseudo-gradient to a "
                   "server that applies each on arrival with outer Nesterov SGD (Liu et al. "
                   "2024; Delayed Nesterov and Dynamic Local Updates as options)")
    Config = AsyncDiLoCoOptions
    synchronous = False
    wait_rule = "server"  # a push waits for the server's queue, update and reply alone
    #: What the algorithm produces is the server's outer model: each worker holds that model
    #: as it last took it, plus its inner steps since.
    evaluated_model = "server"

    fact_units = {"outer_steps": "server updates", "staleness_max": "server updates",
                  "staleness_mean": "server updates", "mean_local_steps": "inner steps"}

    @classmethod
    def server_ranks(cls, config, workers):
        return 1

    @classmethod
    def intended_sync_share(cls, config, workers):
        return 1 / config.inner_steps

    @classmethod
    def simulated_protocol(cls):
        return AsyncDiLoCoSim

    @classmethod
    def validate(cls, config, workers):
        check_outer_options("async-diloco", config)
        if config.dn_period < 1:
            raise UserError(f"async-diloco: dn_period must be >= 1, got {config.dn_period}")

    @classmethod
    def summary_facts(cls, config, events, done):
        """Server updates, the staleness of the pseudo-gradients they applied, and each
        worker's mean H over the rounds it pushed (a list by worker rank)."""
        if not events:
            return {"outer_steps": None, "staleness_max": None, "staleness_mean": None,
                    "mean_local_steps": None}
        pushes = [e for e in events if "outer_step" in e]
        staleness = [e["staleness"] for e in pushes if e.get("staleness") is not None]
        by_worker: dict[int, list[int]] = {}
        for e in pushes:
            by_worker.setdefault(e["rank"], []).append(e["local_steps"])
        workers = len(done) - 1  # every rank's record (or None), the server's last
        return {"outer_steps": len(pushes),
                "staleness_max": max(staleness, default=None),
                "staleness_mean": sum(staleness) / len(staleness) if staleness else None,
                "mean_local_steps": [sum(h) / len(h) if (h := by_worker.get(w)) else None
                                     for w in range(workers)]}

    def setup(self, ctx, model, optimizer):
        self.server = ctx.workers
        params = flat_params(model).to(ctx.device)
        # Every rank starts from the server's model (they are seeded alike; this makes it so).
        ctx.comm.broadcast_(params, src=self.server)
        set_flat_params(model, params)
        numel = params.numel()
        self._push_message = torch.zeros(numel + PUSH_EXTRA, device=ctx.device)
        self._reply = torch.zeros(numel + REPLY_EXTRA, device=ctx.device)
        #: The outer model this worker's round started from (the server's: its outer model).
        self.start = params.clone()
        self.local_steps = self.config.inner_steps
        self.taken = 0  # inner steps of this round so far
        self.pulled_version = 0
        #: The round's timing (DyLU): a perf_counter mark, and the computes since it.
        self._mark: float | None = None
        self._timed = 0

    def _clock(self, ctx) -> float:
        """Seconds now, once the device has done what was queued (a CUDA step runs ahead of
        the host otherwise): one synchronization per round, where a push would wait anyway."""
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)
        return time.perf_counter()

    @torch.no_grad()
    def step(self, ctx, model, optimizer):
        if self._mark is None:  # the first step: its compute began before any mark
            self._mark, self._timed = self._clock(ctx), 0
        else:
            self._timed += 1
        optimizer.step()
        self.taken += 1
        if self.taken < self.local_steps:
            return StepInfo(peers=0)
        message = self._push_message
        torch.sub(self.start, flat_params(model), out=message[:-PUSH_EXTRA])
        seconds = -1.0
        if self._timed:
            seconds = (self._clock(ctx) - self._mark) / ctx.dilation / self._timed
        message[-3], message[-2], message[-1] = PSEUDO_GRADIENT, seconds, self.local_steps
        ctx.comm.send(message, self.server, tag=PUSH_TAG)
        ctx.comm.recv(self._reply, src=self.server, tag=REPLY_TAG)
        outer = self._reply[:-REPLY_EXTRA]
        set_flat_params(model, outer)
        self.start.copy_(outer)
        version, next_steps = (int(v) for v in self._reply[-REPLY_EXTRA:].tolist())
        # Server updates between the reply this round started from and this one's update.
        staleness = version - 1 - self.pulled_version
        self.pulled_version = version
        used, self.local_steps, self.taken = self.local_steps, next_steps, 0
        self._mark, self._timed = time.perf_counter(), 0
        # wait_s 0, as ps-async's: the round trip is the server's queue, update and transfers,
        # which the "server" rule pins on the server.
        return StepInfo(wait_s=0.0, peers=ctx.workers - 1, staleness=float(staleness),
                        fields={"outer_step": version, "local_steps": used})

    def finish(self, ctx, model):
        self._push_message[-3] = DONE
        ctx.comm.send(self._push_message, self.server, tag=PUSH_TAG)
        return {"inner_steps_not_pushed": self.taken}

    @torch.no_grad()
    def serve(self, ctx, model, optimizer):
        n, config = ctx.workers, self.config
        message = torch.zeros_like(self._push_message)
        outer = self.start  # the common initial model, from setup
        state = OuterState()
        seconds_per_step: list[float | None] = [None] * n
        remaining = n
        while remaining:
            src = ctx.comm.recv(message, src=None, tag=PUSH_TAG)
            flag, seconds, _ = message[-PUSH_EXTRA:].tolist()
            if flag == DONE:
                remaining -= 1
                continue
            outer_step(outer, message[:-PUSH_EXTRA], state, config)
            if seconds > 0:
                seconds_per_step[src] = seconds
            self._reply[:-REPLY_EXTRA].copy_(outer)
            self._reply[-2] = state.updates
            self._reply[-1] = next_local_steps(config, seconds_per_step, src)
            ctx.comm.send(self._reply, dst=src, tag=REPLY_TAG)
            set_flat_params(model, outer)
            ctx.model_updated()  # after the reply: off its worker's path
        return {"outer_steps": state.updates}


# -- simulated protocol (bench sim): the same rules in simulated time ------------------------

class AsyncDiLoCoSim(Protocol):
    """Inner steps cost no communication: a step ends when its gradient is ready. A round's
    last step pushes its pseudo-gradient to the server, which takes pushes one at a time in
    arrival order as PSAsyncSim's server takes gradients (the CPU time of the receive and
    the reply, shared with the processes in a step), and the reply flies back: the step ends
    when it arrives. DyLU's H comes from the same function as the real server's, over the
    same measure of each worker's rounds in simulated time.

    Learning (learns_events): an inner step is the worker's optimizer step at its gradient's
    ready time; a push is applied when the server takes it (its last inner step, the
    pseudo-gradient against the outer model the worker started from, the outer step, and the
    worker taking the outer model), in the server's order. The outer model and its optimizer
    state are kept here; learner.server views the outer model, which the run scores."""

    servers = 1
    learns_events = True
    transport_ready = True

    def __init__(self, engine):
        super().__init__(engine)
        n, config = self.n, self.config
        self.push_bytes = self.model_bytes + 4 * PUSH_EXTRA
        self.reply_bytes = self.model_bytes + 4 * REPLY_EXTRA
        if self.transport is not None:  # the serving loop: one receive from any worker
            self.transport.post_receive(n, ANY, PUSH_TAG)
        self.server_free = 0.0
        #: The server's update count, and each worker's when it last took the outer model.
        self.version = 0
        self.pulled = [0] * n
        #: When each push scheduled so far is served (non-decreasing: FIFO).
        self._starts: deque[float] = deque()
        self.local_steps = [config.inner_steps] * n
        self.taken = [0] * n
        #: Each worker's round timing (its mark, computes since), and the server's latest
        #: seconds per inner step of each worker.
        self._mark: list[float | None] = [None] * n
        self._timed = [0] * n
        self.seconds_per_step: list[float | None] = [None] * n
        #: Learning: the outer model (flat), its optimizer state, and the outer model each
        #: worker's round started from.
        self._outer: torch.Tensor | None = None
        self._initial: torch.Tensor | None = None
        self._state = OuterState()
        self._started_from: dict[int, torch.Tensor] = {}

    def ready(self, w):
        engine = self.engine
        now = engine.now
        if engine.learner is not None and self._outer is None:
            self._start_learning(engine.learner)
        if self._mark[w] is None:
            self._mark[w], self._timed[w] = now, 0
        else:
            self._timed[w] += 1
        self.taken[w] += 1
        if self.taken[w] < self.local_steps[w]:
            if (learner := engine.learner) is not None:
                learner.worker_step(w, learner.gradient(w))
            engine.end_step(w, now, 0.0, peers=0)
            return
        # The round's measure travels with the push (its seconds per inner step).
        seconds = (now - self._mark[w]) / self._timed[w] if self._timed[w] else None
        if self.transport is not None:
            self.transport.request(w, self.n, self.push_bytes, (self._taken_fair, w, seconds),
                                   PUSH_TAG, REPLY_TAG)
            return
        net = self.net
        arrive = net.wire(w, self.n, self.push_bytes, now)
        starts = self._starts
        while starts and starts[0] <= arrive:
            starts.popleft()
        start = max(self.server_free, arrive)
        competing = max(engine.active - len(starts), 1)
        starts.append(start)
        self.server_free = start + 2 * net.cpu_s * net.share(competing)
        end = net.wire(self.n, w, self.reply_bytes, self.server_free)
        # Pushes are scheduled here in the order the server takes them (FIFO), so this is the
        # server's state when it takes this one: its update count, its workers' measures.
        staleness, used = self._update(w, seconds)
        self.taken[w], self._mark[w], self._timed[w] = 0, end, 0
        if engine.learner is not None:
            # At `start`: callbacks of one time run in the order scheduled, so in the server's.
            engine.at(start, self._take, w)
        engine.end_step(w, end, start - arrive, {"outer_step": self.version, "local_steps": used},
                        peers=self.n - 1, staleness=float(staleness))

    def _update(self, w: int, seconds: float | None) -> tuple[int, int]:
        """The server takes w's push: its update count, w's measure kept and its next H set;
        returns w's staleness and the H of the round it pushed."""
        self.version += 1
        staleness = self.version - 1 - self.pulled[w]
        self.pulled[w] = self.version
        if seconds is not None:
            self.seconds_per_step[w] = seconds
        used = self.local_steps[w]
        self.local_steps[w] = next_local_steps(self.config, self.seconds_per_step, w)
        return staleness, used

    def _taken_fair(self, w: int, seconds: float | None) -> None:
        """Under transport = "fair": the server's receive from any worker took w's push, which
        has arrived; it steps and replies (a blocking send), and only once the reply is out
        posts its next receive."""
        staleness, used = self._update(w, seconds)
        if self.engine.learner is not None:
            self._take(w)
        fields = {"outer_step": self.version, "local_steps": used}
        self.transport.reply(self.n, w, self.reply_bytes,
                             (self._reply_in, w, float(staleness), fields), REPLY_TAG,
                             sent=(self.transport.post_receive, self.n, ANY, PUSH_TAG))

    def _reply_in(self, w: int, staleness: float, fields: dict) -> None:
        """w's round ends with the server's reply; it waited for what its push and the reply
        would not have taken on idle links. Its next round's timing starts here."""
        engine = self.engine
        now = engine.now
        self.taken[w], self._mark[w], self._timed[w] = 0, now, 0
        wait = self.round_trip_wait(w, self.n, self.push_bytes, self.reply_bytes,
                                    engine.t_sync[w], now)
        engine.end_step(w, now, wait, fields, peers=self.n - 1, staleness=staleness)

    def _take(self, w: int) -> None:
        """The push's math when the server takes it: w's last inner step, its pseudo-gradient
        against the outer model it started from, the outer step, w taking the outer model.
        Nothing else touches w's model between its compute and its step's end."""
        learner = self.engine.learner
        learner.worker_step(w, learner.gradient(w))
        started = self._started_from.get(w, self._initial)
        outer_step(self._outer, started - learner.row(w), self._state, self.config)
        learner.set_row(w, self._outer)
        self._started_from[w] = self._outer.clone()

    def _start_learning(self, learner) -> None:
        """The outer model, made before any worker's model changes: every worker's initial
        model, which learner.server then views (the outer step updates it in place)."""
        self._outer = learner.row(0)
        self._initial = self._outer.clone()
        server, offset = {}, 0
        for name, p in learner.params.items():
            size = p[0].numel()
            server[name] = self._outer[offset:offset + size].view(p[0].shape)
            offset += size
        learner.server = server

    def stats(self):
        return {"outer_steps": self.version}
