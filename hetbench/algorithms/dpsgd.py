"""D-PSGD: synchronous gossip over a fixed graph (Lian et al., NeurIPS 2017).

Each iteration k, worker i sends its model x_i^k to its neighbours, waits for all their models of
the same iteration, and sets x_i^{k+1} = sum_j W_ij x_j^k - lr * g_i, where g_i was computed on
x_i^k (the harness already put it in p.grad). The optimizer applies the gradient, so momentum and
weight decay mean what they mean for plain SGD. The "standard decentralized training" that Hop is
measured against: every worker waits, through its neighbours, for the slowest one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from hetbench.algorithms import topologies
from hetbench.core.algorithm import Algorithm, StepInfo
from hetbench.core.options import opt
from hetbench.core.tensors import flat_params, set_flat_params
from hetbench.errors import UserError
from hetbench.sim.protocol import Protocol

#: Point-to-point tag of D-PSGD's model exchange (gloo matches messages on (source, tag)).
MODEL_TAG = 31


@dataclass(frozen=True, kw_only=True)
class GossipOptions:
    topology: Literal["ring", "double-ring", "torus", "exponential", "complete"] = opt(
        "ring", "graph: ring, double-ring, torus, exponential, complete")
    weights: Literal["uniform", "metropolis"] = opt(
        "uniform",
        "mixing weights W_ij: uniform over the closed neighbourhood, or metropolis (-Hastings)",
    )


def gossip_graph(config: GossipOptions, workers: int) -> topologies.Graph:
    """The configured graph, or a UserError naming what is wrong."""
    try:
        return topologies.build(config.topology, workers)
    except ValueError as exc:
        raise UserError(str(exc)) from None


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
    def simulated_protocol(cls):
        return DPSGDSim
    @classmethod
    def validate(cls, config, workers):
        gossip_graph(config, workers)

    def setup(self, ctx, model, optimizer):
        graph = gossip_graph(self.config, ctx.workers)
        self.neighbours = graph[ctx.rank]
        self.weights = topologies.mixing_weights(graph, self.config.weights)[ctx.rank]
        n = flat_params(model).numel()
        self._inbox = {j: torch.empty(n, device=ctx.device) for j in self.neighbours}

    @torch.no_grad()
    def step(self, ctx, model, optimizer):
        own = flat_params(model)
        comm = ctx.comm
        # Receives are posted before the sends and everything is non-blocking, so no cycle of
        # blocking sends can form around the graph.
        recvs = [comm.irecv(self._inbox[j], src=j, tag=MODEL_TAG) for j in self.neighbours]
        sends = [comm.isend(own, dst=j, tag=MODEL_TAG) for j in self.neighbours]
        wait_start = time.perf_counter()
        for work in recvs + sends:
            work.wait()
        wait_s = time.perf_counter() - wait_start
        mixed = mix(own, self.weights[ctx.rank],
                    [(self.weights[j], self._inbox[j]) for j in self.neighbours])
        set_flat_params(model, mixed)
        optimizer.step()
        # Synchronous gossip: every neighbour's model of this same iteration.
        return StepInfo(wait_s=wait_s, peers=len(self.neighbours), staleness=0.0)


# -- simulated protocol (bench sim): the same rules in simulated time ------------------------

class DPSGDSim(Protocol):
    """Iteration k of worker i ends one message after all of its neighbours' k-th models."""

    def __init__(self, engine):
        super().__init__(engine)
        self.graph = gossip_graph(self.config, self.n)
        #: ready_at[w][k]: when w's k-th gradient was ready (its k-th model sent).
        self.ready_at: list[list[float]] = [[] for _ in range(self.n)]
        self.waiting = [False] * self.n

    def ready(self, w):
        self.ready_at[w].append(self.eng.now)
        self.waiting[w] = True
        self._try(w)
        for j in self.graph[w]:
            if self.waiting[j]:
                self._try(j)

    def _try(self, x):
        k = self.eng.iteration[x]
        ready_at = self.ready_at
        if any(len(ready_at[j]) <= k for j in self.graph[x]):
            return
        latest = max(ready_at[j][k] for j in self.graph[x])
        mine = ready_at[x][k]
        self.waiting[x] = False
        # x sends to and receives from each of its d neighbours: d hops' worth of CPU time
        # (a ring all-reduce hop is one send and one receive per process), one alpha.
        net = self.net
        exchange = (net.alpha_s + self.model_bytes / net.beta_bytes_per_s
                    + len(self.graph[x]) * net.cpu_s * net.share(self.eng.active))
        self.eng.end_step(x, max(latest, mine) + exchange, latest - mine,
                          peers=len(self.graph[x]), staleness=0.0)
