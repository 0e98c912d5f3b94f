"""The state every rank of an emulated run shares on its host: the NIC ledger and the mailbox
of delivery times, in one memory-mapped file of the run directory.

Emulation runs every rank on one host (that is its point: a small host plays a larger
cluster), so the ranks share a clock (CLOCK_MONOTONIC is system-wide) and this file. A sender
reserves the NICs its transfer crosses in the ledger and posts the transfer's modeled delivery
time in the mailbox slot of (sender, receiver, key, sequence number) before the real send
starts; the receiver, once the real receive returns, reads the slot and waits until then. No
message is added to the real traffic.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import threading
import zlib
from pathlib import Path

from hetbench.network.model import Ledger

#: Message streams (channel and tag) per ordered pair of ranks with a slot ring of their own;
#: two streams that hash alike share one, and a read that finds the other's entry counts as
#: unmatched (the receiver then does not wait: fidelity records how many).
KEYS = 8
#: Messages a sender may be ahead of its receiver on one stream before its slots are reused.
DEPTH = 16
SLOT = 4  # float64s per slot: sequence, stream key, posted at, delivered at
FILE_NAME = "network.shm"


def stream_key(channel: str, tag: int) -> int:
    """A stream's 32-bit key (a channel's name and a message tag)."""
    return zlib.crc32(f"{channel}:{tag}".encode())


class SharedState:
    """The run's shared file, mapped; `create` once (rank 0, before the others open it)."""

    def __init__(self, path: Path, world_size: int, create: bool = False):
        self.world_size = world_size
        ports = 2 * world_size
        self._mailbox_at = ports
        doubles = ports + world_size * world_size * KEYS * DEPTH * SLOT
        flags = os.O_RDWR | (os.O_CREAT | os.O_TRUNC if create else 0)
        self._fd = os.open(path, flags, 0o644)
        if create:
            os.ftruncate(self._fd, doubles * 8)  # zeros, and sparse: untouched slots cost nothing
        self._map = mmap.mmap(self._fd, doubles * 8)
        self._bytes = memoryview(self._map)
        self.values = self._bytes.cast("d")
        self.ledger = SharedLedger(self)
        self._lock = threading.Lock()  # flock does not exclude this process's other threads

    def __enter__(self):
        self._lock.acquire()
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._lock.release()

    # -- the mailbox -------------------------------------------------------------------------
    def _slot(self, src: int, dst: int, key: int, seq: int) -> int:
        return self._mailbox_at + (((src * self.world_size + dst) * KEYS + key % KEYS) * DEPTH
                                   + seq % DEPTH) * SLOT

    def post(self, src: int, dst: int, key: int, seq: int, posted: float,
             delivered: float) -> None:
        """The sender: message `seq` of stream `key` from src to dst arrives at `delivered`."""
        at = self._slot(src, dst, key, seq)
        v = self.values
        v[at + 1], v[at + 2], v[at + 3] = float(key), posted, delivered
        v[at] = float(seq + 1)  # last: a reader matches on it (0 = never written)

    def read(self, src: int, dst: int, key: int, seq: int) -> tuple[float, float] | None:
        """(posted, delivered) of that message, or None when its slot holds another's."""
        at = self._slot(src, dst, key, seq)
        v = self.values
        if v[at] != float(seq + 1) or v[at + 1] != float(key):
            return None
        return v[at + 2], v[at + 3]

    def close(self) -> None:
        self.values.release()
        self._bytes.release()
        self._map.close()
        os.close(self._fd)


class SharedLedger(Ledger):
    """The NIC ledger in the shared file, each operation under the file's lock."""

    def __init__(self, state: SharedState):  # the storage is the state's file
        self._state = state
        self._free = state.values  # the first 2 * world_size doubles: one per port

    def free_at(self, ports):
        with self._state:
            return super().free_at(ports)

    def reserve(self, ports, at, busy_s):
        with self._state:
            return super().reserve(ports, at, busy_s)

    def book(self, port_busy, start):
        with self._state:
            super().book(port_busy, start)
