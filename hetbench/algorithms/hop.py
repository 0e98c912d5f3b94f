"""Hop: heterogeneity-aware decentralized training (Luo et al., ASPLOS 2019).

One module on purpose, as every algorithm's: its queue rules, the real step that applies them
to messages, and the simulated protocol that applies them to simulated time, side by side.

D-PSGD's update (x_i <- sum_j W_ij x_j - lr g_i) with queue-based synchronization instead of
lock step. Every message between neighbours is one tensor, a small header then a model:

    [kind, lo, hi, entered, x...]

kind UPDATE: x is the sender's model of iteration lo = hi. kind SKIP: the sender jumped its
counter; x (its model after the jump) stands in for each iteration lo..hi it skipped. kind DONE:
the sender finished; it sends nothing more. `entered` is the iteration the sender has reached.

A receiver thread per in-edge turns incoming messages into that edge's update queue (and the
neighbour's newest `entered`); the main thread only reads those queues. A thread per edge, not
one receiving from any sender: one posted receive at a time moved the neighbours' models one
after the other, where D-PSGD's receives (posted together) move them at once (issue 44):

- update queues: at iteration k a worker uses, from each neighbour, the newest queued model that
  stands for an iteration in [k - staleness, k], and waits until it has such a model from all but
  `backup_workers` of its neighbours; models arriving later are dropped unused (a neighbour with
  no usable model leaves its mixing weight to the worker itself). Models of later iterations stay
  queued for later.
- token queues: the right to start iteration k costs one token per neighbour j, and j returns
  one each iteration it enters; with `max_iteration_gap` tokens seeded per edge that is "start k
  only once every neighbour has entered k - max_iteration_gap", which is how it is implemented:
  from the `entered` each message carries. No worker is ever more than that many iterations ahead
  of a neighbour, so queues stay short.
- skipping: a worker that finds a neighbour more than `skip_threshold` iterations ahead jumps its
  counter forward (never more than the gap bound allows), adopts the mix of its neighbours' newest
  models, and sends a SKIP message that returns the tokens it owed and covers the iterations it
  skipped for neighbours that wait on it.

Termination: a finished worker sends DONE to its neighbours, which from then on neither wait for
its updates nor for its tokens; an edge's receiver thread ends after its neighbour's DONE, so every
message sent has been received and no sender is left blocked. Hop with backup_workers = 0,
staleness = 0 and skip off uses exactly D-PSGD's models in D-PSGD's order: the same numbers.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from queue import SimpleQueue

import torch

from hetbench.algorithms import topologies
from hetbench.algorithms.dpsgd import GossipOptions, gossip_graph, mix
from hetbench.comm.clock import now_ns
from hetbench.comm.comm import CommMisuse
from hetbench.core.algorithm import Algorithm, StepInfo
from hetbench.core.options import opt
from hetbench.core.tensors import flat_params, set_flat_params
from hetbench.errors import UserError
from hetbench.sim.protocol import Protocol

UPDATE, SKIP, DONE = 0, 1, 2
#: Header length: kind, lo, hi, entered. Iterations ride in the model's dtype (float32 holds
#: integers exactly up to 2**24, far beyond any run's iteration count).
HEADER = 4
TAG = 41


@dataclass(frozen=True, kw_only=True)
class HopOptions(GossipOptions):
    # The defaults are the heterogeneity-aware protocol; backup_workers = 0 and skip = false
    # (staleness 0) make it D-PSGD, number for number.
    backup_workers: int = opt(1, "neighbour updates not waited for each iteration (b)")
    staleness: int = opt(0, "accept a neighbour's newest update from iteration >= k - staleness")
    max_iteration_gap: int = opt(4, "tokens per edge: most iterations ahead of any neighbour")
    skip: bool = opt(True, "a worker far behind its neighbours jumps its iteration forward")
    skip_threshold: int = opt(2, "skip when a neighbour is more than this many iterations ahead")

    def __post_init__(self):
        for name in ("backup_workers", "staleness"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.max_iteration_gap < 1:
            raise ValueError(f"max_iteration_gap must be >= 1, got {self.max_iteration_gap}")
        if self.skip and not 0 <= self.skip_threshold < self.max_iteration_gap:
            # A neighbour is never more than max_iteration_gap ahead, so a larger threshold
            # would never fire.
            raise ValueError(f"skip_threshold must be in [0, max_iteration_gap = "
                             f"{self.max_iteration_gap}), got {self.skip_threshold}")


@dataclass(slots=True)
class Entry:
    """A queued model from one neighbour, standing for its iterations lo..hi (the simulator
    queues entries without a model: a million or more of them at 16,384 workers, hence slots)."""

    lo: int
    hi: int
    model: torch.Tensor | None = None


# -- the decision rules: pure functions of one worker's queue state ----------------------------
# Shared with the simulated protocol (HopSim, below), so a simulated Hop decides exactly as
# a real one. `queues` maps a neighbour to its entries, oldest first; `entered` maps a neighbour
# to the newest iteration it said it entered; `done` holds neighbours that finished.

def newest_usable(queue, k: int, staleness: int) -> Entry | None:
    """A neighbour's newest queued model standing for an iteration in [k - staleness, k]."""
    for entry in reversed(queue):
        if entry.lo <= k and entry.hi >= k - staleness:
            return entry
    return None


def updates_ready(queues: dict, done: set, k: int, backup_workers: int, staleness: int) -> bool:
    """Iteration k may mix: usable models from all but `backup_workers` neighbours."""
    needed = len(queues) - backup_workers
    usable = possible = 0
    for j, q in queues.items():
        if newest_usable(q, k, staleness) is not None:
            usable += 1
            if usable >= needed:  # enough whatever the rest hold (possible >= usable)
                return True
            possible += 1
        elif j not in done:  # one that finished sends nothing more: never wait for it
            possible += 1
    return usable >= min(needed, possible)


def tokens_ready(entered: dict, done: set, k: int, max_iteration_gap: int) -> bool:
    """Iteration k may start: every neighbour still running has entered k - gap."""
    return all(e >= k - max_iteration_gap for j, e in entered.items() if j not in done)


def skip_target(entered: dict, done: set, k: int, skip_threshold: int,
                max_iteration_gap: int) -> int | None:
    """The iteration to jump to from k, or None to carry on normally."""
    # As far as the furthest neighbour (finished ones count: a worker left alone at the end
    # of an iteration budget catches up with them), but never past what the tokens of the
    # slowest neighbour still running allow.
    furthest = max(entered.values())
    if furthest - k <= skip_threshold:
        return None
    live = [e for j, e in entered.items() if j not in done]
    target = min([furthest] + [e + max_iteration_gap for e in live])
    return target if target > k + 1 else None


def drop_before(queues: dict, k: int, staleness: int) -> None:
    """Forget queued models that no iteration from k on can use."""
    for queue in queues.values():
        while queue and queue[0].hi < k - staleness:
            queue.popleft()


def mix_used(own, row, rank: int, neighbours, models: dict):
    """`own` mixed with the neighbours' models the step uses (`models` by neighbour), weights
    from the mixing matrix's `row`: a neighbour whose update is not used leaves its weight with
    the worker itself, so every row of the effective mixing matrix still sums to 1."""
    self_weight = row[rank]
    for j in neighbours:
        if j not in models:
            self_weight += row[j]
    return mix(own, self_weight, [(row[j], models[j]) for j in neighbours if j in models])


def mean_staleness(k: int, used_iterations) -> float | None:
    """How many iterations the updates used were from k, on average (behind it, or ahead of
    it when the worker skips to its neighbours' models); None when it used none."""
    used_iterations = list(used_iterations)
    if not used_iterations:
        return None
    return sum(abs(k - it) for it in used_iterations) / len(used_iterations)


class Hop(Algorithm):
    name = "hop"
    description = ("Hop: decentralized, queue-based sync with backup workers, bounded staleness "
                   "and iteration skipping")
    Config = HopOptions
    wait_rule = "named"  # its receiver notes whose message ended each wait

    @classmethod
    def simulated_protocol(cls):
        return HopSim
    synchronous = False

    @classmethod
    def validate(cls, config, workers):
        graph = gossip_graph(config, workers)
        degree = min(topologies.degrees(graph))
        if config.backup_workers >= degree:
            raise UserError(
                f"algorithm hop: backup_workers ({config.backup_workers}) must be below the "
                f"in-degree ({degree}) of topology {config.topology} with {workers} workers; "
                f"set [algorithm.hop] backup_workers = {degree - 1}")

    def setup(self, ctx, model, optimizer):
        if ctx.comm.backend == "nccl":
            # Its receiver threads, one per edge, receive at once on one channel: gloo's
            # pairs take that, NCCL's communicators are not to be used from several threads.
            raise CommMisuse("hop receives from its neighbours on several threads at once, "
                             "which NCCL does not allow; it needs gloo: run it with device = "
                             "\"cpu\", or with its ranks sharing a GPU (gloo on CUDA tensors)")
        graph = gossip_graph(self.config, ctx.workers)
        self.neighbours = graph[ctx.rank]
        self.weights = topologies.mixing_weights(graph, self.config.weights)[ctx.rank]
        self.iteration = 0
        self._timeout_s = ctx.comm.timeout.total_seconds()
        self._numel = flat_params(model).numel()
        self._dtype = flat_params(model).dtype
        self._comm = ctx.comm
        self._channel = ctx.comm.channel("hop")
        self._cond = threading.Condition()
        self._queues: dict[int, deque[Entry]] = {j: deque() for j in self.neighbours}
        # Everyone starts at iteration 0 at the common start.
        self._entered = dict.fromkeys(self.neighbours, 0)
        self._done: set[int] = set()
        self._finished = False
        self._error: BaseException | None = None
        # The condition the main thread waits on, and the sender of the message that made it
        # true: the receiver checks it after every message, so the attribution of each wait
        # is exact (who waited for whom), not guessed from who happened to arrive last.
        self._awaited = None
        self._ended_by: int | None = None
        #: Sends posted and not yet waited, in order (None: no more), for the waiting thread.
        self._posted: SimpleQueue = SimpleQueue()
        self._waiter = threading.Thread(target=self._wait_sends, name="hop-sends", daemon=True)
        self._waiter.start()
        self._receivers = [threading.Thread(target=self._receive, args=(j,),
                                            name=f"hop-receiver-{j}", daemon=True)
                           for j in self.neighbours]
        for receiver in self._receivers:
            receiver.start()

    # -- the receiver threads ----------------------------------------------------------------
    def _receive(self, j: int) -> None:
        """Neighbour j's messages, in order, until its DONE."""
        try:
            while True:
                message = torch.empty(HEADER + self._numel, dtype=self._dtype,
                                      device=self._comm.device)
                # The header is read from host memory: on a shared GPU, reading it off the
                # device would wait for this rank's queued compute before the next receive.
                _, header = self._comm.recv_head_on(self._channel, message, HEADER, src=j,
                                                    tag=TAG)
                kind, lo, hi, entered = (int(v) for v in header)
                with self._cond:
                    if kind == DONE:
                        self._done.add(j)
                    else:
                        self._entered[j] = max(self._entered[j], entered)
                        if not self._finished:  # after finish() nobody reads the queues
                            self._queues[j].append(Entry(lo, hi, message[HEADER:]))
                    if self._awaited is not None and self._awaited():
                        self._awaited, self._ended_by = None, j
                    self._cond.notify_all()
                if kind == DONE:
                    return
        except BaseException as exc:  # handed to the main thread, which raises it
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def _wait_sends(self) -> None:
        """Waits for each send in the order posted, so that its message (and, on a shared GPU,
        its pinned host buffer) is let go once sent. gloo marks a send complete only when it
        is waited: never waited, every message stayed alive and each send pinned a new host
        buffer (issue 54: 2 x 44.7 MB a step, ~80 ms each to pin, on ResNet-18). The main
        thread does not wait for its sends, as the protocol does not; nor does this thread wait
        for an emulated network's modeled send (Work.let_go)."""
        try:
            while (posted := self._posted.get()) is not None:
                posted[0].let_go()
        except BaseException as exc:  # handed to the main thread, which raises it
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    # -- the main thread ---------------------------------------------------------------------
    def _send(self, kind: int, lo: int, hi: int, entered: int, model: torch.Tensor) -> None:
        message = torch.empty(HEADER + self._numel, dtype=self._dtype, device=model.device)
        message[:HEADER] = torch.tensor([kind, lo, hi, entered], dtype=self._dtype)
        message[HEADER:] = model
        # Non-blocking: a blocking send of a big tensor could wait on a neighbour that is itself
        # waiting on us. The message is kept alive until its send is waited (_wait_sends).
        for j in self.neighbours:
            self._posted.put((self._comm.isend_on(self._channel, message, dst=j, tag=TAG),
                              message))

    def _wait(self, ready, what: str, waited_on: dict[int, float]) -> float:
        """Block (holding the condition's lock on return) until ready(); returns seconds, and
        adds them to `waited_on` under the neighbour whose message made ready() true."""
        if ready():
            return 0.0
        start = time.perf_counter()
        deadline = start + self._timeout_s
        self._awaited, self._ended_by = ready, None
        try:
            while self._awaited is not None:
                if self._error is not None:
                    raise RuntimeError(f"hop receiver failed: {self._error!r}") from self._error
                left = deadline - time.perf_counter()
                if left <= 0:
                    raise TimeoutError(f"hop: waited {self._timeout_s:.0f} s for {what} at "
                                       f"iteration {self.iteration}")
                self._cond.wait(left)
        finally:
            self._awaited = None
        seconds = time.perf_counter() - start
        on = self._ended_by
        waited_on[on] = waited_on.get(on, 0.0) + seconds
        return seconds

    def _usable(self, j: int, k: int) -> Entry | None:
        return newest_usable(self._queues[j], k, self.config.staleness)

    def _updates_ready(self, k: int) -> bool:
        return updates_ready(self._queues, self._done, k, self.config.backup_workers,
                             self.config.staleness)

    def _tokens_ready(self, k: int) -> bool:
        return tokens_ready(self._entered, self._done, k, self.config.max_iteration_gap)

    def _skip_target(self, k: int) -> int | None:
        return skip_target(self._entered, self._done, k, self.config.skip_threshold,
                           self.config.max_iteration_gap)

    @torch.no_grad()
    def step(self, ctx, model, optimizer):
        k = self.iteration
        own = flat_params(model)
        self._send(UPDATE, k, k, k, own)
        waited_on: dict[int, float] = {}
        with self._cond:
            target = self._skip_target(k) if self.config.skip else None
            if target is None:
                wait_s = self._wait(lambda: self._updates_ready(k), "neighbour updates",
                                    waited_on)
                used = {j: (min(e.hi, k), e.model) for j in self.neighbours
                        if (e := self._usable(j, k)) is not None}
            else:
                wait_s = 0.0
                used = {j: (q[-1].hi, q[-1].model) for j, q in self._queues.items() if q}
            following = k + 1 if target is None else target
            drop_before(self._queues, following, self.config.staleness)
        set_flat_params(model, mix_used(own, self.weights, ctx.rank, self.neighbours,
                                        {j: m for j, (_, m) in used.items()}))
        optimizer.step()
        fields = {"used": {str(j): it for j, (it, _) in used.items()}}
        if target is not None:
            # Timestamped before the send: from here on neighbours may act on the jump.
            fields.update(skipped=target - k - 1, skip_to=target, skip_ns=now_ns())
            self._send(SKIP, k + 1, target - 1, target, flat_params(model))
        with self._cond:
            wait_s += self._wait(lambda: self._tokens_ready(following), "tokens", waited_on)
        self.iteration = following
        return StepInfo(wait_s=wait_s, next_iteration=following, peers=len(used),
                        staleness=mean_staleness(k, (it for it, _ in used.values())),
                        waited_on=waited_on, fields=fields)

    def finish(self, ctx, model):
        with self._cond:
            self._finished = True
            for queue in self._queues.values():
                queue.clear()
        self._send(DONE, self.iteration, self.iteration, self.iteration,
                   torch.zeros(self._numel, dtype=self._dtype, device=ctx.device))
        self._posted.put(None)
        while self._waiter.is_alive():  # every send waited, DONE included
            self._waiter.join(timeout=1.0)
        # A receiver ends once its neighbour said DONE; no deadline here, since a neighbour
        # far behind may still be training: its receive times out if messages stop coming.
        for receiver in self._receivers:
            while receiver.is_alive():
                receiver.join(timeout=1.0)
        if self._error is not None:
            raise RuntimeError(f"hop receiver failed: {self._error!r}") from self._error
        # Neighbours may finish far apart (no skipping, a fixed straggler); the evaluation's
        # collectives must not start (and time out) while one is still training.
        ctx.comm.wait_for_arrivals("hop-finished", ctx.workers)


# -- simulated protocol (bench sim): the same rules in simulated time ------------------------

class HopSim(Protocol):
    """Hop's queues: backup workers, bounded staleness, token queues (iteration gap), skipping.

    Per worker: an update queue per neighbour of (lo, hi) entries, each neighbour's newest
    `entered` iteration, and the neighbours that are done, all updated when a message lands
    (one alpha + bytes/beta after it was sent). The rules are hop.py's (the real step's), applied
    to that state. A simulated message's kind is UPDATE or SKIP, or None for DONE.
    """

    transport_ready = True

    def __init__(self, engine):
        super().__init__(engine)
        self.graph = gossip_graph(self.config, self.n)
        if self.transport is not None:  # each edge's receiver thread posts its first receive
            for i in range(self.n):
                for j in self.graph[i]:
                    self.transport.post_receive(i, j, TAG)
        self.msg_bytes = self.model_bytes + HEADER * 4
        c = self.config
        self.backup_workers, self.staleness, self.gap = (c.backup_workers, c.staleness,
                                                      c.max_iteration_gap)
        self.skip, self.skip_threshold = c.skip, c.skip_threshold
        self.queues = [{j: deque() for j in self.graph[i]} for i in range(self.n)]
        self.entered = [dict.fromkeys(self.graph[i], 0) for i in range(self.n)]
        self.done_peers: list[set[int]] = [set() for _ in range(self.n)]
        self.stopped = [False] * self.n
        #: What a blocked worker waits for: ("updates", k, since) or ("tokens", following,
        #: since, wait_s, fields, peers, staleness).
        self.blocked: list[tuple | None] = [None] * self.n
        #: Iterations the workers skipped in all (a skip from k to target skips target - k - 1).
        self.iterations_skipped = 0

    # -- messages ----------------------------------------------------------------------------
    def _send(self, w: int, kind: int, lo: int, hi: int, entered: int, model=None) -> None:
        """`model`: the message's model when the run learns (a flat tensor), else None."""
        now, active = self.engine.now, self.engine.active
        if self.net.cluster is None:
            # Every copy lands at the same instant: one event delivers them in turn, as the
            # heap would have run their consecutive events (nothing can come between them).
            arrive = self.net.message_to(w, w, self.msg_bytes, now, active)
            self.engine.at(arrive, self._deliver_all, w, kind, lo, hi, entered, model)
            return
        if self.transport is not None:  # isend to each neighbour; nobody waits for them
            for j in self.graph[w]:
                self.transport.send(w, j, self.msg_bytes, now,
                                    (self._received, w, j, kind, lo, hi, entered, model), key=TAG)
            return
        for j in self.graph[w]:
            arrive = self.net.message_to(w, j, self.msg_bytes, now, active)
            self.engine.at(arrive, self._deliver, w, j, kind, lo, hi, entered, model)

    def _received(self, src, dst, kind, lo, hi, entered, model=None):
        """Under transport = "fair": dst's receiver for src handled the message, and posts its
        next receive (none after DONE: the thread ends)."""
        self._deliver(src, dst, kind, lo, hi, entered, model)
        if kind is not None:
            self.transport.post_receive(dst, src, TAG)

    def _deliver_all(self, src, kind, lo, hi, entered, model=None):
        for dst in self.graph[src]:
            self._deliver(src, dst, kind, lo, hi, entered, model)

    def _deliver(self, src, dst, kind, lo, hi, entered, model=None):
        if kind is None:  # DONE
            self.done_peers[dst].add(src)
        else:
            if entered > self.entered[dst][src]:
                self.entered[dst][src] = entered
            if not self.stopped[dst]:
                self.queues[dst][src].append(Entry(lo, hi, model))
        if self.blocked[dst] is not None:
            self._unblock(dst)

    def stats(self) -> dict:
        """For the summary's `sim` record: what a large run has no event lines to count."""
        return {**super().stats(), "iterations_skipped": self.iterations_skipped}

    # -- hop.py's rules, on this worker's state ------------------------------------------
    def _updates_ready(self, w, k):
        return updates_ready(self.queues[w], self.done_peers[w], k, self.backup_workers,
                             self.staleness)

    def _tokens_ready(self, w, k):
        return tokens_ready(self.entered[w], self.done_peers[w], k, self.gap)

    def _skip_target(self, w, k):
        return skip_target(self.entered[w], self.done_peers[w], k, self.skip_threshold,
                           self.gap)

    def _drop_before(self, w, k):
        drop_before(self.queues[w], k, self.staleness)

    # -- the step ----------------------------------------------------------------------------
    learns_events = True

    def ready(self, w):
        k = self.engine.iteration[w]
        learner = self.engine.learner
        # The real step sends its model of iteration k (the one its gradient is of).
        self._send(w, UPDATE, k, k, k, None if learner is None else learner.row(w))
        target = self._skip_target(w, k) if self.skip else None
        if target is None:
            if self._updates_ready(w, k):
                self._mixed(w, k, 0.0)
            else:
                self.blocked[w] = ("updates", k, self.engine.now)
            return
        # Keys are ints here: the event line's JSON writes them as the real step's strings.
        used = {j: q[-1].hi for j, q in self.queues[w].items() if q}
        if learner is not None:  # the newest queued model of each neighbour, usable or not
            self._learn_mix(w, {j: q[-1].model for j, q in self.queues[w].items() if q})
        self._drop_before(w, target)
        self.iterations_skipped += target - k - 1
        fields = {"used": used, "skipped": target - k - 1, "skip_to": target,
                  "skip_ns": round(self.engine.now * 1e9)}
        self._send(w, SKIP, k + 1, target - 1, target,
                   None if learner is None else learner.row(w))
        self._tokens(w, k, target, 0.0, fields)

    def _mixed(self, w, k, wait_s):
        used, models = {}, {}
        queues, s = self.queues[w], self.staleness
        for j in self.graph[w]:
            entry = newest_usable(queues[j], k, s)
            if entry is not None:
                used[j] = min(entry.hi, k)
                models[j] = entry.model
        if self.engine.learner is not None:
            self._learn_mix(w, models)
        self._drop_before(w, k + 1)
        self._tokens(w, k, k + 1, wait_s, {"used": used})

    def _learn_mix(self, w: int, models: dict) -> None:
        """The real step's math: w's model mixed with the neighbours' models it uses (a
        neighbour without one leaves its weight to w), then its optimizer step with the
        gradient of its model of this iteration."""
        learner = self.engine.learner
        if "_weights" not in self.__dict__:
            self._weights = topologies.mixing_weights(self.graph, self.config.weights)
        grads = learner.gradient(w)
        learner.set_row(w, mix_used(learner.row(w), self._weights[w], w, self.graph[w], models))
        learner.worker_step(w, grads)

    def _tokens(self, w, k, following, wait_s, fields):
        """Wait for the tokens of `following`, then end w's step k. Its peers and staleness
        are the real step's: the neighbours' updates used, and their mean distance from k."""
        used = fields["used"]
        peers = len(used)
        staleness = mean_staleness(k, used.values())
        if self._tokens_ready(w, following):
            self.engine.end_step(w, self.engine.now, wait_s, fields, following, peers=peers,
                              staleness=staleness)
        else:
            self.blocked[w] = ("tokens", following, self.engine.now, wait_s, fields, peers,
                               staleness)

    def _unblock(self, w):
        state = self.blocked[w]
        now = self.engine.now
        if state[0] == "updates":
            _, k, since = state
            if self._updates_ready(w, k):
                self.blocked[w] = None
                self._mixed(w, k, now - since)
        else:
            _, following, since, wait_s, fields, peers, staleness = state
            if self._tokens_ready(w, following):
                self.blocked[w] = None
                self.engine.end_step(w, now, wait_s + now - since, fields, following, peers=peers,
                                  staleness=staleness)

    def finish(self, w, t):
        self.stopped[w] = True
        for queue in self.queues[w].values():
            queue.clear()
        self._send(w, None, 0, 0, 0)  # DONE
        self.engine.done(w)
