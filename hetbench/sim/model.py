"""The simulator's cost models: compute time per iteration, and per message alpha + bytes/beta
plus the CPU time the message costs its process, stretched when processes share too few cores."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from hetbench.core.config import RunConfig
from hetbench.errors import UserError
from hetbench.sim.layout import ELEMENT_BYTES, Layout, LayoutCache, layout  # noqa: F401


@dataclass(frozen=True)
class NetworkModel:
    """A message costs alpha + bytes/beta on its own link (no shared switch), plus cpu_s of its
    process's CPU time, stretched by processor sharing when processes share `cores` cores.

    CPU sharing: a message also needs its process on a core (the transport's system calls,
    copies, the wake-up of the blocked receiver). With `cores` set, every simulated process
    shares those cores, and a message sent while `active` processes are in their
    synchronization step costs cpu_s * max(1, active / cores): processor sharing among the
    processes that compete for the CPU at that moment. cores None: each process has its own.
    """

    #: Latency per message, seconds.
    alpha_s: float = 20e-6
    #: Messages queue nowhere (ClusterNetwork's queue at NICs from when they are posted).
    queues_at_nics: ClassVar[bool] = False
    #: No fair transport (only a ClusterNetwork whose `[network]` says transport = "fair").
    fair: ClassVar[bool] = False
    #: Bandwidth per link, bytes per second.
    beta_bytes_per_s: float = 10e9 / 8
    #: Seconds to build a P-Reduce member communicator (a member-set cache miss).
    group_setup_s: float = 0.0
    #: CPU seconds a process spends on one message (software path and wake-up), unshared.
    cpu_s: float = 0.0
    #: Cores all simulated processes share (one machine); None: a core per process.
    cores: int | None = None
    #: Seconds Prague's Group Generator spends on one request; it serves one at a time, in
    #: arrival order (0: it answers at once).
    gg_request_s: float = 0.0

    def __post_init__(self):
        if self.alpha_s < 0 or not math.isfinite(self.alpha_s):
            raise UserError(f"network latency must be >= 0, got {self.alpha_s * 1e6:g} us")
        if self.beta_bytes_per_s <= 0 or not math.isfinite(self.beta_bytes_per_s):
            raise UserError("network bandwidth must be > 0 Gbit/s")
        if self.group_setup_s < 0:
            raise UserError(f"group set-up time must be >= 0, got {self.group_setup_s:g} s")
        if self.cpu_s < 0 or not math.isfinite(self.cpu_s):
            raise UserError(f"CPU time per message must be >= 0, got {self.cpu_s * 1e6:g} us")
        if self.cores is not None and self.cores < 1:
            raise UserError(f"cores must be >= 1, got {self.cores}")
        if self.gg_request_s < 0 or not math.isfinite(self.gg_request_s):
            raise UserError(f"Group Generator time per request must be >= 0, got "
                            f"{self.gg_request_s * 1e6:g} us")

    def share(self, active: int) -> float:
        """How much longer CPU work takes with `active` processes competing for the cores."""
        if self.cores is None or active <= self.cores:
            return 1.0
        return active / self.cores

    def hop(self, active: int = 1) -> float:
        """The per-message fixed cost: alpha plus the (shared) CPU time of the message."""
        return self.alpha_s + self.cpu_s * self.share(active)

    def message(self, nbytes: float, active: int = 1) -> float:
        """One point-to-point message sent while `active` processes compete for the CPU."""
        return self.hop(active) + nbytes / self.beta_bytes_per_s

    def ring_allreduce(self, nbytes: float, n: int, active: int | None = None) -> float:
        """Ring all-reduce of nbytes over n ranks: 2(n-1)/n * bytes/beta + 2(n-1) hops, each
        alpha + cpu_s * share(active); `active` (default n) is how many processes compete for
        the CPU meanwhile."""
        if n < 2:
            return 0.0
        hop = self.hop(n if active is None else active)
        return 2 * (n - 1) / n * nbytes / self.beta_bytes_per_s + 2 * (n - 1) * hop

    def p_reduce(self, nbytes: float, members: int, active: int | None = None) -> float:
        """P-Reduce over a group: the ring all-reduce formula over its members (0 alone)."""
        return self.ring_allreduce(nbytes, members, active)

    # -- by rank and time: what protocols call, so a run's Cluster (ClusterNetwork) can answer
    # the same questions with its links and NIC queues; here every link is alike.
    #: The run's hetbench.network Cluster, when the run has one (ClusterNetwork); None here.
    cluster = None

    def wire(self, src: int, dst: int, nbytes: float, at: float) -> float:
        """When a message sent at `at` arrives: alpha + bytes/beta (no CPU term)."""
        return at + self.alpha_s + nbytes / self.beta_bytes_per_s

    def message_to(self, src: int, dst: int, nbytes: float, at: float,
                   active: int = 1) -> float:
        """When a message sent at `at` arrives, with its CPU time (`message`)."""
        return at + self.message(nbytes, active)

    def ring(self, members, nbytes: float, at: float, active: int | None = None) -> float:
        """When a ring all-reduce over `members` that starts at `at` ends."""
        return at + self.ring_allreduce(nbytes, len(members), active)

    def rings(self, members, sizes, at: float, active: int | None = None) -> float:
        """When ring all-reduces of `sizes` (buckets), one after another, end."""
        return at + sum(self.ring_allreduce(b, len(members), active) for b in sizes)

    def rpc_one_way(self, w: int) -> float:
        """One way from worker w to a service on rank 0's node (the Group Generator)."""
        return self.alpha_s

    def exchange_s(self, degree, nbytes: float, active: int):
        """How long a worker's exchange with `degree` neighbours lasts once every one has
        arrived: one message of `nbytes` to and from each, sent together (one alpha and one
        transfer; each neighbour's message costs its share of the CPU). `degree` may be an
        array: every worker at once, on a lockstep path."""
        return (self.alpha_s + nbytes / self.beta_bytes_per_s
                + degree * self.cpu_s * self.share(active))

    def exchange(self, x: int, neighbours, nbytes: float, at: float, active: int) -> float:
        """When worker x's exchange with `neighbours` (a message of `nbytes` from each, and one
        to each) that begins at `at` ends (exchange_s on an event path)."""
        return at + self.exchange_s(len(neighbours), nbytes, active)


class ClusterNetwork:
    """A run's Cluster (its [network] table: hetbench.network.model) as the simulator's
    network: the same model, the same NIC queues (a Ledger on simulated time) as an emulated
    run of the same matrix, so the two compare cell by cell.

    The host's CPU is not modeled (cpu_s = 0): an emulated run's dilation is there to make it
    negligible, and its fidelity record says whether it was. Every shipped protocol asks by
    rank; one that asks without ranks (message, alpha_s, beta_bytes_per_s: a plug-in written
    for the alpha-beta model) gets the cluster's slowest link, inter-node, for every message,
    and no NIC queue.
    """

    cpu_s = 0.0
    cores = None
    #: Messages queue at NICs from the moment they are posted (post()), as in the emulator.
    queues_at_nics = True

    def __init__(self, cluster, base: NetworkModel):
        from hetbench.network.model import Ledger

        self.cluster = cluster
        self.ledger = Ledger(cluster.ports)
        #: round_trip_alone's answers, by (worker, server, push bytes, pull bytes).
        self._round_trips: dict[tuple, float] = {}
        #: Under transport = "fair" the engine's Transport moves every message as a flow: no
        #: message or ring may be booked first come first served beside them (post and ring
        #: refuse).
        self.fair = cluster.config.transport == "fair"
        # The cluster's own communicator set-up time, as its emulated runs pay it (the
        # alpha-beta model's, fitted from host runs, does not describe this cluster).
        self.group_setup_s = cluster.config.group_setup_ms / 1000
        self.gg_request_s = base.gg_request_s
        c = cluster.config
        several_nodes = max(cluster.node) > 0
        self.alpha_s = (c.inter_latency_us if several_nodes else c.intra_latency_us) * 1e-6
        self.beta_bytes_per_s = (min(c.nic_gbps, c.inter_gbps) if several_nodes
                                 else c.intra_gbps) * 1e9 / 8

    def share(self, active: int) -> float:
        return 1.0

    def hop(self, active: int = 1) -> float:
        return self.alpha_s

    def message(self, nbytes: float, active: int = 1) -> float:
        return self.alpha_s + nbytes / self.beta_bytes_per_s

    def ring_allreduce(self, nbytes: float, n: int, active: int | None = None) -> float:
        return self.cluster.ring(range(n), nbytes).duration_s

    def p_reduce(self, nbytes: float, members: int, active: int | None = None) -> float:
        return self.ring_allreduce(nbytes, members, active)

    def wire(self, src: int, dst: int, nbytes: float, at: float) -> float:
        return self.post(src, dst, nbytes, at)[1]

    def post(self, src: int, dst: int, nbytes: float, at: float) -> tuple[float, float]:
        """A message posted at `at`, queued at its NICs: (when its bytes are out of src's NIC,
        when it is delivered), as the emulator's send_begin reserves it."""
        if self.fair:
            self._first_come("a message")
        transfer = self.cluster.transfer(src, dst, nbytes, at)
        start = (self.ledger.reserve(transfer.ports, at, transfer.busy_s) if transfer.ports
                 else at)
        return start + transfer.busy_s, start + transfer.busy_s + transfer.latency_s

    def message_to(self, src: int, dst: int, nbytes: float, at: float,
                   active: int = 1) -> float:
        return self.wire(src, dst, nbytes, at)

    def round_trip_alone(self, worker: int, server: int, push_bytes: float,
                         pull_bytes: float) -> float:
        """A push to `server` and its pull back on idle links, queued nowhere: the part of a
        worker's step that is its own communication (the rest is waiting). Asked at every
        step of a server's workers, and fixed for a pair unless a network slowdown moves its
        NICs' rates: kept per pair then."""
        key = (worker, server, push_bytes, pull_bytes)
        known = self._round_trips.get(key)
        if known is None:
            push = self.cluster.transfer(worker, server, push_bytes)
            pull = self.cluster.transfer(server, worker, pull_bytes)
            known = push.latency_s + push.busy_s + pull.latency_s + pull.busy_s
            if self.cluster.nic_factor is None:
                self._round_trips[key] = known
        return known

    @staticmethod
    def _first_come(what: str) -> None:
        """Refuse a first-come booking beside a fair transport's flows."""
        raise RuntimeError(f"{what} booked first come first served under transport = "
                           "\"fair\": a protocol that plays it sends through "
                           "Protocol.transport and runs collectives with after_rings")

    def ring(self, members, nbytes: float, at: float, active: int | None = None) -> float:
        if self.fair:
            self._first_come("a ring")
        ring = self.cluster.ring(members, nbytes, at)
        if ring.duration_s == 0.0:
            return at
        start = max(at, self.ledger.free_at(ring.ports))
        self.ledger.book(ring.port_busy, start)
        return start + ring.duration_s

    def rings(self, members, sizes, at: float, active: int | None = None) -> float:
        for nbytes in sizes:
            at = self.ring(members, nbytes, at)
        return at

    def rpc_one_way(self, w: int) -> float:
        return self.cluster.rpc_s(w, 0) / 2

    def exchange_s(self, degree, nbytes: float, active: int):
        """On a cluster an exchange is its neighbours' links and x's NIC queue at that moment
        (exchange), which no duration alone gives; a lockstep path never asks for it here."""
        raise NotImplementedError("a cluster's exchange depends on its NIC queues: call "
                                  "exchange(x, neighbours, nbytes, at, active) on the event path")

    def exchange(self, x: int, neighbours, nbytes: float, at: float, active: int) -> float:
        """Each neighbour's message over its links, queued at x's NIC; the last one's arrival."""
        return max((self.wire(j, x, nbytes, at) for j in neighbours), default=at)


@dataclass(frozen=True)
class ComputeModel:
    """Seconds of compute per iteration: a constant, or fitted per workload from real runs.

    Fitted, each iteration's compute is drawn (seeded, per worker) from the real runs' unslowed
    iterations, so their jitter reaches the simulated waits: a synchronous step waits for the
    slowest of n draws, not for the median. The simulated algorithm's own iterations are drawn
    from where the fit has them (the same batch computed its own way costs its own time), the
    workload's otherwise. The pacing floor applies on top, as in a real run:
    compute = max(model's time, pace_ms).
    """

    #: A constant for every workload (seconds), overriding the rest.
    constant_s: float | None = None
    #: Fitted from real runs: (workload, pace_ms) -> sorted unslowed compute seconds.
    fitted: dict[tuple[str, float], tuple[float, ...]] = field(default_factory=dict)
    #: Fitted per algorithm: (workload, pace_ms, algorithm) -> the same, from that algorithm's
    #: iterations that computed the whole batch.
    fitted_by_algorithm: dict[tuple[str, float, str], tuple[float, ...]] = field(
        default_factory=dict)
    #: Where `fitted` came from (for error messages and the summary).
    fitted_from: str | None = None

    def __post_init__(self):
        if self.constant_s is not None and not self.constant_s >= 0:
            raise UserError(f"compute time must be >= 0 ms, got {self.constant_s * 1e3:g}")

    def seconds(self, config: RunConfig) -> float:
        """Compute seconds of one unslowed iteration of `config` (the median, when fitted)."""
        samples = self._samples(config)
        if samples is not None:
            return max(statistics.median(samples), config.pace_ms / 1000)
        return self._constant(config)

    def sampler(self, config: RunConfig) -> Callable[[int], float] | None:
        """draw(worker) -> one iteration's compute seconds, or None when compute is constant."""
        samples = self._samples(config)
        if samples is None:
            return None
        import numpy as np

        pace = config.pace_ms / 1000
        values = np.maximum(np.asarray(samples), pace).tolist()
        rngs = [np.random.default_rng([config.seed, w, 23]) for w in range(config.workers)]
        count = len(values)

        def draw(worker: int) -> float:
            return values[int(rngs[worker].integers(count))]

        return draw

    def _samples(self, config: RunConfig) -> tuple[float, ...] | None:
        if self.constant_s is not None or self.fitted_from is None:
            return None
        own = self._own(config)
        if own:
            return own
        key = (config.workload, float(config.pace_ms))
        if key not in self.fitted:
            have = ", ".join(f"{w} (pace {p:g} ms)" for w, p in sorted(self.fitted)) or "none"
            raise UserError(
                f"--fit-from {self.fitted_from}: no real run of {config.workload} with "
                f"pace_ms {config.pace_ms:g} to fit compute from (fitted: {have}); "
                "pass --compute-ms instead")
        return self.fitted[key]

    def _own(self, config: RunConfig) -> tuple[float, ...] | None:
        """The fitted iterations of config's own algorithm, workload and pace, if any."""
        return self.fitted_by_algorithm.get(
            (config.workload, float(config.pace_ms), config.algorithm))

    def _constant(self, config: RunConfig) -> float:
        pace = config.pace_ms / 1000
        if self.constant_s is not None:
            return max(self.constant_s, pace)
        if config.compute == "emulated":
            return max(config.workload_options["compute_ms"] / 1000, pace)
        if pace > 0:
            return pace
        raise UserError(
            f"no compute time for {config.workload}: pass --compute-ms MS, --pace-ms MS or "
            "--fit-from RESULTS_DIR (real runs of the workload)")

    def describe(self, config: RunConfig) -> str:
        if self.constant_s is not None:
            return "constant (--compute-ms)"
        if self.fitted_from is not None:
            whose = "its own" if self._own(config) else "every algorithm's"
            return f"drawn from {whose} unslowed real iterations in {self.fitted_from}"
        return "emulated compute_ms" if config.compute == "emulated" else "pace_ms"


@dataclass(frozen=True)
class SimModels:
    """Everything the simulator assumes about the machines it plays."""

    network: NetworkModel = NetworkModel()
    compute: ComputeModel = ComputeModel()

    def for_run(self, config: RunConfig) -> NetworkModel | ClusterNetwork:
        """The network a simulated run plays on: its own [network] Cluster if it has one."""
        cluster = config.cluster()
        return self.network if cluster is None else ClusterNetwork(cluster, self.network)

    def to_dict(self, config: RunConfig) -> dict[str, Any]:
        """The assumptions of one simulated run, for its summary.json (compute and message
        sizes: its timing workload's when it has one)."""
        costs = self._costs(config)
        if not config.timing:
            return costs
        timing = config.timing_config
        return {**costs, "timing_workload": timing.workload,
                "timing_batch_size": timing.workload_options["batch_size"],
                "timing_compute_preset": timing.workload_options.get("compute_preset") or None}

    def _costs(self, config: RunConfig) -> dict[str, Any]:
        config = config.timing_config
        if config.network:
            return {
                "network": config.cluster().describe(), "cpu_per_message_us": 0.0,
                "gg_request_us": self.network.gg_request_s * 1e6,
                "group_setup_ms": self.network.group_setup_s * 1e3,
                "compute_ms": self.compute.seconds(config) * 1e3,
                "compute_model": self.compute.describe(config),
                "model_bytes": layout(config).model_bytes,
            }
        return {
            "alpha_us": self.network.alpha_s * 1e6,
            "beta_gbps": self.network.beta_bytes_per_s * 8 / 1e9,
            "group_setup_ms": self.network.group_setup_s * 1e3,
            "cpu_per_message_us": self.network.cpu_s * 1e6,
            "cores": self.network.cores,
            "gg_request_us": self.network.gg_request_s * 1e6,
            "compute_ms": self.compute.seconds(config) * 1e3,
            "compute_model": self.compute.describe(config),
            "model_bytes": layout(config).model_bytes,
        }
