"""Comm: the only code in hetbench that touches torch.distributed.

Algorithms talk to peers through this object, so the transport (gloo on CPU, NCCL on CUDA) and
its timeouts live in one place. Every blocking call is bounded by the process group's timeout, so
a dead peer turns into an exception instead of a hang.

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
"""

from __future__ import annotations

import datetime
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence

import torch
import torch.distributed as dist

ReduceOp = dist.ReduceOp


class CommMisuse(RuntimeError):
    """An operation that could only hang: refused at once, with the primitive to use instead."""


class Comm:
    """Point-to-point and collective operations over the run's world of ranks."""

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
        # P-Reduce state (see the P-Reduce section below).
        #: Member communicators kept per rank (LRU); Prague sets it from its cache_size option.
        self.preduce_cache_size = 16
        self.preduce_cache_hits = 0
        self.preduce_cache_misses = 0
        # (members) -> communicator in LRU order; (members) -> uses so far. Use counts are equal
        # on all members of a set (each use involves all of them), so they name the store key
        # of the next use without any extra round trip.
        self._preduce_comms: OrderedDict[tuple[int, ...], object] = OrderedDict()
        self._preduce_uses: dict[tuple[int, ...], int] = {}
        self._preduce_stale: list[str] = []
        self._preduce_reaper: tuple[queue.SimpleQueue, threading.Thread] | None = None
        self._gloo_device = None
        # Groups and channels can be created (collectively, by every rank) until end_setup().
        self._setup_open = True

    @classmethod
    def connect(cls, rank: int, world_size: int, host: str | None, port: int | None,
                device: torch.device, timeout_s: float, store: dist.Store | None = None) -> Comm:
        """Join the run's world through the launcher's TCP store at host:port, or through
        `store` when the rendezvous already made one (torchrun's agent store, MPI's rank 0)."""
        backend = "nccl" if device.type == "cuda" else "gloo"
        if store is None:
            store = dist.TCPStore(host, port, world_size, is_master=False,
                                  timeout=datetime.timedelta(seconds=timeout_s))
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s),
                                device_id=device if device.type == "cuda" else None)
        return cls(rank, world_size, device, backend, store, timeout_s)

    def end_setup(self) -> None:
        """Training starts: from now on a subset of ranks without a group is formed on the fly,
        by its members alone, so creating one through torch (a collective over the whole world)
        could only hang; group() and channel() refuse it, average_() uses p_reduce_."""
        self._setup_open = False

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    # -- collectives -------------------------------------------------------------------------
    def all_reduce_(self, tensor: torch.Tensor, op: ReduceOp = ReduceOp.SUM,
                    members: Sequence[int] | None = None) -> torch.Tensor:
        """In-place all-reduce over the world, or over `members` (a group made by `group`)."""
        dist.all_reduce(tensor, op=op, group=self.group(members))
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
        dist.broadcast(tensor, src=src, group=self.group(members))
        return tensor

    def barrier(self, members: Sequence[int] | None = None) -> None:
        # A barrier is a tiny all-reduce: gloo's barrier ignores the group timeout in some builds.
        flag = torch.zeros(1, device=self.device)
        self.all_reduce_(flag, members=members)

    # -- point to point ----------------------------------------------------------------------
    def send(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> None:
        dist.send(tensor, dst=dst, tag=tag)

    def recv(self, tensor: torch.Tensor, src: int | None = None, tag: int = 0) -> int:
        """Receive into `tensor` from `src` (any rank if None); returns the sender's rank."""
        return dist.recv(tensor, src=src, tag=tag)

    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> dist.Work:
        return dist.isend(tensor, dst=dst, tag=tag)

    def irecv(self, tensor: torch.Tensor, src: int | None = None, tag: int = 0) -> dist.Work:
        return dist.irecv(tensor, src=src, tag=tag)

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
        return self._channels[key]

    def send_on(self, group, tensor: torch.Tensor, dst: int, tag: int = 0) -> None:
        dist.send(tensor, dst=dst, group=group, tag=tag)

    def recv_on(self, group, tensor: torch.Tensor, src: int | None = None, tag: int = 0) -> int:
        """Receive on a channel; `src` and the returned sender are global ranks."""
        return dist.recv(tensor, src=src, group=group, tag=tag)

    def isend_on(self, group, tensor: torch.Tensor, dst: int, tag: int = 0) -> dist.Work:
        return dist.isend(tensor, dst=dst, group=group, tag=tag)

    def irecv_on(self, group, tensor: torch.Tensor, src: int | None = None,
                 tag: int = 0) -> dist.Work:
        return dist.irecv(tensor, src=src, group=group, tag=tag)

    def group(self, members: Sequence[int] | None):
        """The process group of `members` (None = the world), created on first use and cached.

        torch's new_group is collective over the whole world: every rank must ask for the same
        member sets in the same order (as at setup). Groups formed on the fly by their members
        alone are `member_group`'s job.
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

    # -- P-Reduce (Prague): groups formed on the fly by their members alone ------------------
    # A member set's communicator is created by its members only, on a PrefixStore of the
    # world store, and kept in a bounded LRU cache. Each member evicts on its own; the danger is
    # a member entering a collective on a cached communicator that another member has dropped
    # (a hang until the timeout). One store key per use of a set, preduce/<members>/u<use>,
    # settles it with a single compare_set each, and nobody waits on the store for anybody:
    #   - a member that holds the communicator claims the use for it: "" -> "hit";
    #   - a member that does not, and a member evicting it (for its next use), mark it "new".
    # Whichever comes first wins and the key never changes after, so every member reads the
    # same verdict. An evictor that finds "hit" (a peer is already in, or committed to, that use
    # on the old communicator) keeps it and evicts another; so a communicator is only dropped
    # once its next use is marked "new", and a member without one never finds "hit". On "new"
    # all members build a fresh communicator under the prefix .../g<use>/.
    # (The previous scheme, an arrival count plus a verdict the last arriver set, cost 3 store
    # round trips on the critical path of every use and released members one by one.)

    def member_group(self, members: Sequence[int]):
        """The communicator of `members` for their next collective, agreed by all of them.

        Every member must call it once per collective it then runs on the returned group
        (p_reduce_ does); non-members never call it. Concurrent disjoint sets are independent.
        """
        key = tuple(sorted(set(members)))
        if self.rank not in key:
            raise ValueError(f"rank {self.rank} is not a member of {list(key)}")
        comms, uses = self._preduce_comms, self._preduce_uses
        use = uses.get(key, 0)
        uses[key] = use + 1
        base = _preduce_base(key)
        held = key in comms
        verdict = self.store.compare_set(f"{base}/u{use}", "", _HIT if held else _NEW)
        if verdict == _HIT.encode():
            if not held:  # cannot happen unless a member dropped a set it had claimed
                raise RuntimeError(f"P-Reduce {list(key)} use {use}: peers hold a communicator "
                                   "this rank has dropped")
            self.preduce_cache_hits += 1
            comms.move_to_end(key)
            group = comms[key]
        else:
            self.preduce_cache_misses += 1
            self._drop_member_group(comms.pop(key, None))
            group = self._new_member_group(dist.PrefixStore(f"{base}/g{use}/", self.store),
                                           key.index(self.rank), len(key))
            comms[key] = group
            self._evict_member_groups(keep=key)
        if key[0] == self.rank and use > 0:
            # Every member read the previous use's key before that use's collective, which
            # this rank has finished: it can go. Deleted in batches by p_reduce_, off the
            # critical path; one member (the lowest rank) does it.
            self._preduce_stale.append(f"{base}/u{use - 1}")
        return group

    def p_reduce_(self, tensor: torch.Tensor, members: Sequence[int]) -> torch.Tensor:
        """In-place mean of `tensor` over `members` (this rank among them); others not involved."""
        if len(set(members)) == 1:
            return tensor
        group = self.member_group(members)
        group.allreduce([tensor]).wait()
        stale = self._preduce_stale
        if len(stale) >= 64:  # a round trip each: batched, so back-to-back uses rarely pay it
            for key in stale:
                self.store.delete_key(key)
            stale.clear()
        return tensor.div_(len(set(members)))

    def close_member_groups(self, wait: bool = True) -> None:
        """Drop every cached member communicator (this rank's own; no collective).

        Each set's next use is marked "new" first, so peers that still hold it rebuild instead
        of waiting on it. Call it when this rank has no further uses of them pending (the end
        of a run), or when all members of each set close together. With `wait`, returns once
        all dropped communicators are destroyed: call it before the process ends, so none is
        torn down by interpreter exit.
        """
        while self._preduce_comms:
            key, group = self._preduce_comms.popitem()
            self.store.compare_set(f"{_preduce_base(key)}/u{self._preduce_uses[key]}", "", _NEW)
            self._drop_member_group(group)
        if wait and self._preduce_reaper is not None:
            inbox, thread = self._preduce_reaper
            self._preduce_reaper = None
            inbox.put(None)
            thread.join()

    def _evict_member_groups(self, keep: tuple[int, ...]) -> None:
        """Bring the cache back to its bound, least recently used first (never `keep`, the
        set about to be used).

        A set whose next use a peer has already claimed ("hit") is kept: that peer is in, or
        about to enter, a collective on it and this rank will be there too. The cache then
        stays over its bound until a later eviction succeeds (a few sets at most: only sets a
        peer is waiting in right now).
        """
        comms = self._preduce_comms
        for key in list(comms):
            if len(comms) <= self.preduce_cache_size:
                return
            if key == keep:
                continue
            mark = f"{_preduce_base(key)}/u{self._preduce_uses[key]}"
            if self.store.compare_set(mark, "", _NEW) == _NEW.encode():
                self._drop_member_group(comms.pop(key))

    def _new_member_group(self, store: dist.Store, rank: int, size: int):
        if self.backend == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = self.timeout
            return dist.ProcessGroupNCCL(store, rank, size, options)
        if self._gloo_device is None:
            self._gloo_device = dist.ProcessGroupGloo.create_default_device()
        options = dist.ProcessGroupGloo._Options()
        options._devices = [self._gloo_device]
        options._timeout = self.timeout
        options._threads = 1  # one collective at a time per group; threads add up over a cache
        return dist.ProcessGroupGloo(store, rank, size, options)

    def _drop_member_group(self, group) -> None:
        # Tearing a gloo communicator down takes 10-30 ms (measured: its pairs and thread are
        # closed one by one), so a background thread does it, off the training path.
        if group is None:
            return
        if self._preduce_reaper is None:
            inbox: queue.SimpleQueue = queue.SimpleQueue()
            thread = threading.Thread(target=_reap, args=(inbox, self.backend),
                                      name="hetbench-preduce-reaper", daemon=True)
            thread.start()
            self._preduce_reaper = (inbox, thread)
        self._preduce_reaper[0].put(group)

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


_HIT, _NEW = "hit", "new"  # verdicts of one use of a member set (the P-Reduce section)


def _preduce_base(key: tuple[int, ...]) -> str:
    return "preduce/" + "-".join(map(str, key))


def _reap(inbox: queue.SimpleQueue, backend: str) -> None:
    """Destroy dropped member communicators until told to stop (None)."""
    while (group := inbox.get()) is not None:
        if backend == "nccl":
            group.shutdown()  # NCCL communicators hold GPU memory until shut down
        del group
