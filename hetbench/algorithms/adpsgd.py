"""AD-PSGD: asynchronous decentralized SGD over a bipartite graph (Lian et al., ICML 2018).

Workers are split into active (even ranks) and passive (odd ranks), and only edges between the
two sets are used. After computing its gradient g on x_a, an active worker picks a random passive
neighbour p; both models become (x_a + x_p) / 2 at once, then the active worker applies g:
x_a <- (x_a + x_p) / 2 - lr * g. Passive workers train on their own and serve averaging requests
from a thread on a process group of its own, so serving never waits for their computation, and
actives never serve, so no cycle of waits can form.

Atomicity without stopping the passive's computation: the serving thread never writes the
passive's parameters (autograd would see a weight change between forward and backward). It keeps
the passive's current model, the average, in `_current`; the passive's main thread installs it
before its next optimizer step, under the same lock. The sum of all models is therefore kept
exactly by every averaging (up to float rounding), and nothing is lost at the end: finish()
installs the last one.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from hetbench.algorithms import topologies
from hetbench.core.algorithm import Algorithm, StepInfo
from hetbench.core.options import opt
from hetbench.core.tensors import flat_params, set_flat_params
from hetbench.errors import UserError
from hetbench.network.transport import ANY
from hetbench.sim.protocol import Protocol

REQUEST_TAG, REPLY_TAG = 51, 52
#: First element of a request: average with this model, or this active worker is done.
AVERAGE, DONE = 0.0, 1.0
#: A request is [kind, the active worker's iteration, its model]; a reply is [the average, the
#: passive worker's iteration]: each side learns how far apart the averaged models were.
REQUEST_HEADER = 2


@dataclass(frozen=True, kw_only=True)
class ADPSGDOptions:
    topology: Literal["ring", "double-ring", "torus", "exponential", "complete"] = opt(
        "ring", "base graph; only its edges between an active and a passive worker are used")


def pair_graph(config: ADPSGDOptions, workers: int) -> topologies.Graph:
    """The bipartite graph AD-PSGD averages over, or a UserError if it cannot work."""
    try:
        graph = topologies.bipartite(topologies.build(config.topology, workers))
    except ValueError as exc:
        raise UserError(f"algorithm adpsgd: {exc}") from None
    if not topologies.is_connected(graph):
        raise UserError(
            f"algorithm adpsgd: topology {config.topology} with {workers} workers has no "
            f"connected active/passive split (even ranks active, odd passive); use ring")
    return graph


class ADPSGD(Algorithm):
    name = "adpsgd"
    description = "AD-PSGD: active workers average with a random passive neighbour, asynchronously"
    Config = ADPSGDOptions
    wait_rule = "peer"

    @classmethod
    def simulated_protocol(cls):
        return ADPSGDSim
    synchronous = False

    @classmethod
    def validate(cls, config, workers):
        pair_graph(config, workers)

    def setup(self, ctx, model, optimizer):
        active, _ = topologies.bipartite_split(ctx.workers)
        self.active = ctx.rank in active
        self.neighbours = pair_graph(self.config, ctx.workers)[ctx.rank]
        self._comm = ctx.comm
        self._channel = ctx.comm.channel("adpsgd")
        n = flat_params(model).numel()
        self._request = torch.zeros(REQUEST_HEADER + n, device=ctx.device)
        self._reply = torch.empty(n + 1, device=ctx.device)
        self._lock = threading.Lock()
        self._current: torch.Tensor | None = None
        self._steps = 0
        # Averagings served since the passive worker's last step, and their iteration gaps.
        self._served = 0
        self._served_gaps = 0
        self._error: BaseException | None = None
        self._server: threading.Thread | None = None
        if not self.active:
            self._server = threading.Thread(target=self._serve, args=(model,),
                                            name="adpsgd-server", daemon=True)
            self._server.start()

    # -- passive workers: the serving thread -------------------------------------------------
    def _serve(self, model) -> None:
        remaining = len(self.neighbours)  # active neighbours that have not said DONE
        request = torch.empty_like(self._request)
        try:
            while remaining:
                # The header from host memory: reading it off a shared GPU would wait for the
                # main thread's queued compute first.
                src, (kind, steps) = self._comm.recv_head_on(self._channel, request, REQUEST_HEADER,
                                                             src=None, tag=REQUEST_TAG)
                if kind == DONE:
                    remaining -= 1
                    continue
                with self._lock, torch.no_grad():
                    mine = self._current if self._current is not None else flat_params(model)
                    average = (mine + request[REQUEST_HEADER:]) / 2
                    self._current = average
                    self._served += 1
                    self._served_gaps += abs(int(steps) - self._steps)
                    reply = torch.cat([average, average.new_tensor([self._steps])])
                self._comm.send_on(self._channel, reply, dst=src, tag=REPLY_TAG)
        except BaseException as exc:  # handed to the main thread, which raises it
            self._error = exc

    def _install(self, model) -> None:
        """Make the serving thread's latest average the model (caller holds the lock)."""
        if self._current is not None:
            set_flat_params(model, self._current)
            self._current = None

    # -- the main thread ---------------------------------------------------------------------
    @torch.no_grad()
    def step(self, ctx, model, optimizer):
        if self._error is not None:
            raise RuntimeError(f"adpsgd server failed: {self._error!r}") from self._error
        if not self.active:
            start = time.perf_counter()
            with self._lock:
                wait_s = time.perf_counter() - start
                self._install(model)
                optimizer.step()
                served, gaps = self._served, self._served_gaps
                self._served = self._served_gaps = 0
                self._steps += 1
            return StepInfo(wait_s=wait_s, peers=served,
                            staleness=gaps / served if served else None,
                            fields={"served": served})
        peer = int(self.neighbours[ctx.rng.integers(len(self.neighbours))])
        self._request[0] = AVERAGE
        self._request[1] = self._steps
        self._request[REQUEST_HEADER:] = flat_params(model)
        # The round trip is the step's waiting: Comm records the seconds these two block.
        self._comm.send_on(self._channel, self._request, dst=peer, tag=REQUEST_TAG)
        self._comm.recv_on(self._channel, self._reply, src=peer, tag=REPLY_TAG)
        set_flat_params(model, self._reply[:-1])
        optimizer.step()  # the gradient was computed on the model before the average
        gap = abs(self._steps - int(self._reply[-1].item()))
        self._steps += 1
        return StepInfo(peers=1, staleness=float(gap), fields={"peer": peer})

    @classmethod
    def intended_sync_share(cls, config, workers):
        # Active workers average every iteration; a passive one only in iterations in which an
        # active neighbour happened to ask it, which depends on the relative speeds.
        active, _ = topologies.bipartite_split(workers)
        return len(active) / workers

    def finish(self, ctx, model):
        served_after = 0
        if self.active:
            self._request.zero_()
            self._request[0] = DONE
            for peer in self.neighbours:
                self._comm.send_on(self._channel, self._request, dst=peer, tag=REQUEST_TAG)
        else:
            # Keep serving until every active neighbour is done, then keep the last average. No
            # deadline here: the serving thread's own receive times out if requests stop coming.
            while self._server.is_alive():
                self._server.join(timeout=1.0)
            if self._error is not None:
                raise RuntimeError(f"adpsgd server failed: {self._error!r}") from self._error
            with self._lock:
                self._install(model)
                # Served after this worker's last iteration: in no event line, so on record here.
                served_after = self._served
        # Workers finish far apart under a fixed straggler; the evaluation's collectives must
        # not start (and time out) while one is still training.
        ctx.comm.wait_for_arrivals("adpsgd-finished", ctx.workers)
        return {"averagings_after_training": served_after}


# -- simulated protocol (bench sim): the same rules in simulated time ------------------------

class ADPSGDSim(Protocol):
    """Actives average with a random passive neighbour, whose serving thread is a FIFO queue."""

    DRAWS_AT_ONCE = 256
    transport_ready = True

    def __init__(self, engine):
        super().__init__(engine)
        active, _ = topologies.bipartite_split(self.n)
        self.active = set(active)
        self.graph = pair_graph(self.config, self.n)
        seed = engine.config.seed
        # The same per-rank generator a real worker draws its peers from (WorkerContext.rng).
        self.rng = {w: np.random.default_rng([seed, w, 17]) for w in active}
        #: Each active's next peer indices, drawn DRAWS_AT_ONCE at a time: numpy gives an
        #: array of bounded integers the same values as as many single draws (test_sim), and
        #: one call per draw was a third of this protocol's time at 16,384 workers.
        self._draws: dict[int, list[int]] = {w: [] for w in active}
        self.server_free = [0.0] * self.n
        self.served = [0] * self.n
        #: Per passive worker: iteration gaps to the actives it served since its last step.
        self.gaps = [0] * self.n
        if self.transport is not None:  # each passive's serving thread: one request at a time
            for passive in range(self.n):
                if passive not in self.active:
                    self.transport.post_receive(passive, ANY, REQUEST_TAG)

    def ready(self, w):
        t = self.engine.now
        learner = self.engine.learner
        if w not in self.active:
            if learner is not None:
                # The real passive step: its model as its serving thread left it (the pair
                # averages so far), then its optimizer step with the gradient it computed.
                learner.worker_step(w, learner.gradient(w))
            served, self.served[w] = self.served[w], 0
            gaps, self.gaps[w] = self.gaps[w], 0
            self.engine.end_step(w, t, 0.0, {"served": served}, peers=served,
                              staleness=gaps / served if served else None)
            return
        peers = self.graph[w]
        draws = self._draws[w]
        if not draws:
            draws.extend(reversed(self.rng[w].integers(len(peers), size=self.DRAWS_AT_ONCE)
                                  .tolist()))
        peer = peers[draws.pop()]
        if self.transport is not None:  # the request's blocking send, then the reply's receive
            self.transport.request(w, peer, self.model_bytes + 4, (self._serve_fair, w, peer, t),
                                   REQUEST_TAG, REPLY_TAG)
            return
        start = max(self.server_free[peer], t)
        active = self.engine.active
        # The request (model and a flag) to the passive peer, then its reply.
        asked = self.net.message_to(w, peer, self.model_bytes + 4, start, active)
        end = self.net.message_to(peer, w, self.model_bytes, asked, active)
        self.server_free[peer] = end
        gap = self._served(w, peer)
        if learner is not None:  # at the moment the passive's thread serves the request
            self.engine.at(asked, self._learn_pair, w, peer)
        self.engine.end_step(w, end, start - t, {"peer": peer}, peers=1, staleness=float(gap))

    def _served(self, w: int, peer: int) -> int:
        """The passive `peer` serves w's request: counted, with the gap between their
        iterations as the request and the reply carry them (the passive's at the time of the
        request: it serves from a thread, whatever its own step is doing)."""
        self.served[peer] += 1
        gap = abs(self.engine.iteration[w] - self.engine.iteration[peer])
        self.gaps[peer] += gap
        return gap

    def _serve_fair(self, w: int, peer: int, ready: float) -> None:
        """Under transport = "fair": the passive's serving thread took w's request, which has
        arrived: it averages and sends the reply (a blocking send), and only once that send
        returns posts its next receive from any active."""
        gap = self._served(w, peer)
        if self.engine.learner is not None:
            self._learn_pair(w, peer)
        self.transport.reply(peer, w, self.model_bytes,
                             (self._replied, w, peer, ready, float(gap)), REPLY_TAG,
                             sent=(self.transport.post_receive, peer, ANY, REQUEST_TAG))

    def _replied(self, w: int, peer: int, ready: float, gap: float) -> None:
        """w's step ends with the reply; it waited for what its request and the reply would
        not have taken on idle links."""
        now = self.engine.now
        wait = self.round_trip_wait(w, peer, self.model_bytes + 4, self.model_bytes, ready, now)
        self.engine.end_step(w, now, wait, {"peer": peer}, peers=1, staleness=gap)

    learns_events = True

    def _learn_pair(self, w: int, peer: int) -> None:
        """The real pair's math: the passive's serving thread averages its model with the
        request (atomically), and the active takes the average, then its optimizer step with
        the gradient it computed before (an active's model changes only here)."""
        learner = self.engine.learner
        grads = learner.gradient(w)
        learner.pair_average(w, peer)
        learner.worker_step(w, grads)
