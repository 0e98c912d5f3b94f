"""Network heterogeneity: slow NICs. A worker's compute is untouched; its NIC has 1/K of the
network model's bandwidth (hetbench/network/model.py), so these kinds need a [network] table.

    net:K@R1,R2      the NICs of workers R1, R2, ... are always K times slower
    netprob:K[@P]    each NIC, each second of cluster time, K times slower with probability P
                     (default 1/workers), drawn from the run's seed
    nettrace:PATH    CSV worker,t_from,t_to,factor: time-varying NIC bandwidth (cluster seconds)
    netfailslow:k=K;on=S;gap=G   fail-slow episodes on NICs (slowdown/netfailslow.py)
"""

from __future__ import annotations

import numpy as np

from hetbench.slowdown.base import Injector
from hetbench.slowdown.deterministic import DeterministicSlowdown
from hetbench.slowdown.probabilistic import ProbabilisticSlowdown
from hetbench.slowdown.trace import TraceSlowdown

#: Cluster seconds per draw of netprob (a NIC stays slow or fast for this long).
NETPROB_WINDOW_S = 1.0


class NicOnly(Injector):
    """Compute is never slowed; nic_factor says how much a NIC is."""
    time_free = True

    network_kind = True

    def factor(self, worker: int, iteration: int, elapsed_s: float) -> float:
        return 1.0

    def factors(self, iteration: int, elapsed_s: np.ndarray) -> np.ndarray:
        return np.ones(len(elapsed_s))


class NetSlowdown(NicOnly, DeterministicSlowdown):
    kind = "net"
    syntax = "net:K@R1,R2"
    description = "NICs of workers R1, R2, ... always K times slower (needs [network])"

    def nic_factor(self, rank: int, t_s: float) -> float:
        return self.slow_factor if rank in self.slow_workers else 1.0


class NetProbSlowdown(NicOnly, ProbabilisticSlowdown):
    kind = "netprob"
    syntax = "netprob:K[@P]"
    description = ("each NIC each cluster second K times slower with probability P "
                   "(1/workers; needs [network])")

    salt = (29,)  # NIC draws apart from compute draws of the same seed

    def nic_factor(self, rank: int, t_s: float) -> float:
        window = int(t_s // NETPROB_WINDOW_S)
        return self.slow_factor if self.slowed(rank, window) else 1.0


class NetTraceSlowdown(NicOnly, TraceSlowdown):
    kind = "nettrace"
    syntax = "nettrace:PATH"
    description = "CSV worker,t_from,t_to,factor: time-varying NIC bandwidth (needs [network])"

    def nic_factor(self, rank: int, t_s: float) -> float:
        return TraceSlowdown.factor(self, rank, 0, t_s)
