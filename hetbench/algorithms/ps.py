"""Parameter Server: one server rank holds the model; workers push gradients and pull parameters.

The server is rank `workers` (workers keep ranks 0..workers-1). Messages are the flattened
gradient plus one trailing flag element (0 = gradient, 1 = this worker is done), so a single
point-to-point message carries both data and control.

- ps-sync: each round the server takes one gradient from every worker, applies their average and
  sends the new parameters back to all: every worker waits for the slowest, and all traffic
  crosses the server (the central bottleneck).
- ps-async: the server applies each gradient as it arrives (from any worker) and returns fresh
  parameters to that worker only; fast workers are never held back, but apply stale gradients.

Replies carry the server's update count after the parameters, so a worker knows how stale its
gradient was: the updates other workers made between its previous pull and its push.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch

from hetbench.core.algorithm import Algorithm, StepInfo
from hetbench.core.tensors import flat_grads, flat_params, set_flat_grads, set_flat_params
from hetbench.network.transport import ANY
from hetbench.sim.protocol import Protocol, Steps

GRAD_TAG = 1
PARAMS_TAG = 2
GRADIENT, DONE = 0.0, 1.0


class _ParameterServer(Algorithm):
    #: The model the algorithm produces is the server's: workers hold copies of it as they
    #: last pulled it (ps-async's differ from one another and from it).
    evaluated_model = "server"

    @classmethod
    def server_ranks(cls, config, workers):
        return 1

    def setup(self, ctx, model, optimizer):
        self.server = ctx.workers
        params = flat_params(model).to(ctx.device)
        # Every rank starts from the server's model (they are seeded alike; this makes it so).
        ctx.comm.broadcast_(params, src=self.server)
        set_flat_params(model, params)
        self._message = torch.zeros(params.numel() + 1, device=ctx.device)
        # The server's reply: parameters, then its update count (exact in float32 to 2^24).
        self._reply = torch.zeros(params.numel() + 1, device=ctx.device)
        self._pulled_version = 0

    def _push(self, ctx, model, flag: float) -> None:
        if flag == GRADIENT:
            self._message[:-1].copy_(flat_grads(model))
        self._message[-1] = flag
        ctx.comm.send(self._message, self.server, tag=GRAD_TAG)

    @torch.no_grad()
    def step(self, ctx, model, optimizer):
        self._push(ctx, model, GRADIENT)
        ctx.comm.recv(self._reply, src=self.server, tag=PARAMS_TAG)
        set_flat_params(model, self._reply[:-1])
        version = int(self._reply[-1].item())
        # Updates applied before this gradient that this worker had not pulled: 0 in sync mode.
        staleness = version - 1 - self._pulled_version
        self._pulled_version = version
        # wait_s 0, not Comm's blocked seconds: the round trip is mostly the server's queue,
        # update and transfers; the reports infer the wait for the other workers from their
        # arrivals (ps-sync) or pin the exchange on the server (ps-async).
        return StepInfo(wait_s=0.0, peers=ctx.workers - 1, staleness=float(staleness))

    def _reply_with(self, model, version: int) -> torch.Tensor:
        """The server's parameters and update count, as workers receive them."""
        self._reply[:-1].copy_(flat_params(model))
        self._reply[-1] = version
        return self._reply

    def finish(self, ctx, model):
        self._push(ctx, model, DONE)


class ParameterServerSync(_ParameterServer):
    name = "ps-sync"
    description = "parameter server, synchronous: average of all workers' gradients per step"
    wait_rule = "all"

    @classmethod
    def simulated_protocol(cls):
        return PSSyncSim

    @torch.no_grad()
    def serve(self, ctx, model, optimizer):
        n = ctx.workers
        inbox = [torch.zeros_like(self._message) for _ in range(n)]
        total = torch.zeros(self._message.numel() - 1, device=ctx.device)
        version = 0
        while True:
            pending = [ctx.comm.irecv(inbox[w], src=w, tag=GRAD_TAG) for w in range(n)]
            for work in pending:
                work.wait()
            done = [bool(m[-1] == DONE) for m in inbox]
            if all(done):
                return
            if any(done):
                raise RuntimeError("ps-sync: some workers stopped while others sent gradients")
            total.zero_()
            for m in inbox:
                total.add_(m[:-1])
            set_flat_grads(model, total.div_(n))
            optimizer.step()
            # One update per round, made of every worker's gradient of that round: fresh.
            version += 1
            reply = self._reply_with(model, version)
            sends = [ctx.comm.isend(reply, dst=w, tag=PARAMS_TAG) for w in range(n)]
            for work in sends:
                work.wait()
            ctx.model_updated()  # after the replies: off the workers' path


class ParameterServerAsync(_ParameterServer):
    name = "ps-async"
    description = "parameter server, asynchronous: each gradient applied on arrival"
    wait_rule = "server"

    @classmethod
    def simulated_protocol(cls):
        return PSAsyncSim
    synchronous = False

    @torch.no_grad()
    def serve(self, ctx, model, optimizer):
        remaining = ctx.workers
        message = torch.zeros_like(self._message)
        version = 0
        while remaining:
            src = ctx.comm.recv(message, src=None, tag=GRAD_TAG)
            if message[-1] == DONE:
                remaining -= 1
                continue
            set_flat_grads(model, message[:-1])
            optimizer.step()
            version += 1
            ctx.comm.send(self._reply_with(model, version), dst=src, tag=PARAMS_TAG)
            ctx.model_updated()  # after the reply: off its worker's path


# -- simulated protocol (bench sim): the same rules in simulated time ------------------------

class PSSyncSim(Protocol):
    """Gradients reach the server in arrival order; parameters go back one by one.

    Each message flies one hop (alpha + its sender's CPU time) plus bytes/beta on the server's
    link. The server handles one message at a time: its process spends the CPU time of every
    receive and then of every send in turn (as PSAsyncSim's server does), so a step costs it
    2n messages of CPU whatever the network; only the flights overlap.
    """

    servers = 1
    transport_ready = True

    def __init__(self, engine):
        super().__init__(engine)
        beta = self.net.beta_bytes_per_s
        # A gradient message carries one flag element more than the model.
        self.push = (self.model_bytes + 4) / beta
        self.pull = self.model_bytes / beta
        self.arrived: list[int] = []
        if self.transport is not None:  # the server's first round of receives, at the start
            self._pushed = self._replies_out = 0
            for w in range(self.n):
                self.transport.post_receive(self.n, w, GRAD_TAG)

    def ready(self, w):
        if self.transport is not None:
            self._push(w)
            return
        self.arrived.append(w)
        if len(self.arrived) < self.n:
            return
        arrived, self.arrived = self.arrived, []
        if self.net.cluster is not None:
            self._ready_on_cluster(arrived)
            return
        engine = self.engine
        steps = self._round(np.array(engine.t_sync), self.net.hop(engine.active))
        for x in range(self.n):  # the server sends to workers 0..n-1
            engine.end_step(x, float(steps.t_end[x]), float(steps.wait_s[x]), peers=self.n - 1,
                            staleness=0.0)

    lockstep = True

    def learn(self, k, learner):
        """The real step's math: the server averages every worker's gradient, takes its
        optimizer step, and every worker takes the server's model (equal to all workers taking
        the step with the mean gradient: they start alike)."""
        learner.sgd_step(learner.mean_over_workers(learner.gradients()))
        # The server's model, which the run scores, is the one every worker took: row 0's.
        learner.server = {name: p[0] for name, p in learner.params.items()}

    def step_all(self, k, t_sync, full):
        return self._round(t_sync, self.net.hop(self.n + self.servers))

    def _round(self, t_sync: np.ndarray, hop: float) -> Steps:
        """One round without a cluster, the event path's and the lockstep path's: every
        worker's gradient flies to the server (`t_sync`: when each was ready); the server
        receives them one after another in arrival order, then sends the parameters to
        workers 0..n-1 in turn. A worker's wait is its step beyond its own push and pull."""
        cpu = self.net.cpu_s
        arrivals = (t_sync + hop) + self.push
        if cpu == 0.0:
            free = float(arrivals.max())
        else:
            free = 0.0
            for arrive in np.sort(arrivals).tolist():
                free = max(free, arrive) + cpu
        end = free + np.arange(1, self.n + 1) * (cpu + self.pull) + hop
        own = 2 * (hop + cpu) + self.push + self.pull
        return Steps(end, end - t_sync - own, self.n - 1)

    # -- under transport = "fair": the real loop's posts and sends, message by message -------
    def _push(self, w: int) -> None:
        """The worker's blocking send of its gradient; once it is out, its receive of the
        parameters (serve(): the server posts a receive from every worker at a round's
        start)."""
        self.transport.request(w, self.n, self.model_bytes + 4, (self._gradient_in,), GRAD_TAG,
                               PARAMS_TAG)

    def _gradient_in(self) -> None:
        """A gradient has arrived; with the round's last one the server sends the parameters
        to every worker at once (isend to each, then waits for them all)."""
        self._pushed += 1
        if self._pushed < self.n:
            return
        self._pushed = 0
        for x in range(self.n):
            self.transport.reply(self.n, x, self.model_bytes, (self._parameters_in, x),
                                 PARAMS_TAG, sent=(self._reply_out,))

    def _reply_out(self) -> None:
        """Once every reply is out, the server posts the next round's receives."""
        self._replies_out += 1
        if self._replies_out == self.n:
            self._replies_out = 0
            for w in range(self.n):
                self.transport.post_receive(self.n, w, GRAD_TAG)

    def _parameters_in(self, w: int) -> None:
        now = self.engine.now
        wait = self.round_trip_wait(w, self.n, self.model_bytes + 4, self.model_bytes,
                                    self.engine.t_sync[w], now)
        self.engine.end_step(w, now, wait, peers=self.n - 1, staleness=0.0)

    def _ready_on_cluster(self, arrived: list[int]) -> None:
        """The same step on a run's Cluster: every push queues at the server's NIC, every pull
        at its NIC's sending side; the wait is what the step took beyond the worker's own
        push and pull on idle links."""
        net, server, t_sync = self.net, self.n, self.engine.t_sync
        pushed = max(net.wire(x, server, self.model_bytes + 4, t_sync[x]) for x in arrived)
        for x in range(self.n):  # the server sends to workers 0..n-1
            end = net.wire(server, x, self.model_bytes, pushed)
            wait = self.round_trip_wait(x, server, self.model_bytes + 4, self.model_bytes,
                                        t_sync[x], end)
            self.engine.end_step(x, end, wait, peers=self.n - 1, staleness=0.0)


class PSAsyncSim(Protocol):
    """The server takes one gradient at a time, in arrival order, and answers its sender.

    A request flies for alpha + bytes/beta, waits for the server, occupies it for the CPU time
    of its two messages (receive and reply), and the reply flies back. Only the CPU time is
    the server's: flights of different workers overlap (charging whole messages to the server
    predicts well below what 16 real workers reach).
    CPU sharing: workers queued at the server are blocked in their receive and leave the cores
    to the others, so the CPU time is shared among the processes in a step less those still
    waiting for the server.
    """

    servers = 1
    transport_ready = True

    def __init__(self, engine):
        super().__init__(engine)
        if self.transport is not None:  # serve(): one receive from any worker at a time
            self.transport.post_receive(self.n, ANY, GRAD_TAG)
        self.server_free = 0.0
        #: The server's update count, and each worker's when it last pulled (staleness).
        self.version = 0
        self.pulled = [0] * self.n
        #: When each request scheduled so far is served (non-decreasing: FIFO).
        self._starts: deque[float] = deque()
        #: Following a recorded order (Engine.recorded_order): the requests that arrived
        #: before their turn (worker -> arrival), and how many of the order were taken.
        self._waiting: dict[int, float] = {}
        self._taken = 0

    @classmethod
    def recorded_order(cls, logs, done):
        """The workers in the order the real server took their gradients: a reply carries the
        server's update count, so step k of worker w was update v(w, k) = v(w, k - 1) + 1 +
        its staleness (the updates other workers made since w's previous pull)."""
        taken = []
        for w, steps in logs.items():
            version = 0
            for step in steps:
                version += 1 + int(step["staleness"])
                taken.append((version, w))
        taken.sort()
        if [version for version, _ in taken] != list(range(1, len(taken) + 1)):
            raise ValueError("its steps' staleness do not number the server's updates 1..N")
        return [w for _, w in taken]

    def ready(self, w):
        if self.transport is not None:
            self.transport.request(w, self.n, self.model_bytes + 4, (self._taken_fair, w),
                                   GRAD_TAG, PARAMS_TAG)
            return
        arrive = self.net.wire(w, self.n, self.model_bytes + 4, self.engine.now)
        if self.engine.recorded_order is None:
            self._serve(w, arrive)
            return
        # Following a real run's order: a request waits until the server took it there (the
        # next one in the order always comes: its worker's previous request was taken before).
        self._waiting[w] = arrive
        order, now = self.engine.recorded_order, self.engine.now
        while self._taken < len(order) and order[self._taken] in self._waiting:
            x = order[self._taken]
            self._taken += 1
            self._serve(x, max(self._waiting.pop(x), now))

    def _serve(self, w: int, arrive: float) -> None:
        net = self.net
        starts = self._starts
        while starts and starts[0] <= arrive:
            starts.popleft()
        start = max(self.server_free, arrive)
        competing = max(self.engine.active - len(starts), 1)
        starts.append(start)
        self.server_free = start + 2 * net.cpu_s * net.share(competing)
        end = net.wire(self.n, w, self.model_bytes, self.server_free)
        # Requests are scheduled here in the order the server takes them (FIFO), so this is
        # the update count the reply carries, as the real server's does.
        staleness = self._update(w)
        if self.engine.learner is not None:
            # The real server's math when it takes the gradient (`start`: requests are
            # scheduled FIFO, and callbacks of one time run in the order scheduled, so in the
            # order it takes them). Not now, at the request's arrival: w's gradient is then
            # needed only once the workers queued ahead of it are served, by which time every
            # worker that began computing meanwhile is pending too, and their gradients are
            # computed in one batch (a server-bound run's queue is every worker: one batch
            # of about n, where taking each at its arrival made batches of the ~3 workers
            # that began since the previous one, 1,000 times more of them at 1,024 workers).
            self.engine.at(start, self._take, w)
        self.engine.end_step(w, end, start - arrive, peers=self.n - 1, staleness=float(staleness))

    def _update(self, w: int) -> int:
        """The server takes w's gradient: its update count, and w's staleness (the updates
        other workers made since w last pulled)."""
        self.version += 1
        staleness = self.version - 1 - self.pulled[w]
        self.pulled[w] = self.version
        return staleness

    def _taken_fair(self, w: int) -> None:
        """Under transport = "fair": the server's receive from any worker took w's gradient,
        which has arrived; it steps and sends w the parameters (a blocking send), and only
        once they are out posts its next receive."""
        staleness = self._update(w)
        if self.engine.learner is not None:
            self._take(w)
        self.transport.reply(self.n, w, self.model_bytes,
                             (self._parameters_in, w, float(staleness)), PARAMS_TAG,
                             sent=(self.transport.post_receive, self.n, ANY, GRAD_TAG))

    def _parameters_in(self, w: int, staleness: float) -> None:
        """w's step ends with the server's reply; it waited for what its push and pull would
        not have taken on idle links."""
        now = self.engine.now
        wait = self.round_trip_wait(w, self.n, self.model_bytes + 4, self.model_bytes,
                                    self.engine.t_sync[w], now)
        self.engine.end_step(w, now, wait, peers=self.n - 1, staleness=staleness)

    def _take(self, w: int) -> None:
        """The server's optimizer step with w's gradient, then w takes the server's model (the
        reply). Nothing else touches w's model between its compute and its step's end."""
        learner = self.engine.learner
        learner.server_step(learner.gradient(w))
        learner.take_server(w)

    learns_events = True
