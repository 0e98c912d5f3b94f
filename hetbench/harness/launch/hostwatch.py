"""Whether each host of a run across hosts is still there, whatever launched it: bench connects,
once a second, to a port that something of the run listens on there, and a host none of whose
ports answers for LOST_AFTER_S is lost. The run then fails at once, its cause naming the host
and its ranks, instead of at the stall backstop (comm_timeout_s + 15 s) with a cause that names
a rank "furthest behind".

What listens: under torchrun, each host's node (node.py prints its port); under mpirun and
SLURM, which start no process of bench's on a host, each rank (the worker writes
probe.rank<r>.json: its host and port). A host that cannot be reached (its link is down, or the
machine is gone) is told from one that refuses (the host is up, the run's processes on it are
gone); when bench's own host loses every other host, the cause says so, since its link (and
the services it holds: the Group Generator) is then the likelier fault.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hetbench.core.hosts import is_this_host
from hetbench.core.store import read_json, write_json_atomic

#: How often bench probes each host, how long one probe may take, and how long a host may stay
#: unanswering before the run fails with it lost: a run with a host lost fails within this
#: (plus the probe period and stopping the job), well within comm_timeout_s.
PROBE_S = 1.0
PROBE_TIMEOUT_S = 2.0
LOST_AFTER_S = 5.0


def answer_probes(address: str | None = None) -> int:
    """Listen for bench's probes on this host (a thread accepts and closes each); the port."""
    listener = socket.create_server((address or "", 0))

    def serve() -> None:
        while True:
            connection, _ = listener.accept()
            connection.close()

    threading.Thread(target=serve, name="hetbench-probes", daemon=True).start()
    return listener.getsockname()[1]


def probe_file(run_dir: Path, rank: int) -> Path:
    return run_dir / f"probe.rank{rank}.json"


def publish_rank_probe(run_dir: Path, rank: int) -> None:
    """A rank started by mpirun or SLURM: answer probes, and say where in the run directory."""
    port = answer_probes()
    write_json_atomic(probe_file(run_dir, rank), {"host": socket.gethostname(), "port": port})


def rank_probe_ports(run_dir: Path, world_size: int) -> Callable[[], dict[str, list[int]]]:
    """The ports the ranks published so far, by host (read until every rank has)."""
    found: dict[int, tuple[str, int]] = {}

    def ports() -> dict[str, list[int]]:
        for rank in range(world_size):
            if rank not in found and probe_file(run_dir, rank).exists():
                try:
                    record = read_json(probe_file(run_dir, rank))
                except (OSError, ValueError):
                    continue
                found[rank] = (record["host"], int(record["port"]))
        by_host: dict[str, list[int]] = {}
        for host, port in found.values():
            by_host.setdefault(host, []).append(port)
        return by_host

    return ports


class HostWatch:
    """Probes the hosts that `ports()` names, on a thread of its own, until stop()."""

    def __init__(self, ports: Callable[[], dict[str, list[int]]], gone: str):
        self._ports = ports
        #: What is gone when a host refuses: "its node" (torchrun), "its ranks".
        self._gone = gone
        #: Hosts found lost (host -> why), and when each began failing (monotonic).
        self.lost: dict[str, str] = {}
        self.failing_since: dict[str, float] = {}
        self.hosts: set[str] = set()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._probe, name="hetbench-hostwatch",
                                        daemon=True)

    def start(self) -> HostWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()

    def _probe(self) -> None:
        # Every host at once: when bench's own host is cut off, every other host stops
        # answering in the same round, and the cause can say so (one by one, a round took
        # PROBE_TIMEOUT_S a host, and the first host found lost ended the run alone).
        with ThreadPoolExecutor(max_workers=16, thread_name_prefix="hetbench-probe") as pool:
            while not self._stopping.wait(PROBE_S):
                ports = self._ports()
                answers = dict(zip(ports, pool.map(self._answers, ports.items()), strict=True))
                now, lost = time.monotonic(), {}
                for host, why in answers.items():
                    self.hosts.add(host)
                    if why is None:
                        self.failing_since.pop(host, None)
                        continue
                    since = self.failing_since.setdefault(host, now)
                    if now - since >= LOST_AFTER_S and host not in self.lost:
                        lost[host] = f"{why} for {LOST_AFTER_S:.0f} s"
                self.lost.update(lost)  # one round's findings at once

    def _answers(self, host_ports: tuple[str, list[int]]) -> str | None:
        """None when some port of the host answers; else why none did. Unreachable on one
        port is unreachable on all (the host or its link is gone): no need to wait on each."""
        host, ports = host_ports
        why = None
        for port in ports:
            try:
                with socket.create_connection((host, port), PROBE_TIMEOUT_S):
                    return None
            except ConnectionRefusedError:
                why = f"refuses connections ({self._gone} gone)"
            except OSError as exc:
                return f"is unreachable ({exc.strerror or type(exc).__name__})"
        return why

    def cause(self, ranks_on: dict[int, str], reported: set[int] | None = None) -> str | None:
        """The run's failure as a lost host's (`ranks_on`: each rank's host), or None.

        When several hosts are lost, one fault usually took the others with it: ranks whose
        peers vanish fail with an error report (error.rank<r>.json, `reported`), while the
        ranks of the host at fault were killed or cut off and said nothing. So the host named
        is one whose ranks reported nothing, the first of those to stop answering."""
        here = socket.gethostname()
        remote = sorted(h for h in self.hosts if not is_this_host(h))
        if len(remote) >= 2 and set(self.lost) >= set(remote):
            listed = ", ".join(f"{h} ({ranks_of(h, ranks_on)})" for h in remote)
            return (f"{here}, the host of bench and the run's services, lost every other host "
                    f"({listed}): its own link is down?")
        if not self.lost:
            return None
        reported = reported or set()

        def fault_order(host: str) -> tuple[bool, float]:
            said = any(r in reported for r, h in ranks_on.items() if h == host)
            return said, self.failing_since.get(host, 0.0)

        host = min(self.lost, key=fault_order)
        return f"host {host} ({ranks_of(host, ranks_on)}) {self.lost[host]}, as probed from {here}"


def ranks_of(host: str, ranks_on: dict[int, str]) -> str:
    """"ranks 2, 3" (or "rank 2", "rank ?"): the ranks that ran on `host`."""
    mine = sorted(r for r, h in ranks_on.items() if h == host)
    return f"rank{'s' if len(mine) != 1 else ''} {', '.join(map(str, mine)) or '?'}"
