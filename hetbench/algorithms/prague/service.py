"""The Group Generator as a gRPC service: a thin layer over generator.GroupGenerator.

`gg_server(...)` (a context manager, used by the algorithms' services()) starts
`python -m hetbench.algorithms.prague.service` in its own process on the run's bind_host
(127.0.0.1 unless a multi-node run sets 0.0.0.0) with a free port and stops it afterwards;
`GroupClient` is what a worker holds. Bad requests (a worker out of
range, bytes that do not parse) get a gRPC error status and the server goes on serving.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from hetbench.algorithms.prague.generated import group_generator_pb2 as pb
from hetbench.algorithms.prague.generated import group_generator_pb2_grpc as pb_grpc
from hetbench.algorithms.prague.generator import GroupGenerator
from hetbench.core.signals import die_with_parent

#: How long the launcher waits for the server to say its port.
START_TIMEOUT_S = 30.0
#: How long the server waits for gRPC's own stop once told to stop, before it exits anyway.
STOP_TIMEOUT_S = 3.0


class GroupGeneratorServicer(pb_grpc.GroupGeneratorServicer):
    """Serialises requests into one GroupGenerator; its errors become INVALID_ARGUMENT."""

    def __init__(self, generator: GroupGenerator):
        self.generator = generator
        self._lock = threading.Lock()

    def GetGroup(self, request, context):
        try:
            with self._lock:
                # The server's own clock times every request (arrival_order needs one clock).
                group = self.generator.request(request.worker, time.monotonic())
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if group is None:
            return pb.GroupReply(finished=True)
        return pb.GroupReply(members=group.members, group_id=group.id)

    def Done(self, request, context):
        try:
            with self._lock:
                pending = self.generator.finish(request.worker)
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return pb.DoneReply(pending=pending)


def start_server(generator: GroupGenerator, host: str = "127.0.0.1",
                 port: int = 0) -> tuple[grpc.Server, int]:
    """A started gRPC server over `generator` (in this process) and the port it bound."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max(8, generator.workers + 2)))
    pb_grpc.add_GroupGeneratorServicer_to_server(GroupGeneratorServicer(generator), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise RuntimeError(f"group generator: cannot bind {host}:{port}")
    server.start()
    return server, bound


class GroupGeneratorUnreachable(RuntimeError):
    """The Group Generator process is gone or stuck: the run cannot form groups."""


class GroupClient:
    """A worker's connection to the Group Generator."""

    def __init__(self, address: str, timeout_s: float):
        self.address = address
        self._channel = grpc.insecure_channel(address)
        self._stub = pb_grpc.GroupGeneratorStub(self._channel)
        self.timeout_s = timeout_s

    def group(self, worker: int) -> pb.GroupReply:
        """The worker's next group (reply.finished once it is done and drained)."""
        return self._call(self._stub.GetGroup, pb.GroupRequest(worker=worker))

    def done(self, worker: int) -> int:
        """Tell the generator the worker's budget is spent; returns its queued groups."""
        return self._call(self._stub.Done, pb.DoneRequest(worker=worker)).pending

    def _call(self, method, request):
        try:
            return method(request, timeout=self.timeout_s, wait_for_ready=True)
        except grpc.RpcError as exc:
            # One line for the run's cause: gRPC's own text spans several lines of debug info.
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise GroupGeneratorUnreachable(
                    f"the group generator at {self.address} is unreachable ({exc.code().name} "
                    f"after {self.timeout_s:g} s): it died or stopped answering") from None
            raise

    def close(self) -> None:
        self._channel.close()


@contextlib.contextmanager
def gg_server(spec: dict[str, Any], log_path: Path | None = None,
              host: str = "127.0.0.1", cpu_path: Path | None = None) -> Iterator[dict[str, Any]]:
    """Run the Group Generator in its own process for the duration; yields its address and pid
    (the services a run's workers see).

    `spec` holds GroupGenerator's arguments (workers, group_size, delta_c, group_division,
    group_buffer, seed). The server's stderr goes to `log_path` when given. It listens on
    `host` (the run's bind_host: 127.0.0.1 unless a multi-node run sets 0.0.0.0, when workers
    on other machines dial this machine's hostname). With `cpu_path`, the CPU seconds the
    server spent serving (from its port line to its stop; start-up excluded) are written there
    as {"cpu_s": ...} where the OS tells (Linux /proc): the run's CPU cost includes them.
    """
    from hetbench.comm.rendezvous import advertised_host

    log = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "hetbench.algorithms.prague.service", json.dumps(spec),
         "--host", host],
        stdout=subprocess.PIPE, stderr=log, start_new_session=True)
    try:
        port = _read_port(proc)
        cpu_at_start = process_cpu_s(proc.pid)
        yield {"gg_address": f"{advertised_host(host)}:{port}", "gg_pid": proc.pid}
        cpu_at_stop = process_cpu_s(proc.pid)
        if cpu_path and cpu_at_start is not None and cpu_at_stop is not None:
            from hetbench.core.store import write_json_atomic

            write_json_atomic(cpu_path, {"cpu_s": cpu_at_stop - cpu_at_start})
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        proc.stdout.close()
        if log_path:
            log.close()


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a running process (Linux /proc), None where unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _read_port(proc: subprocess.Popen) -> int:
    deadline = time.monotonic() + START_TIMEOUT_S
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or proc.poll() is not None:
            raise RuntimeError(
                f"group generator did not start (exit code {proc.poll()}); see gg.log")
        ready, _, _ = select.select([proc.stdout], [], [], left)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 64)
            if not chunk:
                continue
            line += chunk
    return int(line.split()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Prague's Group Generator (started by a run)")
    parser.add_argument("spec", help="JSON of GroupGenerator's arguments")
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    args = parser.parse_args(argv)
    # Its parent is bench (or rank 0): if that is killed outright, stop too (SIGTERM: cleanly).
    parent = os.getppid()
    die_with_parent(signal.SIGTERM)
    spec = json.loads(args.spec)
    generator = GroupGenerator(spec.pop("workers"), spec.pop("group_size"), **spec)
    server, port = start_server(generator, host=args.host)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"port {port}", flush=True)  # the launcher reads this line
    # A timed wait, so the SIGTERM handler gets to run; the parent check backs up the death
    # signal (which Linux ties to the parent's thread that started this process).
    while not stop.wait(0.5) and os.getppid() == parent:
        pass
    # gRPC's stop can hang while an RPC is in flight (grpc/grpc#40834), the call itself as well
    # as the event it returns, and the interpreter's exit joins the server's handler threads: a
    # Group Generator outliving a SIGKILLed bench by 10 s and more was seen in CI, also with a
    # bounded wait on the event. So: stop on a daemon thread, wait for it a bounded time, then
    # leave without joining anything.
    stopping = threading.Thread(target=lambda: server.stop(grace=1).wait(), daemon=True)
    stopping.start()
    stopping.join(STOP_TIMEOUT_S)
    stopped = not stopping.is_alive()
    print(f"groups generated: {generator.generated}; requests: {generator.counts}"
          + ("" if stopped else f" (gRPC's stop still running after {STOP_TIMEOUT_S:g} s)"),
          file=sys.stderr, flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
