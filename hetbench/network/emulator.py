"""A run's network, emulated on its host: each Comm operation completes no sooner than the
network model's time for it, stretched by the dilation, while the real tensors still move.

Comm calls in here around each real operation (comm/comm.py, comm/preduce.py), from the common
start to the end of training; set-up and evaluation run at the host's own speed. The shaping
is in user space (a sleep until the modeled end), so it needs no root and no `tc` and works the
same under every launcher, as long as all ranks share one host (network/shared.py).

- A collective: its members agree on its modeled start, the latest of their arrivals and of
  the moments their NICs are free (a tiny MAX all-reduce of their own, before the real one),
  then each waits until start + the ring's modeled duration.
- A point-to-point message: the sender reserves the NICs on its way in the ledger (a busy NIC
  makes it queue), posts the delivery time in the mailbox and waits until its bytes are out;
  the receiver waits until the delivery time.

Fidelity: an operation whose real cost exceeds its modeled time finishes late, and the model
no longer holds. Every operation's lateness is summed against its modeled time; a run whose
share exceeds NetworkConfig.max_lateness is marked `fidelity: low` (raise the dilation, so
that the host's own costs shrink beside every modeled duration). This is the check network
emulators such as Mininet-HiFi make before they trust a result.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from hetbench.network import fair_service
from hetbench.network.model import Cluster, egress, ingress
from hetbench.network.shared import FILE_NAME, SharedState


class Fidelity:
    """How late the host made this rank's modeled operations (host seconds), in all and by
    kind of operation (collective, send, receive, rpc, compute), so that a low-fidelity run
    says which operations the host could not keep up with: a dilation hides a fixed host cost
    per operation, not every kind of lateness."""

    def __init__(self):
        #: Receives whose delivery time was not found (mailbox slot reused): not delayed.
        self.unmatched = 0
        #: Per kind: [operations, modeled seconds, late seconds, largest lateness]; the
        #: totals are their sums (to_dict).
        self.by_kind: dict[str, list] = {}

    def add(self, modeled_s: float, late_s: float, kind: str) -> None:
        tally = self.by_kind.get(kind)
        if tally is None:
            tally = self.by_kind[kind] = [0, 0.0, 0.0, 0.0]
        tally[0] += 1
        tally[1] += modeled_s
        if late_s > 0:
            tally[2] += late_s
            tally[3] = max(tally[3], late_s)

    def to_dict(self) -> dict:
        tallies = self.by_kind.values()
        return {"operations": sum(t[0] for t in tallies),
                "modeled_s": sum(t[1] for t in tallies),
                "late_s": sum(t[2] for t in tallies),
                "max_late_s": max((t[3] for t in tallies), default=0.0),
                "unmatched": self.unmatched,
                "by_kind": {kind: {"operations": n, "modeled_s": modeled, "late_s": late,
                                   "max_late_s": largest}
                            for kind, (n, modeled, late, largest) in self.by_kind.items()}}


def host_cpu() -> tuple[int, int] | None:
    """(idle, total) jiffies of the whole host since boot, from /proc/stat (None elsewhere)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return fields[3] + (fields[4] if len(fields) > 4 else 0), sum(fields[:8])


class Emulator:
    """One rank's view of the emulated network."""

    def __init__(self, model: Cluster, state: SharedState | None, rank: int,
                 clock: Callable[[], float] = time.monotonic):
        self.model = model
        self.state = state
        self.rank = rank
        self.k = model.config.dilation
        self.clock = clock
        self.ledger = None if state is None else state.ledger
        self.t0 = clock()
        self.fidelity = Fidelity()
        self._own_ports = (egress(rank), ingress(rank))
        self._sent: dict[tuple[int, int], int] = {}
        self._taken: dict[tuple[int, int], int] = {}
        self._cpu0 = host_cpu()

    @staticmethod
    def prepare(run_dir: Path, model: Cluster) -> None:
        """Rank 0, before the others open it: a fresh shared file (a rerun's is reset), or
        under transport = "fair" the run's transport service."""
        if model.config.transport == "fair":
            fair_service.start(run_dir, model)
        else:
            SharedState(Path(run_dir) / FILE_NAME, model.world_size, create=True).close()

    @staticmethod
    def open(run_dir: Path, model: Cluster, rank: int) -> Emulator:
        """This rank's emulator of the run's network (after rank 0's prepare)."""
        if model.config.transport == "fair":
            return FairEmulator(model, fair_service.ServiceClient(run_dir, rank), rank)
        return Emulator(model, SharedState(Path(run_dir) / FILE_NAME, model.world_size), rank)

    def close(self) -> None:
        self.state.close()

    def cluster_s(self, host_t: float) -> float:
        """Cluster seconds since this emulator opened (time for NIC slowdowns)."""
        return (host_t - self.t0) / self.k

    # -- collectives -------------------------------------------------------------------------
    def collective(self, members: Sequence[int], nbytes: int, agree: Callable[[float], float],
                   run: Callable[[], object], broadcast: bool = False,
                   arrived: float | None = None, setup_s: float = 0.0) -> None:
        """Run a collective over `members` (this rank among them) no faster than the model:
        `agree(t)` is the members' MAX of t (a real collective of their own), `run()` the real
        operation. `arrived`: when this rank came to it (default now; P-Reduce passes the
        moment before it built a communicator for the set, a rendezvous of the members whose
        real cost is the host's); `setup_s`: modeled cluster seconds of such a set-up."""
        if arrived is None:
            arrived = self.clock()
        ring = self.model.ring(members, nbytes, self.cluster_s(arrived), broadcast)
        if ring.duration_s == 0.0 and setup_s == 0.0:
            run()
            return
        k = self.k
        mine = [(p, busy * k) for p, busy in ring.port_busy if p in self._own_ports]
        ready = max(arrived, self.ledger.free_at([p for p, _ in mine])) if mine else arrived
        start = agree(ready)
        run()
        if mine:
            self.ledger.book(mine, start)
        modeled = (setup_s + ring.duration_s) * k
        self._until(start + modeled, modeled, "collective")

    # -- point to point ----------------------------------------------------------------------
    def send_begin(self, dst: int, nbytes: int, key: int) -> tuple[float, float]:
        """Before a real send: reserve its NICs and post its delivery; returns (posted, when
        its bytes are out) for send_end."""
        now = self.clock()
        transfer = self.model.transfer(self.rank, dst, nbytes, self.cluster_s(now))
        busy = transfer.busy_s * self.k
        start = self.ledger.reserve(transfer.ports, now, busy) if transfer.ports else now
        out = start + busy
        seq = self._sent.get((dst, key), 0)
        self._sent[(dst, key)] = seq + 1
        self.state.post(self.rank, dst, key, seq, now, out + transfer.latency_s * self.k)
        return now, out

    def send_due(self, out: float) -> float:
        """When a send begun with send_begin is done (its `out`): on this clock."""
        return out

    def send_end(self, posted: float, out: float, wait: bool = True) -> None:
        """After the real send: wait until the modeled bytes are out. A real send may finish
        late because its receiver was not ready (gloo hands large messages over only to a
        posted receive: AD-PSGD's passive peer busy with another request, a straggler), which
        is the protocol's waiting, not the host's: so a send counts only its own wait's
        overshoot, and each transfer's lateness is counted once, at its receive. Without
        `wait` (a send nobody waits for, let go: Work.let_go), it is only counted."""
        if not wait:
            self.fidelity.add(out - posted, 0.0, "send")
            return
        self._until(out, out - posted, "send", since=float("inf"))

    def recv_ticket(self, src: int, key: int) -> int:
        """This rank's next message number from src on stream `key`, taken when the receive
        is posted (in posting order: messages of one stream arrive in order), or for a
        receive from any sender once it names its sender."""
        seq = self._taken.get((src, key), 0)
        self._taken[(src, key)] = seq + 1
        return seq

    def delivery(self, src: int, key: int, seq: int) -> float:
        """When that message is delivered (0 when unknown), for a real receive that is done."""
        entry = self.state.read(src, self.rank, key, seq)
        return 0.0 if entry is None else entry[1]

    def recv_end(self, src: int, key: int, seq: int, since: float = float("-inf")) -> None:
        """After the real receive, waited for since `since`: wait until the message's modeled
        delivery."""
        entry = self.state.read(src, self.rank, key, seq)
        if entry is None:
            self.fidelity.unmatched += 1
            return
        posted, delivered = entry
        self._until(delivered, delivered - posted, "receive", since)

    def rpc(self, peer: int, started: float) -> None:
        """A small request to `peer` and its answer (the Group Generator's), its real call
        begun at `started` (this clock): it lasts at least the round trip's latency."""
        self.wait(self.model.rpc_s(self.rank, peer) * self.k, started, "rpc")

    def wait(self, modeled_s: float, started: float, kind: str = "compute") -> None:
        """A modeled wait (emulated compute, an RPC) begun at `started`: until started +
        modeled_s, recorded for fidelity like a transfer (as `kind`)."""
        self._until(started + modeled_s, modeled_s, kind)

    def _until(self, end: float, modeled_s: float, kind: str,
               since: float = float("-inf")) -> None:
        """The real operation is done now: wait until its modeled `end`, and record how late
        the host made it. Only the part the network is to blame for counts: a receive that
        this rank began waiting for at `since`, after its modeled delivery (it was busy
        elsewhere), is late by its real cost from `since` on, not by the time it sat unread."""
        now = self.clock()
        late = now - max(end, since)
        if now < end:
            time.sleep(end - now)
            late = self.clock() - end  # the sleep's own overshoot
        self.fidelity.add(modeled_s, late, kind)

    def report(self) -> dict:
        """This rank's fidelity record (done.rank<r>.json's `network`)."""
        record = self.fidelity.to_dict()
        cpu = host_cpu()
        if cpu is not None and self._cpu0 is not None and cpu[1] > self._cpu0[1]:
            record["host_idle"] = (cpu[0] - self._cpu0[0]) / (cpu[1] - self._cpu0[1])
        return record


class FairEmulator(Emulator):
    """The emulated network under `transport = "fair"`: every send, receive post and
    collective arrival goes to the run's transport service (fair_service.py), which sees
    every rank's and answers when each is done; what the host made late is recorded as
    Emulator records it. Collectives are ring flows there (refused with collective = "tree",
    as in bench sim), and NICs keep their speed (no network slowdown)."""

    def __init__(self, model: Cluster, client: fair_service.ServiceClient, rank: int,
                 clock: Callable[[], float] = time.monotonic):
        super().__init__(model, None, rank, clock)
        self.client = client
        self._collectives: dict[tuple[int, ...], int] = {}

    def close(self) -> None:
        self.client.close()

    def collective(self, members, nbytes, agree, run, broadcast=False, arrived=None,
                   setup_s=0.0) -> None:
        ranks = tuple(sorted(set(members)))
        if len(ranks) < 2 and setup_s == 0.0:
            run()
            return
        seq = self._collectives.get(ranks, 0)
        self._collectives[ranks] = seq + 1
        # The arrival, stamped now or when it came (a P-Reduce's, before its set-up).
        self.client.tell_at(self.clock() if arrived is None else arrived, "ring", list(ranks),
                            nbytes, broadcast, seq, setup_s)
        run()
        end, modeled = self.client.ask("wait", ["ring", list(ranks), seq])
        self._until(end, modeled, "collective")

    def send_begin(self, dst: int, nbytes: int, key: int) -> tuple[float, list]:
        seq = self._sent.get((dst, key), 0)
        self._sent[(dst, key)] = seq + 1
        posted = self.clock()
        self.client.tell("send", self.rank, dst, nbytes, key, seq)
        return posted, ["sent", self.rank, dst, key, seq]

    def send_due(self, out: list) -> float:
        due = self.client.ask("query", out)
        return float("inf") if due is None else due

    def send_end(self, posted: float, out: list, wait: bool = True) -> None:
        if not wait:
            self.client.tell("forget", out)
            self.fidelity.add(0.0, 0.0, "send")
            return
        end, modeled = self.client.ask("wait", out)
        self._until(end, modeled, "send", since=float("inf"))

    def recv_ticket(self, src: int, key: int) -> int:
        seq = super().recv_ticket(src, key)
        self.client.tell("recv", self.rank, src, key)
        return seq

    def delivery(self, src: int, key: int, seq: int) -> float:
        due = self.client.ask("query", ["delivered", src, self.rank, key, seq])
        return float("inf") if due is None else due

    def recv_end(self, src: int, key: int, seq: int, since: float = float("-inf")) -> None:
        end, modeled = self.client.ask("wait", ["delivered", src, self.rank, key, seq])
        self._until(end, modeled, "receive", since)
