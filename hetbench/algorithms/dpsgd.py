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

import torch

from hetbench.algorithms import topologies
from hetbench.core.algorithm import Algorithm, StepInfo
from hetbench.core.options import opt
from hetbench.core.tensors import flat_params, set_flat_params
from hetbench.errors import UserError
from hetbench.sim.synchronous import NeighbourExchange

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

    def shifts(self, k: int) -> tuple[int, ...]:
        """A time-varying graph's offsets d at iteration k: each rank sends to rank + d and
        receives from rank - d."""
        return topologies.exponential_offsets(self.n, k, self.peers)


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

class DPSGDSim(NeighbourExchange):
    """The real step's exchange (the same Exchange) in simulated time: iteration k of worker i
    ends one message after all of its neighbours' k-th models."""

    message_tag = MODEL_TAG

    def make_exchange(self) -> Exchange:
        return Exchange(self.config, self.n)

    def learn(self, k, learner):
        """The real step's math: each worker's gradient at its model of iteration k, its
        model mixed with its in-neighbours' models of iteration k (the same Exchange and
        weights as the real step), then its optimizer step with that gradient."""
        grads = learner.gradients()
        learner.mix(*self.mixing(k))
        learner.sgd_step(grads)
