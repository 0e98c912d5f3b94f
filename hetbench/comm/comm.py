"""Comm: the only code in hetbench that touches torch.distributed.

Algorithms talk to peers through this object, so the transport and its timeouts live in one
place (one module on purpose, longer than most: every torch.distributed call is here). Every
blocking call is bounded by the process group's timeout, so a dead peer turns into an exception
instead of a hang.

Which backend: gloo on CPU; NCCL on CUDA when every rank has a GPU of its own; gloo again when
ranks share a GPU (more ranks on a host than it has GPUs), since NCCL refuses two ranks on one
device (nccl#418, "Duplicate GPU detected"). Gloo reduces and broadcasts CUDA tensors itself but
has no CUDA path for point to point, so with CUDA tensors on gloo every send and receive here goes
through a host buffer (`stages_through_host`: pinned, reused buffers and copies that overlap the
previous message's send, comm/staging.py).

Which primitive for which pattern:
- every worker together (all-reduce, average, broadcast, barrier): `members=ctx.worker_ranks`
  (or None for the whole world, server ranks included);
- fixed groups known at setup: create them in setup() with `group(members)` on every rank, in
  the same order (torch's new_group is collective over the world), then pass `members=`;
- groups formed on the fly, by their members alone (a different partner each step): `p_reduce_`
  (the mean over the members); `average_(members=...)` does the same for a set that had no group
  at setup. Any other collective over such a set is refused at once (CommMisuse), since it
  would need every rank of the world and hang until the timeout;
- point to point: send/recv/isend/irecv, or a `channel` (made in setup) for a serving thread.

With a network model (a run's `[network]` table), `network` is set for training: every
operation here then lasts at least its modeled time (hetbench/network/emulator.py).
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from hetbench.comm.preduce import MemberGroups
from hetbench.comm.staging import HostStaging
from hetbench.network.shared import stream_key

ReduceOp = dist.ReduceOp
WORLD = "world"  # the stream name of messages on the world group (network/shared.py)
#: Point-to-point tag of measure_staged_bandwidth's messages (before training: no algorithm's
#: message is in flight then). The harness's other reserved tags: 71 (harness/evaluation.py's
#: TARGET_TAG) and 73 (comm/clock.py's CLOCK_TAG).
STAGED_PROBE_TAG = 72
#: Store keys of the backend vote (choose_backend).
_SHARED_GPU_KEY, _VOTES_KEY = "hetbench/comm/shared-gpu", "hetbench/comm/backend-votes"


@dataclass
class StepRecord:
    """What one step's Comm operations did (Comm.record_step / recorded_step)."""

    #: The ranks they involved (this rank's own included when a collective spanned it).
    met: set[int] = field(default_factory=set)
    #: Seconds blocked on point-to-point operations: send, recv, and the wait() of isend and
    #: irecv. Collectives are not in it: their wait is the last member's arrival minus this
    #: rank's, which the reports infer from every rank's log, and the rest is transfer.
    blocked_s: float = 0.0


@dataclass
class Traffic:
    """Bytes this rank's operations moved (every thread's), for the bytes-per-iteration a run
    reports: point to point sent and received (tensor bytes), and the payload of collectives
    (the tensor's bytes, whatever the backend's algorithm puts on the wire)."""

    p2p_sent_bytes: int = 0
    p2p_received_bytes: int = 0
    collective_bytes: int = 0
    messages: int = 0


class CommMisuse(RuntimeError):
    """An operation that could only hang: refused at once, with the primitive to use instead."""


class Comm:
    """Point-to-point and collective operations over the run's world of ranks (`ctx.comm`).

    Which primitive for which pattern:

    - every worker together (all-reduce, average, broadcast, barrier): `all_reduce_`,
      `average_`, `broadcast_`, `barrier` with `members=ctx.worker_ranks` (None: the whole
      world, server ranks included);
    - fixed groups known at setup: `group(members)` in setup() on every rank, in the same order
      (torch's new_group is collective over the world), then `members=` in the calls above;
    - groups formed on the fly by their members alone (a different partner each step):
      `p_reduce_(tensor, members)`, the mean over the members; `average_(members=...)` does the
      same for a set that had no group at setup. Any other collective over such a set is refused
      at once (CommMisuse): it would need every rank of the world and hang;
    - point to point: `send`/`recv`/`isend`/`irecv` (recv from any sender with src=None, on
      gloo), or a `channel(name)` made in setup for a serving thread, used through the `*_on`
      forms (`recv_head_on` also returns a message's header, read without waiting for the
      device); `rpc(peer, call)` for a request to a service on a peer's node. Every isend's
      work is waited: `wait()` where the protocol waits for it, or `let_go()` (the real send
      only) where it never does; gloo lets a sent message go only then.

    Every call is bounded by the run's timeout (a dead peer is an exception, not a hang), and
    the harness records, per step, the ranks the calls met and the seconds point-to-point ones
    blocked (the step's wait_s unless StepInfo says). Tags 71, 72 and 73 on the world group are
    the harness's (evaluation's time-to-target search, a staged message's speed, the clock
    exchanges): an algorithm's messages use others. With CUDA tensors on gloo (ranks sharing a
    GPU) point to point goes through host memory (comm/staging.py); with a `[network]` table
    every operation lasts at least its modeled time.
    """

    def __init__(self, rank: int, world_size: int, device: torch.device, backend: str,
                 store: dist.Store, timeout_s: float):
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.backend = backend
        self.store = store
        self.timeout = datetime.timedelta(seconds=timeout_s)
        # World-collective groups (setup-time, never evicted) and named channels.
        self._groups: dict[tuple[int, ...], object] = {}
        self._channels: dict[tuple, object] = {}
        #: P-Reduce's member communicators (comm/preduce.py).
        self.member_groups = MemberGroups(rank, backend, store, self.timeout)
        # Groups and channels can be created (collectively, by every rank) until end_setup().
        self._setup_open = True
        #: The emulated network (network/emulator.py) while training, or None.
        self.network = None
        self._channel_names: dict[object, str] = {}
        #: Point to point through host memory: gloo has no CUDA path for it. A test may set it
        #: on a CPU world to run the staging code, which then copies CPU tensors.
        self.stages_through_host = backend == "gloo" and device.type == "cuda"
        self._staging: HostStaging | None = None
        #: What this rank's operations moved since the last reset (the worker resets it when
        #: training starts and reads it when training ends).
        self.traffic = Traffic()
        self._traffic_lock = threading.Lock()
        # What one thread's operations did during a step (record_step): the ranks they met
        # and the seconds they blocked on point-to-point messages. The harness logs them for
        # every step, whatever the algorithm says, for "who waited for whom".
        self._recording_thread: int | None = None
        self._met: set[int] = set()
        self._blocked_s = 0.0

    @classmethod
    def connect(cls, rank: int, world_size: int, host: str | None, port: int | None,
                device: torch.device, timeout_s: float, store: dist.Store | None = None,
                local_rank: int | None = None) -> Comm:
        """Join the run's world through the launcher's TCP store at host:port, or through
        `store` when the rendezvous already made one (torchrun's agent store, MPI's rank 0).
        `local_rank` is this rank's index on its host (default: `rank`, one host)."""
        timeout = datetime.timedelta(seconds=timeout_s)
        if store is None:
            store = dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
        if device.type == "cuda":
            torch.cuda.set_device(device)  # gloo's CUDA work and new tensors default to it
        backend = choose_backend(device, rank if local_rank is None else local_rank, store,
                                 world_size, timeout_s)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=timeout,
                                device_id=device if backend == "nccl" else None)
        return cls(rank, world_size, device, backend, store, timeout_s)

    @property
    def staging(self) -> HostStaging:
        """The host buffers of staged point to point (made on first use)."""
        if self._staging is None:
            self._staging = HostStaging(self.device)
        return self._staging

    def measure_staged_bandwidth(self, peer: int, numel: int, rounds: int = 3) -> float:
        """MB/s (1e6 bytes) of one staged message between this rank and `peer`, who calls it
        too: round trips of a `numel`-float tensor on this rank's device, after one warm-up,
        halved. What point to point through host memory costs on this host, for the report."""
        tensor = torch.zeros(numel, device=self.device)
        first = self.rank < peer
        started = 0.0
        for i in range(rounds + 1):
            if i == 1:
                started = time.perf_counter()
            if first:
                self.send(tensor, peer, tag=STAGED_PROBE_TAG)
                self.recv(tensor, peer, tag=STAGED_PROBE_TAG)
            else:
                self.recv(tensor, peer, tag=STAGED_PROBE_TAG)
                self.send(tensor, peer, tag=STAGED_PROBE_TAG)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        one_way_s = (time.perf_counter() - started) / rounds / 2
        return _nbytes(tensor) / 1e6 / one_way_s

    def describe(self) -> dict[str, object]:
        """What this rank ran on, for its done record and the report's metadata."""
        return {"backend": self.backend, "device": str(self.device),
                "host_staged_p2p": self.stages_through_host}

    # -- what a step did ---------------------------------------------------------------------
    def record_step(self) -> None:
        """Start noting what this thread's operations do: the ranks they involve and the
        seconds they block on point-to-point messages (the harness calls it around each step;
        a serving thread's operations are not the step's)."""
        self._recording_thread, self._met, self._blocked_s = threading.get_ident(), set(), 0.0

    def recorded_step(self) -> StepRecord:
        """What this thread's operations did since record_step(), and stop noting."""
        record = StepRecord(self._met, self._blocked_s)
        self._met, self._blocked_s, self._recording_thread = set(), 0.0, None
        return record

    def _meet(self, ranks) -> None:
        if self._recording_thread == threading.get_ident():
            self._met.update(ranks)

    def _blocked(self, since: float) -> None:
        """A point-to-point operation of this thread blocked from `since` (perf_counter) until
        now: the step's waiting for its peers' messages (and their transfer, which a rank
        alone cannot tell apart: the reports split them with the peers' arrivals)."""
        if self._recording_thread == threading.get_ident():
            self._blocked_s += time.perf_counter() - since

    def end_setup(self) -> None:
        """Training starts: from now on a subset of ranks without a group is formed on the fly,
        by its members alone, so creating one through torch (a collective over the whole world)
        could only hang; group() and channel() refuse it, average_() uses p_reduce_."""
        self._setup_open = False

    def start_network(self, emulator) -> None:
        """Training starts on an emulated network (every rank, together): `emulator` is in
        force before the common start, a tiny all-reduce outside the emulation, so that any
        message of training, sent after that start, meets a receiver that emulates it."""
        self.network = emulator
        dist.all_reduce(torch.zeros(1, device=self.device))

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    # -- collectives -------------------------------------------------------------------------
    def all_reduce_(self, tensor: torch.Tensor, op: ReduceOp = ReduceOp.SUM,
                    members: Sequence[int] | None = None) -> torch.Tensor:
        """In-place all-reduce over the world, or over `members` (a group made by `group`)."""
        group = self.group(members)
        self._collective(members, group, tensor,
                         lambda: dist.all_reduce(tensor, op=op, group=group))
        return tensor

    def average_(self, tensor: torch.Tensor, members: Sequence[int] | None = None) -> torch.Tensor:
        """In-place mean over the world or over `members`: a group made at setup, or (after
        setup) any set this rank belongs to, formed on the fly (then it is p_reduce_)."""
        if members is not None and not self._setup_open and not self._is_made(members):
            return self.p_reduce_(tensor, members)
        n = self.world_size if members is None else len(members)
        self.all_reduce_(tensor, members=members)
        return tensor.div_(n)

    def _is_made(self, members: Sequence[int]) -> bool:
        """Whether group(members) is the world or a group made at setup (no collective)."""
        key = tuple(sorted(members))
        return len(key) == self.world_size or key in self._groups

    def broadcast_(self, tensor: torch.Tensor, src: int,
                   members: Sequence[int] | None = None) -> torch.Tensor:
        group = self.group(members)
        self._collective(members, group, tensor,
                         lambda: dist.broadcast(tensor, src=src, group=group), broadcast=True)
        return tensor

    def _collective(self, members: Sequence[int] | None, group, tensor: torch.Tensor, run,
                    broadcast: bool = False) -> None:
        """run() the real collective, or, with an emulated network, no faster than modeled."""
        self._meet(range(self.world_size) if members is None else members)
        with self._traffic_lock:
            self.traffic.collective_bytes += _nbytes(tensor)
        if self.network is None:
            run()
            return
        ranks = range(self.world_size) if members is None else members
        self.network.collective(ranks, _nbytes(tensor), lambda t: self._latest(t, group), run,
                                broadcast=broadcast)

    def _latest(self, t: float, group) -> float:
        """The MAX of t over a group's ranks (the emulated network's agreed start)."""
        value = torch.tensor([t], dtype=torch.float64, device=self.device)
        dist.all_reduce(value, op=ReduceOp.MAX, group=group)
        return value.item()

    def barrier(self, members: Sequence[int] | None = None) -> None:
        # A barrier is a tiny all-reduce: gloo's barrier ignores the group timeout in some builds.
        flag = torch.zeros(1, device=self.device)
        self.all_reduce_(flag, members=members)

    # -- point to point ----------------------------------------------------------------------
    def send(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> None:
        self.send_on(None, tensor, dst, tag)

    def recv(self, tensor: torch.Tensor, src: int | None = None, tag: int = 0) -> int:
        """Receive into `tensor` from `src` (any rank if None); returns the sender's rank."""
        return self.recv_on(None, tensor, src, tag)

    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> dist.Work:
        return self.isend_on(None, tensor, dst, tag)

    def irecv(self, tensor: torch.Tensor, src: int | None = None, tag: int = 0) -> dist.Work:
        return self.irecv_on(None, tensor, src, tag)

    # -- groups ------------------------------------------------------------------------------
    def channel(self, name: str, members: Sequence[int] | None = None):
        """A process group of its own for `members` (default: the world), e.g. for a thread
        that serves peers while the main thread computes: collectives on different groups
        never interleave. Creation is collective over the world: call it from setup() on every
        rank, in the same order. Use it through the *_on methods.
        """
        key = (name, tuple(sorted(members)) if members is not None else None)
        if key not in self._channels and not self._setup_open:
            raise CommMisuse(f"Comm: channel {name!r} was first asked for after setup; channels "
                             "are made by every rank together: create it in setup()")
        if key not in self._channels:
            ranks = list(key[1]) if key[1] is not None else list(range(self.world_size))
            self._channels[key] = dist.new_group(ranks, timeout=self.timeout)
            self._channel_names[self._channels[key]] = f"{name}{list(key[1] or ())}"
        return self._channels[key]

    def _stream(self, group, tag: int) -> int:
        return stream_key(WORLD if group is None else self._channel_names[group], tag)

    def _sent(self, tensor: torch.Tensor) -> None:
        with self._traffic_lock:  # serving threads count their messages too
            self.traffic.p2p_sent_bytes += _nbytes(tensor)
            self.traffic.messages += 1

    def _received(self, tensor: torch.Tensor) -> None:
        with self._traffic_lock:
            self.traffic.p2p_received_bytes += _nbytes(tensor)

    def send_on(self, group, tensor: torch.Tensor, dst: int, tag: int = 0) -> None:
        """Send on a channel (None: the world group); `dst` is a global rank."""
        self._meet((dst,))
        self._sent(tensor)
        since = time.perf_counter()
        staged = self.staging.outgoing(tensor) if self.stages_through_host else None
        message = tensor if staged is None else staged
        try:
            if self.network is None:
                dist.send(message, dst=dst, group=group, tag=tag)
            else:
                posted, out = self.network.send_begin(dst, _nbytes(tensor),
                                                      self._stream(group, tag))
                dist.send(message, dst=dst, group=group, tag=tag)
                self.network.send_end(posted, out)
        finally:
            if staged is not None:
                self.staging.give_back(staged)
        self._blocked(since)

    def recv_on(self, group, tensor: torch.Tensor, src: int | None = None, tag: int = 0) -> int:
        """Receive on a channel; `src` and the returned sender are global ranks."""
        return self._recv_on(group, tensor, src, tag, head=0)[0]

    def recv_head_on(self, group, tensor: torch.Tensor, head: int, src: int | None = None,
                     tag: int = 0) -> tuple[int, list]:
        """recv_on, and the message's first `head` values as Python numbers, read where the
        message landed in host memory: a serving thread learns what a message is without
        waiting for the device. (Reading them off a CUDA tensor waits for everything queued on
        the stream it shares with the main thread's compute: issue 44 found Hop's receiver
        handling each message only once the GPU had run its rank's forward and backward.)"""
        return self._recv_on(group, tensor, src, tag, head)

    def _recv_on(self, group, tensor, src, tag, head):
        # A serving thread's receive may be posted before the network starts (in setup) and
        # complete after it, on a message of training: it is matched with its modeled delivery
        # all the same, by the network in force when it completes (each message of a stream
        # takes its number then, so none is skipped and no later one reads an earlier's).
        if src is None and self.backend == "nccl":  # refused before anything is posted
            raise CommMisuse("Comm: NCCL has no receive from any sender (recv(src=None)); this "
                             "algorithm needs gloo: run it with device = \"cpu\", or with its "
                             "ranks sharing a GPU (gloo on CUDA tensors)")
        posted_under = self.network
        started = time.perf_counter()
        since = float("-inf") if posted_under is None else posted_under.clock()
        # A receive from a known sender is posted now (the fair transport moves its message
        # only from then on); one from any sender once it names its sender, below.
        ticket = None
        if posted_under is not None and src is not None:
            ticket = posted_under.recv_ticket(src, self._stream(group, tag))
        if self.stages_through_host:
            host = self.staging.incoming(tensor)
            sender = dist.recv(host, src=src, group=group, tag=tag)
            values = host.view(-1)[:head].tolist() if head else []
            self.staging.deliver(host, tensor)
        else:
            sender = dist.recv(tensor, src=src, group=group, tag=tag)
            # On CPU a read; on NCCL (a GPU per rank) the receive is the device's anyway.
            values = tensor.view(-1)[:head].tolist() if head else []
        self._meet((sender,))
        self._received(tensor)
        network = self.network
        if network is not None:
            key = self._stream(group, tag)
            if ticket is None or network is not posted_under:
                ticket = network.recv_ticket(sender, key)
            network.recv_end(sender, key, ticket, since)
        self._blocked(started)
        return sender, values

    def isend_on(self, group, tensor: torch.Tensor, dst: int, tag: int = 0) -> dist.Work:
        return _Timed(self._isend_on(group, tensor, dst, tag), self._blocked)

    def _isend_on(self, group, tensor: torch.Tensor, dst: int, tag: int):
        self._meet((dst,))
        self._sent(tensor)
        message = tensor
        if self.stages_through_host:
            # What is sent is this copy: the caller's tensor may change once isend returns.
            # The buffer returns to the pool once the send is done with it.
            message = self.staging.outgoing(tensor)
        if self.network is None:
            work = dist.isend(message, dst=dst, group=group, tag=tag)
        else:
            posted, out = self.network.send_begin(dst, _nbytes(tensor),
                                                  self._stream(group, tag))
            network = self.network
            work = _Modeled(dist.isend(message, dst=dst, group=group, tag=tag),
                            lambda: network.send_due(out),
                            lambda since: network.send_end(posted, out),
                            lambda: network.send_end(posted, out, wait=False))
        if message is not tensor:
            self.staging.give_back(message, work.is_completed)
        return work

    def irecv_on(self, group, tensor: torch.Tensor, src: int | None = None,
                 tag: int = 0) -> dist.Work:
        return _Timed(self._irecv_on(group, tensor, src, tag), self._blocked)

    def _irecv_on(self, group, tensor: torch.Tensor, src: int | None, tag: int):
        if self.network is None:
            return self._irecv(group, tensor, src, tag)
        if src is None:  # refused before anything is posted
            raise CommMisuse("Comm: an emulated network needs irecv's sender (src) to find the "
                             "message's modeled delivery; use recv(src=None) for any sender")
        work = self._irecv(group, tensor, src, tag)
        network, key = self.network, self._stream(group, tag)
        seq = network.recv_ticket(src, key)
        return _Modeled(work, lambda: network.delivery(src, key, seq),
                        lambda since: network.recv_end(src, key, seq, since))

    def _irecv(self, group, tensor: torch.Tensor, src: int | None, tag: int):
        if src is not None:
            self._meet((src,))
        self._received(tensor)
        if not self.stages_through_host:
            return dist.irecv(tensor, src=src, group=group, tag=tag)
        host = self.staging.incoming(tensor)
        return _ThenOnce(dist.irecv(host, src=src, group=group, tag=tag),
                         lambda since: self.staging.deliver(host, tensor))

    def group(self, members: Sequence[int] | None):
        """The process group of `members` (None = the world), created on first use and cached.

        torch's new_group is collective over the whole world: every rank must ask for the same
        member sets in the same order (as at setup). Groups formed on the fly by their members
        alone are p_reduce_'s (comm/preduce.py).
        """
        if members is None:
            return None
        key = tuple(sorted(members))
        if len(key) == self.world_size:
            return None
        if key in self._groups:
            return self._groups[key]
        if not self._setup_open:
            raise CommMisuse(
                f"Comm: ranks {list(key)} have no group, and one made now would need every rank "
                "of the world (a hang): create fixed groups in setup() with ctx.comm.group("
                "members); for groups formed on the fly use ctx.comm.p_reduce_(tensor, members)")
        group = dist.new_group(list(key), timeout=self.timeout, use_local_synchronization=False)
        self._groups[key] = group
        return group

    # -- P-Reduce: groups formed on the fly by their members alone (comm/preduce.py) ---------
    def configure_p_reduce(self, cache_size: int) -> None:
        """How many member communicators this rank keeps (an algorithm's setup sets it)."""
        self.member_groups.cache_size = cache_size

    def p_reduce_(self, tensor: torch.Tensor, members: Sequence[int]) -> torch.Tensor:
        """In-place mean of `tensor` over `members` (this rank among them); others not involved."""
        self._meet(members)
        with self._traffic_lock:
            self.traffic.collective_bytes += _nbytes(tensor)
        return self.member_groups.p_reduce_(tensor, members, self.network)

    def rpc(self, peer: int, call):
        """`call()`, a request to a service on `peer`'s node (the Group Generator), lasting at
        least the emulated network's round trip; its result."""
        if self.network is None:
            return call()
        started = self.network.clock()
        result = call()
        self.network.rpc(peer, started)
        return result

    def close_member_groups(self, wait: bool = True) -> None:
        """Drop this rank's member communicators (MemberGroups.close)."""
        self.member_groups.close(wait)

    # -- arrivals (asynchronous decentralized algorithms: AD-PSGD, Hop) ----------------------
    def wait_for_arrivals(self, name: str, count: int, poll_s: float = 0.05) -> None:
        """Count this rank in at `name`, then block until `count` ranks have, without a timeout.

        Asynchronous workers may finish their budgets tens of seconds apart (a deterministic
        straggler running its own iterations); the collectives that follow would time out on it.
        The store is polled instead, as long as it takes: the launcher ends a run whose rank
        fails or stops logging progress.
        """
        key = f"hetbench/arrivals/{name}"
        arrived = self.store.add(key, 1)
        while arrived < count:
            time.sleep(poll_s)
            arrived = self.store.add(key, 0)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def choose_backend(device: torch.device, local_rank: int, store: dist.Store, world_size: int,
                   timeout_s: float) -> str:
    """gloo, or NCCL when the device is CUDA and no two ranks of the world share a GPU.

    A host with more ranks than GPUs has a rank whose local index is at least its GPU count,
    and only that rank can tell; every rank counts its vote in the store and reads the total
    once all have, so the world agrees on one backend (two would hang in their first
    collective)."""
    if device.type != "cuda":
        return "gloo"
    shares_a_gpu = local_rank >= torch.cuda.device_count()
    store.add(_SHARED_GPU_KEY, int(shares_a_gpu))
    store.add(_VOTES_KEY, 1)
    deadline = time.monotonic() + timeout_s
    while store.add(_VOTES_KEY, 0) < world_size:
        if time.monotonic() > deadline:
            raise RuntimeError(f"Comm: {store.add(_VOTES_KEY, 0)} of {world_size} ranks chose "
                               f"a backend in {timeout_s:.0f} s; the others never joined")
        time.sleep(0.01)
    return "gloo" if store.add(_SHARED_GPU_KEY, 0) else "nccl"


class _ThenOnce:
    """A torch Work whose wait() also runs `then(since)` once, after the real operation:
    delivering a receive staged in host memory, or waiting out the emulated network.

    `since` is when this rank began waiting on a real operation still in flight; one already
    done when wait() is called finished at an unknown earlier moment (inf: the emulator does
    not count it late, since the rank was busy elsewhere, not the network slow)."""

    def __init__(self, work, then):
        self._work, self._then = work, then

    def wait(self, timeout=None) -> bool:
        since = float("inf") if self._work.is_completed() else time.monotonic()
        if timeout is None:
            self._work.wait()
        else:
            self._work.wait(timeout)
        if self._then is not None:
            then, self._then = self._then, None
            then(since)
        return True

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def let_go(self) -> None:
        self.wait()


class _Modeled(_ThenOnce):
    """A torch Work whose wait() also waits for the emulated network (once): `due()` is the
    modeled end on the emulator's clock (time.monotonic), `finish(since)` waits for it;
    let_go() waits for the real send only and counts the modeled one with `record()`."""

    def __init__(self, work, due, finish, record=None):
        super().__init__(work, finish)
        self._due, self._record = due, record

    def let_go(self) -> None:
        if self._record is None:
            self.wait()
            return
        self._work.wait()
        if self._then is not None:
            self._then = None
            self._record()

    def is_completed(self) -> bool:
        """Whether wait() would return at once: the real operation is done and so is the
        modeled one."""
        return self._work.is_completed() and (
            self._then is None or time.monotonic() >= self._due())


class _Timed:
    """A Work whose wait() reports how long it blocked (Comm._blocked: the step's waiting on
    point-to-point messages, when the step's own thread waits)."""

    def __init__(self, work, blocked):
        self._work, self._report = work, blocked

    def wait(self, timeout=None) -> bool:
        since = time.perf_counter()
        done = self._work.wait() if timeout is None else self._work.wait(timeout)
        self._report(since)
        return done

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def let_go(self) -> None:
        """For a sender that never waits for its sends (its protocol does not): wait for the
        real send only, so that its message (and its staged buffer) can go (gloo marks a send
        complete only once waited), without the modeled network's wait and without counting
        it as this step's blocking."""
        let_go = getattr(self._work, "let_go", None)
        if let_go is None:
            self._work.wait()
        else:
            let_go()
