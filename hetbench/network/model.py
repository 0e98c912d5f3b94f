"""The cluster's network, modeled: where each rank sits, what a transfer costs on its links, and
the NICs where transfers queue.

Pure: no clock, no process. Two users ask it the same questions, so an emulated run and a
simulated run of one matrix can be compared cell by cell:
- a real run with a `[network]` table (network/emulator.py), where every Comm operation lasts
  at least its modeled time (stretched by the dilation) while real tensors still move;
- the simulator (`bench sim`), which plays the same protocols in simulated time.

The model (cluster seconds; docs/network.md has the reasoning and its limits):
- Workers are placed node by node: rank r on node r // workers_per_node. Server ranks (a
  parameter server, the backup all-reduce's server) each have a node of their own.
- Inside a node a transfer costs intra latency + bytes / intra bandwidth and queues nowhere
  (contention on a node's own links, PCIe or NVLink, is not modeled).
- Between nodes a transfer leaves through the sender's NIC and enters through the receiver's:
  inter latency + bytes / min(sender NIC, inter-node link, receiver NIC), and it holds both
  NICs for its bytes' time, so transfers that share a NIC queue there, first come first served
  (two workers pushing to one parameter server, two active AD-PSGD workers picking one passive
  one). A NIC slowed by `net:K@...` has 1/K of its bandwidth.
- A collective over n ranks (all-reduce, P-Reduce, broadcast, barrier) is a ring in rank order,
  the algorithm gloo and NCCL use for large messages: 2(n-1) steps (n-1 for a broadcast), each
  moving bytes/n over every ring link at once, so each step lasts as long as its slowest link.
  The NICs on the ring's inter-node links are held for the bytes they carry.
  With `collective = "tree"` it is a pipelined double binary tree instead (NCCL's tree
  algorithm; Sanders, Speck and Traeff, Parallel Computing 2009): the same bytes on every link
  as the ring's (2(n-1)/n of them for an all-reduce: both move data at the bus bandwidth,
  nccl-tests' PERFORMANCE.md), but a latency of 2 ceil(log2 n) hops instead of 2(n-1). At 1,024
  ranks the ring's latency alone is 2,046 hops a collective: the tree is what a large cluster's
  NCCL picks for it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hetbench.errors import UserError

GBIT = 1e9 / 8  # bytes per second in one Gbit/s
#: The collective algorithms the model knows (NetworkConfig.collective).
COLLECTIVES = ("ring", "tree")
#: How point-to-point messages move (NetworkConfig.transport): "fcfs", as soon as posted,
#: queued first come first served at each NIC; "fair", only once the receiver has posted a
#: matching receive, as flows sharing each NIC max-min fairly (network/flows.py).
TRANSPORTS = ("fcfs", "fair")


@dataclass(frozen=True)
class NetworkConfig:
    """The `[network]` table of a matrix: the cluster a run is emulated (or simulated) on."""

    #: The preset these values started from (PRESETS), '' for none; recorded, not re-applied.
    preset: str = ""
    #: Workers per node (ranks placed node by node); server ranks get a node each.
    workers_per_node: int = 1
    intra_latency_us: float = 5.0
    intra_gbps: float = 100.0
    inter_latency_us: float = 25.0
    #: The link between two nodes (a switch port); a transfer also gets no more than each NIC.
    inter_gbps: float = 100.0
    #: Every rank's NIC (each direction).
    nic_gbps: float = 10.0
    #: Time dilation k: modeled compute and network last k times longer on this host, and
    #: results are reported in cluster time (host seconds / k). Raise it until the run's
    #: fidelity is high: then the host's own costs are small beside every modeled duration.
    dilation: float = 1.0
    #: Fidelity threshold: a run is `fidelity: low` when its modeled operations finished late
    #: by more than this share of their modeled time, summed over the run.
    max_lateness: float = 0.05
    #: Time to build a communicator for a member set P-Reduce has none for (a cache miss: NCCL
    #: or gloo connecting the members), added to that P-Reduce. 0: assumed free (the host's
    #: own set-up then counts against fidelity like any cost beyond the model).
    group_setup_ms: float = 0.0
    #: How a collective moves its bytes: "ring" (2(n-1) latency hops) or "tree" (a pipelined
    #: double binary tree: 2 ceil(log2 n) hops, the same bandwidth).
    collective: str = "ring"
    #: How point-to-point messages move: "fcfs" (eager, each NIC first come first served) or
    #: "fair" (rendezvous with a posted receive, flows sharing NICs max-min fairly:
    #: hetbench.network.transport, played by bench sim and by the emulator of real runs).
    transport: str = "fcfs"

    def __post_init__(self):
        if self.workers_per_node < 1:
            raise ValueError(f"workers_per_node must be >= 1, got {self.workers_per_node}")
        for name in ("intra_latency_us", "inter_latency_us"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be >= 0, got {value}")
        for name in ("intra_gbps", "inter_gbps", "nic_gbps", "dilation"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be > 0, got {value}")
        if not (self.group_setup_ms >= 0 and math.isfinite(self.group_setup_ms)):
            raise ValueError(f"group_setup_ms must be >= 0, got {self.group_setup_ms}")
        if not self.max_lateness > 0:
            raise ValueError(f"max_lateness must be > 0, got {self.max_lateness}")
        if self.collective not in COLLECTIVES:
            raise ValueError(f"collective must be one of {', '.join(COLLECTIVES)}, got "
                             f"{self.collective!r}")
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, got "
                             f"{self.transport!r}")


#: Named clusters, with every assumption beside the values (docs/network.md cites them).
PRESETS: dict[str, tuple[dict[str, Any], str]] = {
    "prague": ({
        "workers_per_node": 4, "intra_latency_us": 5.0, "intra_gbps": 100.0,
        "inter_latency_us": 25.0, "inter_gbps": 56.0, "nic_gbps": 56.0,
    }, "Prague (ASPLOS'20): 16 GPUs, 4 per node. Assumed, as the slides do not say: PCIe 3.0 "
       "x16 inside a node (about 100 Gbit/s usable) and 56 Gbit/s FDR InfiniBand between nodes, "
       "one NIC per GPU"),
    "hop": ({
        "workers_per_node": 1, "intra_latency_us": 5.0, "intra_gbps": 100.0,
        "inter_latency_us": 50.0, "inter_gbps": 10.0, "nic_gbps": 10.0,
    }, "Hop (ASPLOS'19): one worker per machine. Assumed: 10 Gbit/s Ethernet between machines"),
    "ethernet-10g": ({
        "workers_per_node": 1, "inter_latency_us": 50.0, "inter_gbps": 10.0, "nic_gbps": 10.0,
    }, "one worker per machine on 10 Gbit/s Ethernet"),
}


def resolve_network(table: dict[str, Any] | None) -> dict[str, Any]:
    """The `[network]` table -> NetworkConfig's fields (a preset's values under the table's
    own), or {} for no table: no network model (the host's own transport, as before)."""
    if not table:
        return {}
    if not isinstance(table, dict):
        raise UserError(f"matrix: [network] must be a table of options, got {table!r}")
    preset = table.get("preset", "")
    if preset and preset not in PRESETS:
        raise UserError(f"network: unknown preset {preset!r}; presets are: "
                        f"{', '.join(sorted(PRESETS))}")
    values = {**(PRESETS[preset][0] if preset else {}), **table}
    # Checked here rather than by core.options.build_config: this layer sits below core (comm
    # imports it), and the table's fields are plain numbers and one string.
    fields = {f.name: f.type for f in dataclasses.fields(NetworkConfig)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise UserError(f"network: unknown option(s) {', '.join(unknown)}; options are: "
                        f"{', '.join(sorted(fields))}")
    for key, value in values.items():
        kind = fields[key]  # a string: this module has `from __future__ import annotations`
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if (kind == "str" and not isinstance(value, str)) or (kind != "str" and not number) or (
                kind == "int" and not isinstance(value, int)):
            wanted = {"str": "a string", "int": "an integer", "float": "a number"}[kind]
            raise UserError(f"network: option {key} must be {wanted}, got {value!r}")
    try:
        resolved = dataclasses.asdict(NetworkConfig(**values))
    except ValueError as exc:
        raise UserError(f"network: {exc}") from None
    # The defaults, left out: a run's id hashes its network table, and every run with a
    # [network] from before the option keeps its id (a rerun still finds it finished).
    if resolved["collective"] == "ring":
        del resolved["collective"]
    if resolved["transport"] == "fcfs":
        del resolved["transport"]
    return resolved


#: CPU seconds one worker's iteration costs the host beyond its compute (the Python loop, gloo's
#: transport): the upper end of what ps-async and ps-sync on mlp-digits cost
#: (docs/results/benchmarks-history.md).
HOST_CPU_PER_STEP_S = 2.5e-3


def dilation_warning(workers: int, cores: int, step_s: float, dilation: float) -> str | None:
    """A one-line warning when `dilation` is obviously too small for `workers` on `cores`: a
    round of iterations needs about workers x HOST_CPU_PER_STEP_S of CPU, and the host has
    cores x dilation x step_s core-seconds for it (step_s: an iteration's modeled compute, in
    cluster seconds). Emulation needs the host idle at least half the time; None when it is."""
    if step_s <= 0:
        return None
    demand = workers * HOST_CPU_PER_STEP_S
    if demand <= 0.5 * cores * dilation * step_s:
        return None
    needed = demand / (0.5 * cores * step_s)
    return (f"dilation {dilation:g} is likely too small for {workers} workers on {cores} cores "
            f"with {step_s * 1e3:g} ms of modeled compute per iteration (the host would be busy "
            f"more than half the time); try dilation >= {math.ceil(needed)}")


@dataclass(frozen=True)
class Transfer:
    """One point-to-point message: its latency, how long its bytes hold the links, and the
    NIC ports it holds meanwhile (none inside a node)."""

    latency_s: float
    busy_s: float
    ports: tuple[int, ...]


@dataclass(frozen=True)
class Ring:
    """One collective: how long it lasts once every member is in, and each NIC port it holds
    with the seconds its bytes take there."""

    duration_s: float
    port_busy: tuple[tuple[int, float], ...]

    @property
    def ports(self) -> tuple[int, ...]:
        return tuple(p for p, _ in self.port_busy)


def egress(rank: int) -> int:
    """The ledger port of a rank's NIC, sending side."""
    return 2 * rank


def ingress(rank: int) -> int:
    """The ledger port of a rank's NIC, receiving side."""
    return 2 * rank + 1


class Cluster:
    """A run's cluster: NetworkConfig placed over `workers` workers and the server ranks.

    `nic_factor(rank, t_s)` (optional) is the divisor of a rank's NIC bandwidth at cluster time
    t_s (a network slowdown); t_s is what the caller passes as `t` (0 when it has no clock).
    """

    def __init__(self, config: NetworkConfig, workers: int, world_size: int,
                 nic_factor: Callable[[int, float], float] | None = None):
        self.config = config
        self.workers = workers
        self.world_size = world_size
        self.nic_factor = nic_factor
        c = config
        self._intra = (c.intra_latency_us * 1e-6, c.intra_gbps * GBIT)
        self._inter_latency = c.inter_latency_us * 1e-6
        self._inter_rate = c.inter_gbps * GBIT
        self._nic_rate = c.nic_gbps * GBIT
        first_server_node = -(-workers // c.workers_per_node)
        self.node = [r // c.workers_per_node if r < workers
                     else first_server_node + r - workers for r in range(world_size)]

    @property
    def ports(self) -> int:
        return 2 * self.world_size

    def nic_rate(self, rank: int, t: float = 0.0) -> float:
        """Bytes per second of `rank`'s NIC at time t."""
        if self.nic_factor is None:
            return self._nic_rate
        return self._nic_rate / self.nic_factor(rank, t)

    def link(self, src: int, dst: int, t: float = 0.0) -> tuple[float, float]:
        """(latency s, bytes per second) from src to dst."""
        if self.node[src] == self.node[dst]:
            return self._intra
        return self._inter_latency, min(self.nic_rate(src, t), self._inter_rate,
                                        self.nic_rate(dst, t))

    def transfer(self, src: int, dst: int, nbytes: float, t: float = 0.0) -> Transfer:
        latency, rate = self.link(src, dst, t)
        ports = () if self.node[src] == self.node[dst] else (egress(src), ingress(dst))
        return Transfer(latency, nbytes / rate, ports)

    def ring(self, members: Sequence[int], nbytes: float, t: float = 0.0,
             broadcast: bool = False) -> Ring:
        """A ring all-reduce (or, with `broadcast`, a pipelined ring broadcast) of nbytes over
        `members`, or the tree's (config.collective); zero for fewer than two."""
        ranks = sorted(set(members))
        n = len(ranks)
        if n < 2:
            return Ring(0.0, ())
        if self.config.collective == "tree":
            return self._tree(ranks, nbytes, t, broadcast)
        steps = n - 1 if broadcast else 2 * (n - 1)
        chunk = nbytes / n
        step_s = 0.0
        port_busy = []
        for i, src in enumerate(ranks):
            dst = ranks[(i + 1) % n]
            latency, rate = self.link(src, dst, t)
            step_s = max(step_s, latency + chunk / rate)
            if self.node[src] != self.node[dst]:
                busy = steps * chunk / rate
                port_busy += [(egress(src), busy), (ingress(dst), busy)]
        return Ring(steps * step_s, tuple(port_busy))

    def _tree(self, ranks: list[int], nbytes: float, t: float, broadcast: bool) -> Ring:
        """A pipelined double binary tree over `ranks` (at least two): a reduction up and a
        broadcast down (a broadcast: down only), ceil(log2 n) hops deep, moving the ring's
        bytes at the slowest link's rate, each hop as slow as the slowest link's latency.
        The members' links are the ring's (consecutive ranks, so a node's ranks reach other
        nodes through their own NICs); every member with a link to another node holds its NIC
        both ways for the bytes, as a ring member does."""
        n = len(ranks)
        latency, rate = 0.0, math.inf
        crossing: set[int] = set()
        for i, src in enumerate(ranks):
            dst = ranks[(i + 1) % n]
            hop_s, hop_rate = self.link(src, dst, t)
            latency, rate = max(latency, hop_s), min(rate, hop_rate)
            if self.node[src] != self.node[dst]:
                crossing.update((src, dst))
        depth = math.ceil(math.log2(n))
        volume = nbytes if broadcast else 2 * (n - 1) / n * nbytes
        busy = volume / rate
        port_busy = tuple(pair for r in sorted(crossing)
                          for pair in ((egress(r), busy), (ingress(r), busy)))
        return Ring((1 if broadcast else 2) * depth * latency + busy, port_busy)

    def rpc_s(self, a: int, b: int) -> float:
        """Round trip of a small request from a to b and its answer (latency only)."""
        return 2 * self.link(a, b)[0]

    def describe(self) -> str:
        c = self.config
        nodes = max(self.node) + 1
        return (f"{nodes} nodes x {c.workers_per_node} workers, NIC {c.nic_gbps:g} Gbit/s, "
                f"inter {c.inter_gbps:g} Gbit/s {c.inter_latency_us:g} us, intra "
                f"{c.intra_gbps:g} Gbit/s {c.intra_latency_us:g} us, dilation {c.dilation:g}"
                + (f", group set-up {c.group_setup_ms:g} ms" if c.group_setup_ms else "")
                + (f", {c.collective} collectives" if c.collective != "ring" else "")
                + (f", {c.transport} transport" if c.transport != "fcfs" else "")
                + (f" (preset {c.preset})" if c.preset else ""))


class Ledger:
    """When each NIC port is next free, on its user's clock (simulated or host seconds)."""

    def __init__(self, ports: int):
        self._free = [0.0] * ports

    def free_at(self, ports: Sequence[int]) -> float:
        """The latest moment one of `ports` is busy until (0 if none)."""
        free = self._free
        return max((free[p] for p in ports), default=0.0)

    def reserve(self, ports: Sequence[int], at: float, busy_s: float) -> float:
        """Hold every port for busy_s from the first moment, not before `at`, that all are
        free; returns that start."""
        free = self._free
        start = max(at, *(free[p] for p in ports)) if ports else at
        for p in ports:
            free[p] = start + busy_s
        return start

    def book(self, port_busy: Sequence[tuple[int, float]], start: float) -> None:
        """Hold each port for its seconds from `start` (or from when it is free, if later: a
        transfer that reserved it meanwhile goes first)."""
        free = self._free
        for p, busy in port_busy:
            free[p] = max(free[p], start) + busy
