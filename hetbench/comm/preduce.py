"""P-Reduce: the mean over a group that its members form on the fly, without the rest of the
world. Comm owns one MemberGroups and exposes it as `Comm.p_reduce_`; an algorithm sets the
cache bound in its setup (`Comm.configure_p_reduce`).

A member set's communicator is created by its members only, on a PrefixStore of the
world store, and kept in a bounded LRU cache. Each member evicts on its own; the danger is
a member entering a collective on a cached communicator that another member has dropped
(a hang until the timeout). One store key per use of a set, preduce/<members>/u<use>,
settles it with a single compare_set each, and nobody waits on the store for anybody:
  - a member that holds the communicator claims the use for it: "" -> "hit";
  - a member that does not, and a member evicting it (for its next use), mark it "new".
Whichever comes first wins and the key never changes after, so every member reads the
same verdict. An evictor that finds "hit" (a peer is already in, or committed to, that use
on the old communicator) keeps it and evicts another; so a communicator is only dropped
once its next use is marked "new", and a member without one never finds "hit". On "new"
all members build a fresh communicator under the prefix .../g<use>/.
(The previous scheme, an arrival count plus a verdict the last arriver set, cost 3 store
round trips on the critical path of every use and released members one by one.)
"""

from __future__ import annotations

import datetime
import queue
import threading
from collections import OrderedDict
from collections.abc import Sequence

import torch
import torch.distributed as dist


class MemberGroups:
    """This rank's member communicators, one per member set, in a bounded LRU cache."""

    def __init__(self, rank: int, backend: str, store: dist.Store,
                 timeout: datetime.timedelta, cache_size: int = 16):
        self.rank = rank
        self.backend = backend
        self.store = store
        self.timeout = timeout
        #: Member communicators kept (LRU); an algorithm sets it through Comm.configure_p_reduce.
        self.cache_size = cache_size
        self.hits = 0
        self.misses = 0
        # (members) -> communicator in LRU order; (members) -> uses so far. Use counts are equal
        # on all members of a set (each use involves all of them), so they name the store key
        # of the next use without any extra round trip.
        self._comms: OrderedDict[tuple[int, ...], object] = OrderedDict()
        self._uses: dict[tuple[int, ...], int] = {}
        self._stale: list[str] = []
        self._reaper: tuple[queue.SimpleQueue, threading.Thread] | None = None
        self._gloo_device = None

    def get(self, members: Sequence[int]):
        """The communicator of `members` for their next collective, agreed by all of them.

        Every member must call it once per collective it then runs on the returned group
        (p_reduce_ does); non-members never call it. Concurrent disjoint sets are independent.
        """
        key = tuple(sorted(set(members)))
        if self.rank not in key:
            raise ValueError(f"rank {self.rank} is not a member of {list(key)}")
        comms, uses = self._comms, self._uses
        use = uses.get(key, 0)
        uses[key] = use + 1
        base = _preduce_base(key)
        held = key in comms
        verdict = self.store.compare_set(f"{base}/u{use}", "", _HIT if held else _NEW)
        if verdict == _HIT.encode():
            if not held:  # cannot happen unless a member dropped a set it had claimed
                raise RuntimeError(f"P-Reduce {list(key)} use {use}: peers hold a communicator "
                                   "this rank has dropped")
            self.hits += 1
            comms.move_to_end(key)
            group = comms[key]
        else:
            self.misses += 1
            self._drop(comms.pop(key, None))
            group = self._new(dist.PrefixStore(f"{base}/g{use}/", self.store),
                              key.index(self.rank), len(key))
            comms[key] = group
            self._evict(keep=key)
        if key[0] == self.rank and use > 0:
            # Every member read the previous use's key before that use's collective, which
            # this rank has finished: it can go. Deleted in batches by p_reduce_, off the
            # critical path; one member (the lowest rank) does it.
            self._stale.append(f"{base}/u{use - 1}")
        return group

    def p_reduce_(self, tensor: torch.Tensor, members: Sequence[int],
                  network=None) -> torch.Tensor:
        """In-place mean of `tensor` over `members` (this rank among them); others not involved.
        With `network` (an emulated network's Emulator) it lasts at least its modeled time."""
        if len(set(members)) == 1:
            return tensor
        if network is None:
            self.get(members).allreduce([tensor]).wait()
        else:
            # The members' arrivals are taken before a cache miss builds their communicator
            # (a rendezvous: the early ones wait in it for the last), so the set-up's real cost
            # after the last arrival counts against fidelity, and the model's set-up time (0
            # unless [network] group_setup_ms says) is what the emulated cluster pays for it.
            arrived, misses = network.clock(), self.misses
            group = self.get(members)
            setup_s = network.model.config.group_setup_ms / 1000 if self.misses > misses else 0.0
            network.collective(members, tensor.numel() * tensor.element_size(),
                               lambda t: _latest(group, t, tensor.device),
                               lambda: group.allreduce([tensor]).wait(),
                               arrived=arrived, setup_s=setup_s)
        stale = self._stale
        if len(stale) >= 64:  # a round trip each: batched, so back-to-back uses rarely pay it
            for key in stale:
                self.store.delete_key(key)
            stale.clear()
        return tensor.div_(len(set(members)))

    def close(self, wait: bool = True) -> None:
        """Drop every cached member communicator (this rank's own; no collective).

        Each set's next use is marked "new" first, so peers that still hold it rebuild instead
        of waiting on it. Call it when this rank has no further uses of them pending (the end
        of a run), or when all members of each set close together. With `wait`, returns once
        all dropped communicators are destroyed: call it before the process ends, so none is
        torn down by interpreter exit.
        """
        while self._comms:
            key, group = self._comms.popitem()
            self.store.compare_set(f"{_preduce_base(key)}/u{self._uses[key]}", "", _NEW)
            self._drop(group)
        if wait and self._reaper is not None:
            inbox, thread = self._reaper
            self._reaper = None
            inbox.put(None)
            thread.join()

    def _evict(self, keep: tuple[int, ...]) -> None:
        """Bring the cache back to its bound, least recently used first (never `keep`, the
        set about to be used).

        A set whose next use a peer has already claimed ("hit") is kept: that peer is in, or
        about to enter, a collective on it and this rank will be there too. The cache then
        stays over its bound until a later eviction succeeds (a few sets at most: only sets a
        peer is waiting in right now).
        """
        comms = self._comms
        for key in list(comms):
            if len(comms) <= self.cache_size:
                return
            if key == keep:
                continue
            mark = f"{_preduce_base(key)}/u{self._uses[key]}"
            if self.store.compare_set(mark, "", _NEW) == _NEW.encode():
                self._drop(comms.pop(key))

    def _new(self, store: dist.Store, rank: int, size: int):
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

    def _drop(self, group) -> None:
        # Tearing a gloo communicator down closes its pairs and thread one by one, which takes
        # milliseconds, so a background thread does it, off the training path.
        if group is None:
            return
        if self._reaper is None:
            inbox: queue.SimpleQueue = queue.SimpleQueue()
            thread = threading.Thread(target=_reap, args=(inbox, self.backend),
                                      name="hetbench-preduce-reaper", daemon=True)
            thread.start()
            self._reaper = (inbox, thread)
        self._reaper[0].put(group)


_HIT, _NEW = "hit", "new"  # verdicts of one use of a member set (the P-Reduce section)


def _preduce_base(key: tuple[int, ...]) -> str:
    return "preduce/" + "-".join(map(str, key))


def _latest(group, t: float, device: torch.device) -> float:
    """The MAX of t over a member communicator's ranks (an emulated network's agreed start)."""
    value = torch.tensor([t], dtype=torch.float64, device=device)
    options = dist.AllreduceOptions()
    options.reduceOp = dist.ReduceOp.MAX
    group.allreduce([value], options).wait()
    return value.item()


def _reap(inbox: queue.SimpleQueue, backend: str) -> None:
    """Destroy dropped member communicators until told to stop (None)."""
    while (group := inbox.get()) is not None:
        if backend == "nccl":
            group.shutdown()  # NCCL communicators hold GPU memory until shut down
        del group
