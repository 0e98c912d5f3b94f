"""D-PSGD: synchronous gossip over a fixed graph (Lian et al., NeurIPS 2017).

Each iteration k, worker i sends its model x_i^k to its neighbours, waits for all their models of
the same iteration, and sets x_i^{k+1} = sum_j W_ij x_j^k - lr * g_i, where g_i was computed on
x_i^k (the harness already put it in p.grad). The optimizer applies the gradient, so momentum and
weight decay mean what they mean for plain SGD. On the time-varying one-peer exponential graph
(topology = "one-peer-exponential", Ying et al. NeurIPS 2021) worker i sends to i + 2^(k mod t)
and mixes in the model of i - 2^(k mod t), each with weight 1/2: one model in, one out per
iteration instead of deg(i) of each. The "standard decentralized training" that Hop is
measured against: every worker waits, through its neighbours, for the slowest one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from hetbench.algorithms import topologies
from hetbench.core.algorithm import Algorithm, StepInfo
from hetbench.core.options import opt
from hetbench.core.tensors import flat_params, set_flat_params
from hetbench.errors import UserError
from hetbench.sim.protocol import Protocol, Steps

#: Point-to-point tag of D-PSGD's model exchange (gloo matches messages on (source, tag)).
MODEL_TAG = 31


@dataclass(frozen=True, kw_only=True)
class GossipOptions:
    topology: Literal["ring", "double-ring", "torus", "exponential", "complete",
                      "one-peer-exponential"] = opt(
        "ring", "graph: ring, double-ring, torus, exponential, complete (static, undirected), "
                "or one-peer-exponential (time-varying, directed: dpsgd only)")
    weights: Literal["uniform", "metropolis"] = opt(
        "uniform",
        "mixing weights W_ij: uniform over the closed neighbourhood, or metropolis (-Hastings); "
        "1/2 each on one-peer-exponential",
    )


def gossip_graph(config: GossipOptions, workers: int, algorithm: str = "hop"
                 ) -> topologies.Graph:
    """The configured static graph, or a UserError naming what is wrong."""
    if config.topology in topologies.TIME_VARYING:
        raise UserError(f"{algorithm}: topology {config.topology} is time-varying; {algorithm} "
                        "keeps a queue and a staleness bound per edge of a static graph: use "
                        "ring, double-ring, torus, exponential or complete")
    try:
        return topologies.build(config.topology, workers)
    except ValueError as exc:
        raise UserError(str(exc)) from None


class Exchange:
    """Whom one gossip iteration sends to, receives from, and with which mixing weights: a
    static graph's neighbours, or the time-varying exponential graph's `peers` shifts of the
    iteration (D-PSGD's one-peer-exponential topology, SGP)."""

    def __init__(self, config: GossipOptions | None, workers: int, peers: int = 1,
                 algorithm: str = "dpsgd"):
        self.n = workers
        self.peers = peers
        self.time_varying = config is None or config.topology in topologies.TIME_VARYING
        if self.time_varying:
            topologies.exponential_offsets(workers, 0, peers)  # checks size and peers
            #: Phase (k modulo the graph's rounds) -> every rank's (send to, receive from):
            #: a simulated OSGP asks about 4 times per worker-iteration.
            self.rounds = topologies.one_peer_rounds(workers)
            self._tables: dict[int, list] = {}
            return
        #: Iterations after which the links repeat (a static graph: every one).
        self.rounds = 1
        graph = gossip_graph(config, workers, algorithm)
        self.graph = graph
        self.weights = topologies.mixing_weights(graph, config.weights)

    def at(self, rank: int, k: int) -> tuple[tuple[int, ...], tuple[int, ...], dict[int, float]]:
        """(send to, receive from, W_rank,j of rank's closed in-neighbourhood) at iteration k."""
        send_to, receive_from = self.links(rank, k)
        if not self.time_varying:
            return send_to, receive_from, self.weights[rank]
        return send_to, receive_from, topologies.time_varying_row(self.n, k, rank, self.peers)

    def links(self, rank: int, k: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(send to, receive from) at iteration k: at() without the weights, which a simulated
        protocol never needs (building the mixing row was a third of bench sim's time for
        sgp and osgp)."""
        if not self.time_varying:
            peers = self.graph[rank]
            return peers, peers
        phase = k % self.rounds
        table = self._tables.get(phase)
        if table is None:
            n = self.n
            offsets = topologies.exponential_offsets(n, phase, self.peers)
            table = self._tables[phase] = [
                (tuple((r + d) % n for d in offsets), tuple((r - d) % n for d in offsets))
                for r in range(n)]
        return table[rank]


@torch.no_grad()
def mix(own: torch.Tensor, self_weight: float,
        peers: Sequence[tuple[float, torch.Tensor]]) -> torch.Tensor:
    """self_weight * own + sum of w * x over `peers`, accumulated in the order given.

    D-PSGD and Hop both mix through this one function, in neighbour order, so that Hop without
    backup workers, staleness or skipping reproduces D-PSGD bit for bit.
    """
    out = own * self_weight
    for weight, x in peers:
        out.add_(x, alpha=weight)
    return out


class DPSGD(Algorithm):
    name = "dpsgd"
    description = "D-PSGD: synchronous gossip, x_i <- sum_j W_ij x_j - lr g_i over a fixed graph"
    Config = GossipOptions

    @classmethod
    def wait_rule(cls, config, workers):
        """A fixed graph's steps wait for their neighbours' (logged, point to point); on a
        time-varying graph each step meets that iteration's in- and out-peers, whose waits
        the reports infer from their arrivals where the step logged none."""
        return "from" if config.topology in topologies.TIME_VARYING else "neighbours"

    @classmethod
    def simulated_protocol(cls):
        return DPSGDSim
    @classmethod
    def validate(cls, config, workers):
        try:
            Exchange(config, workers)
        except ValueError as exc:
            raise UserError(f"dpsgd: {exc}") from None

    def setup(self, ctx, model, optimizer):
        self.exchange = Exchange(self.config, ctx.workers)
        self._numel = flat_params(model).numel()
        self._inbox: dict[int, torch.Tensor] = {}
        self.k = 0

    @torch.no_grad()
    def step(self, ctx, model, optimizer):
        own = flat_params(model)
        comm = ctx.comm
        send_to, receive_from, weights = self.exchange.at(ctx.rank, self.k)
        self.k += 1
        for j in receive_from:
            if j not in self._inbox:
                self._inbox[j] = torch.empty(self._numel, device=ctx.device)
        # Receives are posted before the sends and everything is non-blocking, so no cycle of
        # blocking sends can form around the graph.
        recvs = [comm.irecv(self._inbox[j], src=j, tag=MODEL_TAG) for j in receive_from]
        sends = [comm.isend(own, dst=j, tag=MODEL_TAG) for j in send_to]
        for work in recvs + sends:
            work.wait()  # Comm records the seconds these block as the step's waiting
        mixed = mix(own, weights[ctx.rank], [(weights[j], self._inbox[j]) for j in receive_from])
        set_flat_params(model, mixed)
        optimizer.step()
        # Synchronous gossip: every in-neighbour's model of this same iteration.
        fields = {"from": list(receive_from)} if self.exchange.time_varying else {}
        return StepInfo(peers=len(receive_from), staleness=0.0, fields=fields)


# -- simulated protocol (bench sim): the same rules in simulated time ------------------------

class DPSGDSim(Protocol):
    """Iteration k of worker i ends one message after all of its neighbours' k-th models (on a
    time-varying graph: its in- and out-peers of iteration k, whose receive its send waits for)."""

    transport_ready = True

    def __init__(self, engine):
        super().__init__(engine)
        self.exchange = self.make_exchange()
        #: Under transport = "fair": the receives and sends each worker's step still waits for.
        self._unfinished = [0] * self.n
        if self.lockstep and not self.exchange.time_varying:
            self._static_neighbours()
        #: ready_at[w][k]: when w's k-th gradient was ready (its k-th model sent).
        self.ready_at: list[list[float]] = [[] for _ in range(self.n)]
        self._partner_tables: dict[int, list] = {}
        self.waiting = [False] * self.n
        #: On a cluster's network (its NIC queues): each message is queued when its sender
        #: posts it, as the emulator does, not when its receiver's exchange begins (that
        #: booked a ring's messages in receiver order and held NICs idle meanwhile).
        #: delivered[(src, dst, k)]: when src's k-th model reaches dst; out[(x, k)]: when x's
        #: k-th sends are out of its NIC.
        self.sends_queue = self.net.queues_at_nics
        self.delivered: dict[tuple[int, int, int], float] = {}
        self.out: dict[tuple[int, int], float] = {}

    def make_exchange(self) -> Exchange:
        return Exchange(self.config, self.n)

    def _partners(self, x: int, k: int) -> tuple[tuple[int, ...], tuple[int, ...], int]:
        """(x's in-peers at iteration k, everyone x's iteration k waits for, how many x sends
        to), built once per phase of the graph for every rank, not per worker-iteration. The
        partners come in the order the set of them iterates, as when one was built per call:
        the order in which waiting partners are tried is the order of their events."""
        phase = k % self.exchange.rounds
        table = self._partner_tables.get(phase)
        if table is None:
            table = self._partner_tables[phase] = [
                (receive_from, tuple(set(send_to) | set(receive_from)), len(send_to))
                for send_to, receive_from in (self.exchange.links(r, k) for r in range(self.n))]
        return table[x]

    def ready(self, w):
        k = len(self.ready_at[w])
        self.ready_at[w].append(self.engine.now)
        if self.transport is not None:
            self._exchange_fair(w, k)
            return
        if self.sends_queue:
            out = self.engine.now
            for j in self.exchange.links(w, k)[0]:
                sent, self.delivered[(w, j, k)] = self.net.post(w, j, self.model_bytes,
                                                                self.engine.now)
                out = max(out, sent)
            self.out[(w, k)] = out
        self.waiting[w] = True
        self._try(w)
        # Only workers whose iteration-k partners include w can have been waiting on it (the
        # relation is symmetric: w sends to x iff x receives from w).
        for j in self._partners(w, k)[1]:
            if self.waiting[j]:
                self._try(j)

    def _exchange_fair(self, w: int, k: int) -> None:
        """The real step under transport = "fair": a receive posted for each in-neighbour's
        model, an isend to each out-neighbour (which moves once that neighbour's step posts
        its receive), and the step ends when every one is done."""
        send_to, receive_from = self.exchange.links(w, k)
        transport, now = self.transport, self.engine.now
        self._unfinished[w] = len(send_to) + len(receive_from)
        for j in receive_from:
            transport.post_receive(w, j, MODEL_TAG)
        for j in send_to:
            transport.send(w, j, self.model_bytes, now, (self._done_one, j),
                           sent=(self._done_one, w), key=MODEL_TAG)
        if not self._unfinished[w]:
            self._done_one(w, 0)

    def _done_one(self, x: int, count: int = 1) -> None:
        self._unfinished[x] -= count
        if self._unfinished[x]:
            return
        k = self.engine.iteration[x]
        receive_from, partners, _ = self._partners(x, k)
        mine = self.ready_at[x][k]
        latest = max((self.ready_at[j][k] for j in partners if len(self.ready_at[j]) > k),
                     default=mine)
        self.engine.end_step(x, self.engine.now, max(latest - mine, 0.0),
                             peers=len(receive_from), staleness=0.0, peer_ranks=partners)

    def _try(self, x):
        k = self.engine.iteration[x]
        ready_at = self.ready_at
        receive_from, partners, _ = self._partners(x, k)
        if any(len(ready_at[j]) <= k for j in partners):
            return
        latest = max(ready_at[j][k] for j in partners)
        mine = ready_at[x][k]
        self.waiting[x] = False
        if self.sends_queue:
            end = max(latest, mine, self.out.pop((x, k)),
                      *(self.delivered.pop((j, x, k)) for j in receive_from))
        else:
            end = self.net.exchange(x, receive_from, self.model_bytes, max(latest, mine),
                                    self.engine.active)
        # The ranks it met, as a real step's Comm records them: its in- and out-neighbours.
        self.engine.end_step(x, end, latest - mine, peers=len(receive_from), staleness=0.0,
                             peer_ranks=partners)

    def learn(self, k, learner):
        """The real step's math: each worker's gradient at its model of iteration k, its
        model mixed with its in-neighbours' models of iteration k (the same Exchange and
        weights as the real step), then its optimizer step with that gradient."""
        grads = learner.gradients()
        learner.mix(*self._mixing(k))
        learner.sgd_step(grads)

    def _mixing(self, k: int):
        """Every worker's mixing row at iteration k as (peers, weights), [workers, m]: its own
        model first, then its in-neighbours' in the real step's order; cached per phase."""
        import torch

        cache = self.__dict__.setdefault("_mixing_rows", {})
        phase = k % self.exchange.rounds
        if phase not in cache:
            rows = []
            for r in range(self.n):
                _, receive_from, weights = self.exchange.at(r, k)
                rows.append([(r, weights[r]), *((j, weights[j]) for j in receive_from)])
            width = max(len(row) for row in rows)
            peers = torch.tensor([[j for j, _ in row] + [row[0][0]] * (width - len(row))
                                  for row in rows])
            weights = torch.tensor([[w for _, w in row] + [0.0] * (width - len(row))
                                    for row in rows], dtype=torch.float32)
            cache[phase] = (peers, weights)
        return cache[phase]

    lockstep = True
    #: A static graph with more edges than this is played event by event (the lockstep's
    #: neighbour index, workers x the largest degree, would not be small).
    LOCKSTEP_EDGES = 1 << 22

    def step_all(self, k, t_sync, full):
        exchange = self.exchange
        if exchange.time_varying:
            # In-peers (x - d) % n and out-peers (x + d) % n of every shift d: rolled copies.
            offsets = topologies.exponential_offsets(self.n, k, exchange.peers)
            latest = np.roll(t_sync, -offsets[0])
            for d in offsets:
                latest = np.maximum(np.maximum(latest, np.roll(t_sync, -d)), np.roll(t_sync, d))
            degree = len(offsets)
        else:
            # Each row: x's neighbours, padded with x itself (changes neither the step's begin,
            # max(latest, mine), nor its clipped wait, max(latest - mine, 0)).
            latest = t_sync[self._neighbours].max(axis=1)
            degree = self._degree
        begin = np.maximum(latest, t_sync)
        met = [self._partners(x, k)[1] for x in range(self.n)] if full else None
        return Steps(begin + self.net.exchange_s(degree, self.model_bytes, self.n),
                     latest - t_sync, degree, peer_ranks=met)

    def _static_neighbours(self) -> None:
        graph = self.exchange.graph
        widest = max(len(peers) for peers in graph)
        if widest * self.n > self.LOCKSTEP_EDGES:
            self.lockstep = False
            return
        self._neighbours = np.array([(*peers, *[x] * (widest - len(peers)))
                                     for x, peers in enumerate(graph)], dtype=np.int64)
        self._degree = np.array([len(peers) for peers in graph], dtype=np.int64)
