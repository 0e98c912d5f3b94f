"""The emulated network's fair transport (issue 58): one service per run, on the run's host,
that plays network/transport.py on the host's clock for every rank.

The first-come-first-served emulator (emulator.py) times each message where it is sent: its
end is known then. Under `[network] transport = "fair"` it is not: a message moves only once
its receive is posted, and its rate changes whenever a flow that shares one of its NICs
starts or ends. So the ranks tell one process what they do when they do it, and it tells them
when each thing is done:

- a send, before the real one; a receive's post, before the real one (a receive from any
  sender, or one posted before the network started, once the real one has returned and named
  its sender: the host's cost of that real receive is all it adds); a collective's arrival;
- a rank that waits asks for its send's return, its message's delivery or its collective's
  end, and is answered when the model's flows have moved that far.

The service keeps the transport's time in cluster seconds: the host's CLOCK_MONOTONIC (one
clock for every process of the host) since the service started, over the dilation. Every time
on the wire is host seconds. Requests are JSON lists over a Unix socket in the abstract
namespace (nothing on disk), one connection per thread of a rank, so that a rank's serving
thread and its main thread wait apart. A stream of messages (sender, receiver, key) is sent
from one thread: its sends and receives match first to first, here as in gloo.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import itertools
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from pathlib import Path

from hetbench.network.model import Cluster, NetworkConfig
from hetbench.network.transport import Transport

#: The file in the run directory that holds the service's address (written by the service
#: once it listens).
ADDRESS_FILE = "network-service.json"
LOG_FILE = "network-service.log"
#: Seconds a rank waits for the service to answer before it calls the run failed: far beyond
#: any modeled operation of a run that still moves (a rank whose peer never posts its receive
#: waits in the real operation, under the harness's own timeout, before it gets here).
ANSWER_TIMEOUT_S = 600.0
#: Seconds rank 0 waits for a new service to listen.
START_TIMEOUT_S = 30.0


class _Clock:
    """The engine network/transport.py runs on: `now` and `at`, in cluster seconds."""

    def __init__(self):
        self.now = 0.0
        self._heap: list = []
        self._order = itertools.count()

    def at(self, t: float, fn: Callable, *args) -> None:
        heapq.heappush(self._heap, (t, next(self._order), fn, args))

    def next_at(self) -> float:
        return self._heap[0][0] if self._heap else float("inf")

    def run_until(self, t: float) -> None:
        """Run every callback due by t, in time order; now ends at t (never going back)."""
        while self._heap and self._heap[0][0] <= t:
            at, _, fn, args = heapq.heappop(self._heap)
            self.now = max(self.now, at)
            fn(*args)
        self.now = max(self.now, t)


class FairService:
    """The transport of one run, and who waits for what in it."""

    def __init__(self, cluster: Cluster, world_size: int, clock: Callable[[], float] =
                 time.monotonic):
        self.k = cluster.config.dilation
        self.host_clock = clock
        self.t0 = clock()
        self.clock = _Clock()
        self.transport = Transport(self.clock, cluster)
        self.world_size = world_size
        #: Event -> (host time, modeled seconds, answers still owed) once it has happened.
        self._happened: dict[tuple, list] = {}
        #: Event -> the connections waiting for it.
        self._waiting: dict[tuple, list[Connection]] = {}
        #: (members, number) -> arrivals (cluster seconds) of a collective not all in.
        self._arrivals: dict[tuple, list[float]] = {}
        self._byes: set[int] = set()
        #: Events nobody will wait for (a send let go): not kept once they happen.
        self._forgotten: set[tuple] = set()

    def cluster_s(self, host_t: float) -> float:
        return (host_t - self.t0) / self.k

    def host_s(self, cluster_t: float) -> float:
        return self.t0 + cluster_t * self.k

    # -- requests ----------------------------------------------------------------------------
    def handle(self, conn: Connection, request: list) -> None:
        """One request, its host time (request[1]) already the clock's (run_until)."""
        op = request[0]
        if op == "send":
            _, _, src, dst, nbytes, key, seq = request
            now = self.clock.now
            self.transport.send(src, dst, nbytes, now,
                                (self._happen, ("delivered", src, dst, key, seq), 1, now),
                                sent=(self._happen, ("sent", src, dst, key, seq), 1, now),
                                key=key)
        elif op == "recv":
            _, _, dst, src, key = request
            self.transport.post_receive(dst, src, key)
        elif op == "ring":
            _, _, members, nbytes, broadcast, seq, setup_s = request
            self._arrive(tuple(members), seq, nbytes, broadcast, setup_s)
        elif op == "wait":
            self._wait(conn, event_key(request[2]))
        elif op == "query":
            happened = self._happened.get(event_key(request[2]))
            conn.send_bytes(json.dumps(None if happened is None else happened[0]).encode())
        elif op == "forget":
            event = event_key(request[2])
            if self._happened.pop(event, None) is None:
                self._forgotten.add(event)
        elif op == "bye":
            self._byes.add(request[2])
        else:
            raise ValueError(f"unknown request {op!r}")

    def _arrive(self, members: tuple, seq: int, nbytes: float, broadcast: bool,
                setup_s: float) -> None:
        arrivals = self._arrivals.setdefault((members, seq), [])
        arrivals.append(self.clock.now)
        if len(arrivals) < len(members):
            return
        del self._arrivals[(members, seq)]
        start = max(arrivals)
        self.transport.rings(members, (nbytes,), start + setup_s,
                             (self._happen, ("ring", members, seq), len(members), start),
                             broadcast=broadcast)

    def _happen(self, event: tuple, answers: int, since: float) -> None:
        """`event` has happened now (the transport's callback); `since`: when what it ends
        began (cluster seconds), for the ranks' fidelity records."""
        if event in self._forgotten:
            self._forgotten.discard(event)
            return
        record = [self.host_s(self.clock.now), (self.clock.now - since) * self.k, answers]
        self._happened[event] = record
        for conn in self._waiting.pop(event, ()):
            self._answer(conn, event, record)

    def _wait(self, conn: Connection, event: tuple) -> None:
        record = self._happened.get(event)
        if record is None:
            self._waiting.setdefault(event, []).append(conn)
        else:
            self._answer(conn, event, record)

    def _answer(self, conn: Connection, event: tuple, record: list) -> None:
        record[2] -= 1
        if record[2] <= 0:
            del self._happened[event]
        with contextlib.suppress(OSError):  # a rank gone: its run fails on its own
            conn.send_bytes(json.dumps(record[:2]).encode())

    # -- the loop ----------------------------------------------------------------------------
    def serve(self, listener: socket.socket, parent: int) -> None:
        """Answer until every rank has said goodbye, or the rank that started the service
        (`parent`) is gone and no rank is connected any more: rank 0 may end its process
        while a server rank still waits on its last messages, and a failed run's ranks end
        their connections by ending."""
        conns: list[Connection] = []
        while len(self._byes) < self.world_size:
            due = self.host_s(self.clock.next_at()) - self.host_clock()
            ready = wait([listener, *conns], timeout=min(max(due, 0.0), 1.0))
            batch = []
            for source in ready:
                if source is listener:
                    accepted, _ = listener.accept()
                    conns.append(Connection(accepted.detach()))
                    continue
                try:
                    while source.poll():
                        batch.append((source, json.loads(source.recv_bytes())))
                except (EOFError, OSError):
                    conns.remove(source)
                    source.close()
            # Requests in the order they were made (each carries its host time), each after
            # the callbacks due before it.
            batch.sort(key=lambda item: item[1][1])
            for conn, request in batch:
                self.clock.run_until(self.cluster_s(request[1]))
                self.handle(conn, request)
            self.clock.run_until(self.cluster_s(self.host_clock()))
            if not conns and os.getppid() != parent:
                return


def event_key(event) -> tuple:
    """An event as JSON carried it (lists), as the tuple it is kept under."""
    return tuple(event_key(x) if isinstance(x, list) else x for x in event)


def start(run_dir: Path, cluster: Cluster) -> None:
    """Rank 0, before the others open it: start the run's service (a process of its own, so
    that no rank's Python threads delay its answers) and wait until it listens."""
    address_file = Path(run_dir) / ADDRESS_FILE
    address_file.unlink(missing_ok=True)
    config = json.dumps({"network": cluster.config.__dict__, "workers": cluster.workers,
                         "world_size": cluster.world_size})
    with open(Path(run_dir) / LOG_FILE, "w") as log:
        process = subprocess.Popen([sys.executable, "-m", "hetbench.network.fair_service",
                                    "--run-dir", str(run_dir), "--config", config],
                                   stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not address_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            log_text = (Path(run_dir) / LOG_FILE).read_text().strip().splitlines()
            raise RuntimeError("the fair transport's service did not start"
                               + (f": {log_text[-1]}" if log_text else ""))
        time.sleep(0.01)


class ServiceClient:
    """One rank's connections to its run's service: one per thread."""

    def __init__(self, run_dir: Path, rank: int):
        self.address = json.loads((Path(run_dir) / ADDRESS_FILE).read_text())["address"]
        self.rank = rank
        self._local = threading.local()
        self._all: list[Connection] = []
        self._lock = threading.Lock()

    def _conn(self) -> Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect("\0" + self.address)
            conn = self._local.conn = Connection(sock.detach())
            with self._lock:
                self._all.append(conn)
        return conn

    def tell(self, op: str, *args) -> None:
        """A request that needs no answer, made now."""
        self.tell_at(time.monotonic(), op, *args)

    def tell_at(self, host_t: float, op: str, *args) -> None:
        """A request that needs no answer, made at host_t (this host's monotonic clock)."""
        self._conn().send_bytes(json.dumps([op, host_t, *args]).encode())

    def ask(self, op: str, *args):
        """A request, and its answer (up to ANSWER_TIMEOUT_S)."""
        conn = self._conn()
        conn.send_bytes(json.dumps([op, time.monotonic(), *args]).encode())
        try:
            if not conn.poll(ANSWER_TIMEOUT_S):
                raise RuntimeError(f"the fair transport's service did not answer {op} {args} "
                                   f"in {ANSWER_TIMEOUT_S:.0f} s")
            return json.loads(conn.recv_bytes())
        except (EOFError, OSError) as exc:
            raise RuntimeError("the fair transport's service has ended (its log: "
                               f"{LOG_FILE} in the run directory)") from exc

    def close(self) -> None:
        with contextlib.suppress(OSError):  # the service gone: nothing to say goodbye to
            self.tell("bye", self.rank)
        with self._lock:
            for conn in self._all:
                conn.close()
            self._all.clear()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--config", required=True)
    args = parser.parse_args(argv)
    config = json.loads(args.config)
    cluster = Cluster(NetworkConfig(**config["network"]), config["workers"],
                      config["world_size"])
    parent = os.getppid()
    address = f"hetbench-fair-{os.getpid()}-{time.monotonic_ns()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + address)
    listener.listen(4 * cluster.world_size)
    service = FairService(cluster, cluster.world_size)
    target = args.run_dir / ADDRESS_FILE
    partial = target.with_suffix(".partial")
    partial.write_text(json.dumps({"address": address, "pid": os.getpid()}))
    partial.replace(target)  # never half-written: the ranks read it whole or not at all
    try:
        service.serve(listener, parent)
    finally:
        listener.close()


if __name__ == "__main__":
    main()
