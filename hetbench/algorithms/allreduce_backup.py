"""Synchronous SGD with backup workers (Chen, Pan, Monga, Bengio, Jozefowicz, "Revisiting
Distributed Synchronous SGD", 2016).

Each step aggregates the first n - b gradients to arrive and drops the other b: All-Reduce's
synchronous average, minus the b slowest workers, so that a straggler no longer holds everyone
back. The paper runs it through parameter servers, and so does this module: an aggregator rank
(rank n, after the workers) takes gradients in arrival order. Its loop, for the open step v:

- a gradient computed on version v joins the step while it has fewer than n - b; the (n - b)-th
  closes it: the aggregator applies their mean with the workload's optimizer (version v + 1)
  and sends the new parameters to exactly those n - b workers;
- a gradient computed on an older version arrives after its step closed: it is dropped, and its
  worker gets the current parameters at once and computes its next gradient on them.

Every worker therefore restarts from the newest model as soon as its gradient is in, or at once
when it was late; nobody waits for the b slowest. A dropped step is on record
(`dropped: true`, samples_discarded in the event, `gradients_dropped` in the summary), and its
samples count toward no throughput (StepInfo.discarded): no model learned from them. With
b = 0 every step averages all n gradients (ps-sync's rule).

When workers stop, a step that the remaining workers can no longer fill is not applied: its
gradients are dropped too, so every update is the mean of exactly n - b gradients.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from hetbench.core.algorithm import Algorithm, StepInfo
from hetbench.core.options import opt
from hetbench.core.tensors import flat_grads, flat_params, set_flat_grads, set_flat_params
from hetbench.errors import UserError
from hetbench.network.transport import ANY
from hetbench.sim.protocol import Protocol

GRAD_TAG = 41
PARAMS_TAG = 42
GRADIENT, DONE = 0.0, 1.0


@dataclass(frozen=True, kw_only=True)
class BackupOptions:
    backup_workers: int = opt(1, "b: each step averages the first n - b gradients to arrive and "
                                 "drops the other b (Chen et al. 2016)")


class AllReduceBackup(Algorithm):
    name = "allreduce-backup"
    description = ("synchronous SGD with b backup workers: each step averages the first n - b "
                   "gradients to arrive, through an aggregator rank (Chen et al. 2016)")
    Config = BackupOptions
    wait_rule = "quorum"
    #: Workers do not advance in lock step: the b slowest fall behind by design, and a worker
    #: may end its budget long after the others (a per-iteration budget agreement, or an
    #: evaluation that starts without it, would hold everyone to the slowest again).
    synchronous = False

    @classmethod
    def server_ranks(cls, config, workers):
        return 1

    @classmethod
    def simulated_protocol(cls):
        return AllReduceBackupSim

    @classmethod
    def validate(cls, config, workers):
        if not 0 <= config.backup_workers < workers:
            raise UserError(f"allreduce-backup: backup_workers must be in 0..{workers - 1} "
                            f"with {workers} workers, got {config.backup_workers}")

    fact_units = {"updates": "server updates"}

    @classmethod
    def summary_facts(cls, config, events, done):
        # gradients_dropped is every summary's (the events' samples_discarded).
        aggregator = done[-1] if done else None
        return {"updates": aggregator.get("updates") if aggregator else None}

    def setup(self, ctx, model, optimizer):
        self.server = ctx.workers
        self.quorum = ctx.workers - self.config.backup_workers
        params = flat_params(model).to(ctx.device)
        ctx.comm.broadcast_(params, src=self.server)  # everyone starts from one model
        set_flat_params(model, params)
        n = params.numel()
        #: gradient, then a flag (GRADIENT / DONE) and the version it was computed on.
        self._message = torch.zeros(n + 2, device=ctx.device)
        #: parameters, then their version, whether the gradient was used, and how many
        #: gradients the newest update averaged.
        self._reply = torch.zeros(n + 3, device=ctx.device)
        self._version = 0

    @torch.no_grad()
    def step(self, ctx, model, optimizer):
        self._message[:-2].copy_(flat_grads(model))
        self._message[-2] = GRADIENT
        self._message[-1] = self._version
        ctx.comm.send(self._message, self.server, tag=GRAD_TAG)
        ctx.comm.recv(self._reply, src=self.server, tag=PARAMS_TAG)
        set_flat_params(model, self._reply[:-3])
        version, used, averaged = (int(v) for v in self._reply[-3:].tolist())
        # Updates this worker's model took in that its gradient was not part of.
        staleness = version - self._version - (1 if used else 0)
        self._version = version
        # wait_s 0, not Comm's blocked seconds: the reports infer the wait for the last
        # gradient of the update from the workers' arrivals (the rest is the aggregator's).
        return StepInfo(wait_s=0.0, peers=averaged - 1 if used else averaged,
                        staleness=float(staleness),
                        discarded=not used, fields={"dropped": not used, "version": version})

    def finish(self, ctx, model):
        self._message[-2] = DONE
        ctx.comm.send(self._message, self.server, tag=GRAD_TAG)

    # -- the aggregator rank -------------------------------------------------------------------
    @torch.no_grad()
    def serve(self, ctx, model, optimizer):
        message = torch.zeros_like(self._message)
        total = torch.zeros(message.numel() - 2, device=ctx.device)
        version, live = 0, ctx.workers
        joined: list[int] = []  # the open step's workers, in arrival order
        steps: list[list[int]] = []  # every update's workers, in arrival order
        dropped = 0
        while live:
            src = ctx.comm.recv(message, src=None, tag=GRAD_TAG)
            if message[-2] == DONE:
                live -= 1
                if joined and live < self.quorum:
                    # The workers left can no longer fill the open step: drop its gradients.
                    for w in joined:
                        self._answer(ctx, model, w, version, used=False, averaged=0)
                    dropped += len(joined)
                    joined, total = [], total.zero_()
                continue
            if int(message[-1]) != version or live < self.quorum:
                # Computed on a model its step already replaced, or too few workers are left
                # to fill a step: dropped, and its worker gets the current model at once.
                dropped += 1
                self._answer(ctx, model, src, version, used=False,
                             averaged=self.quorum if version else 0)
                continue
            total.add_(message[:-2])
            joined.append(src)
            if len(joined) < self.quorum:
                continue
            set_flat_grads(model, total.div_(self.quorum))
            optimizer.step()
            version += 1
            steps.append(joined)
            for w in joined:
                self._answer(ctx, model, w, version, used=True, averaged=self.quorum)
            joined, total = [], total.zero_()
        return {"updates": version, "gradients_dropped": dropped, "update_workers": steps}

    def _answer(self, ctx, model, worker: int, version: int, used: bool, averaged: int) -> None:
        self._reply[:-3].copy_(flat_params(model))
        self._reply[-3:] = torch.tensor([version, float(used), averaged])
        ctx.comm.send(self._reply, dst=worker, tag=PARAMS_TAG)


# -- simulated protocol (bench sim): the same rules in simulated time ------------------------

class AllReduceBackupSim(Protocol):
    """Gradients reach the aggregator in arrival order; the (n - b)-th closes the step.

    Each message flies one hop (alpha + its sender's CPU time) plus its bytes over the link,
    and the aggregator handles one at a time (its CPU time per receive and per reply), as
    PSSyncSim charges a parameter server. The workers of a closed step get the new model one
    reply after another; a late gradient is answered on arrival with the current model.
    """

    servers = 1
    transport_ready = True

    def __init__(self, engine):
        super().__init__(engine)
        if self.transport is not None:  # serve(): one receive from any worker at a time
            #: Replies the aggregator is to send, one blocking send after another.
            self._outbox: deque[tuple[int, bool, dict]] = deque()
            self._sending = False
            #: Inside transport.reply (whose send may return at once), and whether it did.
            self._replying = self._returned = False
            self._receive_posted = True
            self.transport.post_receive(self.n, ANY, GRAD_TAG)
        beta = self.net.beta_bytes_per_s
        self.push = (self.model_bytes + 8) / beta
        self.pull = (self.model_bytes + 12) / beta
        self.quorum = self.n - self.config.backup_workers
        self.version = 0
        self.pulled = [0] * self.n
        self.joined: list[int] = []
        self.server_free = 0.0
        self.live = self.n
        #: Following a recorded order: the requests that arrived before their turn, and how
        #: many of the order were taken.
        self._waiting: set[int] = set()
        self._taken = 0

    def ready(self, w):
        if self.transport is not None:  # a blocking send, then the receive of the reply
            self.transport.request(w, self.n, self.model_bytes + 8, (self._taken_fair, w),
                                   GRAD_TAG, PARAMS_TAG)
            return
        net = self.net
        hop, cpu = net.hop(self.engine.active), net.cpu_s
        if net.cluster is None:
            arrive = self.engine.now + hop + self.push
        else:  # over w's links, queued at the aggregator's NIC
            arrive = net.wire(w, self.n, self.model_bytes + 8, self.engine.now)
        # Events run in time order and (without a Cluster) every push flies as long: arrivals
        # keep that order.
        self.server_free = max(self.server_free, arrive) + cpu
        if (order := self.engine.recorded_order) is not None:
            self._follow(w, order)
            return
        self._take(w)

    def _take(self, w: int) -> None:
        """The aggregator takes w's gradient: dropped if computed on a replaced model or too
        few workers are left to fill a step, else it joins the open step."""
        if self.pulled[w] != self.version or self.live < self.quorum:
            self._drop(w)
            return
        self._join(w)

    @classmethod
    def recorded_order(cls, logs, done):
        """(worker, joined) in an order of the real aggregator's: update u's gradients after
        the drops at version u - 1 (a dropped step logs the version it got, a used one the
        update it made), so every worker's gradient meets the model it met in the real run.
        Within an update the order of its sum is not logged (here: by iteration, then rank)."""
        keyed = []
        for w, steps in logs.items():
            for k, step in enumerate(steps):
                joined = not step["dropped"]
                version = int(step["version"])
                keyed.append(((version, 1) if joined else (version + 1, 0), k, w, joined))
        keyed.sort()
        return [(w, joined) for _, _, w, joined in keyed]

    def _follow(self, w: int, order: list) -> None:
        """Take requests in the real run's order, each as it was there (joined or dropped),
        whatever the live count here (the real aggregator learned of finishes later)."""
        self._waiting.add(w)
        while self._taken < len(order) and order[self._taken][0] in self._waiting:
            x, joined = order[self._taken]
            self._taken += 1
            self._waiting.discard(x)
            if joined:
                self._join(x)
            else:
                self._drop(x)

    def _join(self, w: int) -> None:
        self.joined.append(w)
        if len(self.joined) < self.quorum:
            return
        self.version += 1
        if (learner := self.engine.learner) is not None:
            # The aggregator's step with the mean of the quorum's gradients (in arrival order,
            # as it sums them), then each of them takes the new model (its reply).
            learner.server_step(learner.mean_of([learner.gradient(x) for x in self.joined]))
            for x in self.joined:
                learner.take_server(x)
        for x in self.joined:
            staleness = self.version - self.pulled[x] - 1
            self.pulled[x] = self.version
            self._answer(x, True, peers=self.quorum - 1, staleness=float(staleness),
                         fields={"dropped": False, "version": self.version})
        self.joined = []

    def stats(self):
        return {"updates": self.version}

    learns_events = True

    def _drop(self, w):
        """w's gradient is dropped: the aggregator answers at once with the current model."""
        if (learner := self.engine.learner) is not None:
            learner.gradient(w)  # computed, and thrown away
            learner.take_server(w)
        staleness = self.version - self.pulled[w]
        self.pulled[w] = self.version
        self._answer(w, False, peers=self.quorum if self.version else 0,
                     staleness=float(staleness), discarded=True,
                     fields={"dropped": True, "version": self.version})

    def _answer(self, x: int, used: bool, **step) -> None:
        """The aggregator's reply to x ends x's step (end_step's keywords `step`); a used
        gradient's step waited for what its push and pull would not have taken alone."""
        if self.transport is not None:
            self._outbox.append((x, used, step))
            return
        end, own = self._reply_to(x)
        self.engine.end_step(x, end, end - self.engine.t_sync[x] - own if used else 0.0, **step)

    def _reply_to(self, x: int) -> tuple[float, float]:
        """The aggregator's next reply, to x: when x has it, and what x's push and pull take
        on idle links (the rest of its step is waiting)."""
        net = self.net
        if net.cluster is None:
            hop, cpu = net.hop(self.engine.active), net.cpu_s
            self.server_free += cpu + self.pull
            return self.server_free + hop, 2 * (hop + cpu) + self.push + self.pull
        # Replies leave one after another through the aggregator's NIC (the ledger queues them).
        end = net.wire(self.n, x, self.model_bytes + 12, self.server_free)
        self.server_free = end - net.cluster.link(self.n, x)[0]  # its bytes are out
        return end, net.round_trip_alone(x, self.n, self.model_bytes + 8, self.model_bytes + 12)

    def finish(self, w, t):
        self.live -= 1
        if self.live < self.quorum and self.engine.recorded_order is None:
            joined, self.joined = self.joined, []
            for x in joined:
                self._drop(x)
            if self.transport is not None and not self._sending:
                self._send_next()
        self.engine.done(w)

    # -- under transport = "fair": serve()'s receives and blocking sends, message by message --
    def _taken_fair(self, w: int) -> None:
        """The aggregator's receive from any worker took w's gradient; it answers every reply
        the gradient decided, one blocking send after another, then posts its next receive."""
        self._receive_posted = False
        self._take(w)
        if not self._sending:
            self._send_next()

    def _send_next(self) -> None:
        """The aggregator's next reply, sent now; the one after it is sent when this one's
        send returns (here, in this loop, for a send that returned at once: a quorum of
        replies that fit in the socket buffer would otherwise nest a call each). With none
        left, its next receive."""
        outbox = self._outbox
        while outbox:
            x, used, step = outbox.popleft()
            self._sending, self._replying, self._returned = True, True, False
            self.transport.reply(self.n, x, self.model_bytes + 12, (self._reply_in, x, used, step),
                                 PARAMS_TAG, sent=(self._sent,))
            self._replying = False
            if not self._returned:
                return
        self._sending = False
        if not self._receive_posted:
            self._receive_posted = True
            self.transport.post_receive(self.n, ANY, GRAD_TAG)

    def _sent(self) -> None:
        """A reply's send returned: the next one."""
        if self._replying:  # inside reply(): _send_next's loop goes on
            self._returned = True
        else:
            self._send_next()

    def _reply_in(self, x: int, used: bool, step: dict) -> None:
        now = self.engine.now
        wait = (self.round_trip_wait(x, self.n, self.model_bytes + 8, self.model_bytes + 12,
                                     self.engine.t_sync[x], now) if used else 0.0)
        self.engine.end_step(x, now, wait, **step)
