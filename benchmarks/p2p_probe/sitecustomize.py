"""Issue 54's probe of point-to-point steps on a shared GPU, loaded into every process of a run
by `PYTHONPATH=benchmarks/p2p_probe` (sitecustomize) when HETBENCH_P2P_PROBE names a folder.
It wraps, without changing what they do: torch.distributed's send/isend/recv/irecv (when each
message was posted and completed, by whom), the host staging of CUDA tensors (the GPU -> host
copy's host seconds; the host -> GPU copy's wait in the stream's queue and its GPU time, by CUDA
events), and Hop's and D-PSGD's steps (Hop's send and its two waits). Each process appends JSON
lines to <folder>/<pid>.jsonl as it goes (ranks end with os._exit: nothing is kept for exit).
benchmarks/hop_split.py runs the runs and reads the lines. A measurement tool, never loaded by
hetbench itself.
"""

import json
import os
import threading
import time

FOLDER = os.environ.get("HETBENCH_P2P_PROBE")


def _install():
    import torch
    import torch.distributed as dist

    from hetbench.algorithms import dpsgd, hop
    from hetbench.comm import staging

    lock = threading.Lock()
    files = {}

    def write(kind, **fields):
        pid = os.getpid()
        with lock:
            out = files.get(pid)
            if out is None:
                # Kept open for the process's life: its lines are written as they come.
                path = os.path.join(FOLDER, f"{pid}.jsonl")
                out = files[pid] = open(path, "a", buffering=1)  # noqa: SIM115
            rank = dist.get_rank() if dist.is_initialized() else None
            out.write(json.dumps({"k": kind, "rank": rank,
                                  "thread": threading.current_thread().name, **fields}) + "\n")

    def wrap_send(original, blocking):
        def send(tensor, dst=None, group=None, tag=0, **kw):
            posted = time.time_ns()
            work = original(tensor, dst=dst, group=group, tag=tag, **kw)
            write("send", peer=dst, tag=tag, n=tensor.numel(), post=posted,
                  done=time.time_ns() if blocking else None)
            return work
        return send

    class Completion:
        """An irecv's Work that notes when it was first seen complete."""

        def __init__(self, work, fields):
            self._work, self._fields, self._noted = work, fields, False

        def _note(self):
            if not self._noted:
                self._noted = True
                write("recv", done=time.time_ns(), **self._fields)

        def wait(self, *args, **kwargs):
            result = self._work.wait(*args, **kwargs)
            self._note()
            return result

        def is_completed(self):
            done = self._work.is_completed()
            if done:
                self._note()
            return done

        def __getattr__(self, name):
            return getattr(self._work, name)

    original_recv, original_irecv = dist.recv, dist.irecv

    def recv(tensor, src=None, group=None, tag=0, **kw):
        posted = time.time_ns()
        sender = original_recv(tensor, src=src, group=group, tag=tag, **kw)
        write("recv", peer=sender, tag=tag, n=tensor.numel(), post=posted, done=time.time_ns())
        return sender

    def irecv(tensor, src=None, group=None, tag=0, **kw):
        posted = time.time_ns()
        work = original_irecv(tensor, src=src, group=group, tag=tag, **kw)
        return Completion(work, {"peer": src, "tag": tag, "n": tensor.numel(), "post": posted})

    dist.send, dist.isend = wrap_send(dist.send, True), wrap_send(dist.isend, False)
    dist.recv, dist.irecv = recv, irecv

    # -- the staging copies ---------------------------------------------------------------
    outgoing, deliver = staging.HostStaging.outgoing, staging.HostStaging.deliver
    pending = []  # (host ns queued, before event, after event, thread)
    anchor = {}

    def resolve(final=False):
        while pending and (final or pending[0][2].query()):
            queued, before, after, thread = pending.pop(0)
            after.synchronize()
            at_ns = anchor["ns"] + anchor["event"].elapsed_time(before) * 1e6
            write("h2d", queue_ms=(at_ns - queued) / 1e6, gpu_ms=before.elapsed_time(after),
                  copy_thread=thread)

    take = staging.HostStaging._take

    def timed_take(self, numel, dtype):
        started, allocated = time.perf_counter(), self.allocated
        buffer = take(self, numel, dtype)
        self._probe_take = ((time.perf_counter() - started) * 1e3, self.allocated - allocated)
        return buffer

    def set_anchor(stream):
        with lock:
            if not anchor:
                event = torch.cuda.Event(enable_timing=True)
                event.record(stream)
                event.synchronize()
                anchor.update(event=event, ns=time.time_ns())

    def on_host_ms(event, since_ns):
        return (anchor["ns"] + anchor["event"].elapsed_time(event) * 1e6 - since_ns) / 1e6

    def timed_outgoing(self, tensor):
        started, started_ns = time.perf_counter(), time.time_ns()
        caller = None
        if self._cuda and tensor.device.type == "cuda":
            stream = torch.cuda.current_stream(self.device)
            set_anchor(stream)
            caller = torch.cuda.Event(enable_timing=True)
            caller.record(stream)  # the caller's queue as the copy waits for it
        buffer = outgoing(self, tensor)
        take_ms, grew = getattr(self, "_probe_take", (None, None))
        write("d2h", host_ms=(time.perf_counter() - started) * 1e3, n=tensor.numel(),
              take_ms=take_ms, allocated_now=grew, pool=self.allocated,
              caller_ready_ms=None if caller is None else on_host_ms(caller, started_ns))
        return buffer

    def timed_deliver(self, buffer, tensor):
        if not (self._cuda and tensor.device.type == "cuda"):
            return deliver(self, buffer, tensor)
        stream = torch.cuda.current_stream(self.device)
        set_anchor(stream)
        before, after = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        queued = time.time_ns()
        before.record(stream)
        result = deliver(self, buffer, tensor)
        after.record(stream)
        with lock:
            pending.append((queued, before, after, threading.current_thread().name))
        resolve()
        return result

    staging.HostStaging.outgoing, staging.HostStaging.deliver = timed_outgoing, timed_deliver
    staging.HostStaging._take = timed_take

    # -- the steps ------------------------------------------------------------------------
    def timed(cls, name, kind):
        original = getattr(cls, name)

        def method(self, *args, **kwargs):
            started = time.perf_counter()
            try:
                return original(self, *args, **kwargs)
            finally:
                extra = {"what": args[1]} if name == "_wait" else {}
                write(kind, ms=(time.perf_counter() - started) * 1e3,
                      iteration=getattr(self, "iteration", getattr(self, "k", None)), **extra)
                if name == "step":
                    resolve()
        setattr(cls, name, method)

    timed(hop.Hop, "step", "step")
    timed(hop.Hop, "_send", "hop_send")
    timed(hop.Hop, "_wait", "hop_wait")
    timed(dpsgd.DPSGD, "step", "step")


if FOLDER:
    os.makedirs(FOLDER, exist_ok=True)
    _install()
