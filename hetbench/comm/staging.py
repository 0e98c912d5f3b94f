"""Host buffers for point to point of CUDA tensors over gloo, which has no CUDA path for it.

A message goes GPU -> host buffer -> gloo -> host buffer -> GPU. How those copies are made
decides much of a point-to-point algorithm's throughput on a shared GPU (issue 44: D-PSGD ran
at 0.30x All-Reduce there, sending 1.3x its bytes). So:

- buffers are pinned (page-locked: the copy engine moves them directly, several times faster than
  pageable memory, which the driver first copies through a pinned bounce buffer of its own), and
  reused: a buffer returns to the pool once its message is done with it (its send or receive
  completed, its copy to the device finished), instead of a new allocation per message;
- an outgoing copy runs on a side stream, after the work queued so far on the caller's stream
  (which produced the tensor), and the host waits for that copy alone, not for the device: the
  previous message's send, in flight in gloo's thread, overlaps it;
- an incoming copy to the device is queued on the caller's stream without waiting (a pinned
  source makes it asynchronous); the buffer is reused only once the copy is done.

An isend's buffer returns once its Work says it completed, and gloo says so only once the
Work is waited: an algorithm waits every isend (Hop waits its own on a thread of its own), or
each send pins a new buffer.

On a CPU world (tests force staging there) the same code runs with plain, unpinned buffers and
no streams, so the pool's bookkeeping is tested without a GPU.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

#: Free buffers kept per (numel, dtype): enough for a step's messages to reuse (a ring's two
#: neighbours, a Hop worker's in-peers), bounded so that a burst does not pin memory for good.
KEEP_FREE = 8


class HostStaging:
    """A pool of host buffers for one rank's staged messages (thread-safe: serving threads of
    AD-PSGD and Hop stage their messages too)."""

    def __init__(self, device: torch.device):
        self.device = device
        self._cuda = device.type == "cuda"
        self._copy_stream = torch.cuda.Stream(device) if self._cuda else None
        self._free: dict[tuple[int, torch.dtype], list[torch.Tensor]] = {}
        #: Buffers lent out with the test that says when they are free again.
        self._busy: list[tuple[torch.Tensor, Callable[[], bool]]] = []
        self._lock = threading.Lock()
        #: Buffers allocated (a pool that works allocates few, however many messages).
        self.allocated = 0

    def _take(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        key = (numel, dtype)
        with self._lock:
            still_busy = []
            for buffer, done in self._busy:
                if done():
                    self._keep(buffer)
                else:
                    still_busy.append((buffer, done))
            self._busy = still_busy
            free = self._free.get(key)
            if free:
                return free.pop()
            self.allocated += 1
        return torch.empty(numel, dtype=dtype, pin_memory=self._cuda)

    def _keep(self, buffer: torch.Tensor) -> None:
        free = self._free.setdefault((buffer.numel(), buffer.dtype), [])
        if len(free) < KEEP_FREE:
            free.append(buffer)

    def give_back(self, buffer: torch.Tensor, done: Callable[[], bool] | None = None) -> None:
        """`buffer` returns to the pool: now, or once `done()` says its message has finished
        with it."""
        with self._lock:
            if done is None:
                self._keep(buffer.view(-1))
            else:
                self._busy.append((buffer.view(-1), done))

    def outgoing(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host buffer holding `tensor`'s values (the copy is done when it returns; the
        caller may change its tensor at once). Give it back once it is sent."""
        buffer = self._take(tensor.numel(), tensor.dtype).view(tensor.shape)
        if not self._cuda or tensor.device.type != "cuda":
            buffer.copy_(tensor.detach())
            return buffer
        caller = torch.cuda.current_stream(self.device)
        self._copy_stream.wait_stream(caller)  # the kernels that made the tensor first
        with torch.cuda.stream(self._copy_stream):
            buffer.copy_(tensor.detach(), non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(self._copy_stream)
        # The tensor's memory must not be reused by the caller's stream before the copy read
        # it: waiting for the copy here covers that (and gloo may then read the buffer).
        copied.synchronize()
        return buffer

    def incoming(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host buffer to receive a message for `tensor` into; deliver() it afterwards."""
        return self._take(tensor.numel(), tensor.dtype).view(tensor.shape)

    def deliver(self, buffer: torch.Tensor, tensor: torch.Tensor) -> None:
        """Copy a received `buffer` into `tensor`, and give the buffer back once copied: on
        CUDA the copy is queued on the caller's stream, so whatever the caller queues next
        reads the message, and the host does not wait for it."""
        if not self._cuda or tensor.device.type != "cuda":
            tensor.copy_(buffer)
            self.give_back(buffer)
            return
        tensor.copy_(buffer, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record(torch.cuda.current_stream(self.device))
        self.give_back(buffer, copied.query)
