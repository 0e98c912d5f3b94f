"""A torchrun job across hosts (`bench run --launcher torchrun --hosts h1:2,h2:2`): one node
(hetbench.harness.launch.node) per host, started through a remote agent, as horovodrun and
DeepSpeed's launcher start theirs.

The agent is ssh by default (`ssh -o BatchMode=yes HOST COMMAND`); `--rsh-agent` replaces it,
as Open MPI's plm_rsh_agent does: it is called as `AGENT... HOST COMMAND`, COMMAND one shell
string for the remote shell (the test bed's is `bench testbed rsh --name NAME`). A host that is
this machine is started without the agent.

The rendezvous host's node starts first and prints the c10d store's free port; the others start
with it. Each node's output goes to `torchrun.<host>.log` in the run directory (which every host
must see: results on a shared filesystem). The job ends when every node has ended; when one
fails, the others are stopped. Stopping closes each node's stdin (the node then stops its
torchrun and every rank under it, on its host), then kills the agents that are left.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from hetbench.core.config import RunConfig
from hetbench.core.hosts import HostSlots, is_this_host, parse_hosts, place
from hetbench.core.plugins import PLUGINS_ENV
from hetbench.harness.launch.hostwatch import HostWatch, ranks_of
from hetbench.harness.launch.processes import STOP_GRACE_S, stop_job

DEFAULT_AGENT = "ssh -o BatchMode=yes"
#: How long the rendezvous host's node gets to print its port (its python starts, no torch).
PORT_TIMEOUT_S = 60.0
#: The first line the rendezvous host's node prints (node.py).
PORT_LINE = "hetbench-node port "
#: Where each node answers bench's probes.
PROBE_LINE = "hetbench-node probe "
#: Environment passed on to every host's node (ssh passes none of bench's own): HETBENCH_PLUGINS
#: among them (its paths are absolute: they must be the same on every host, as the results').
FORWARDED = ("PYTHONPATH", PLUGINS_ENV, "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME",
             "TORCH_CPP_LOG_LEVEL", "NCCL_DEBUG")


class NodeFailed(RuntimeError):
    """A node could not start (its own one-line error, or no port printed)."""


class HostsJob:
    """The nodes of one run, one per host, as one job to watch and stop."""

    def __init__(self, config: RunConfig, run_dir: Path, agent: str | None):
        self.config, self.run_dir = config, run_dir
        self.agent = shlex.split(agent or DEFAULT_AGENT)
        self.placed: list[HostSlots] = place(parse_hosts(config.hosts), config.world_size)
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}
        self.log_name = "torchrun.<host>.log"
        #: Probes each node's port once it has printed it (hostwatch.py).
        self.watch = HostWatch(self._node_ports, gone="its node")
        #: The first node seen to end badly, and its exit code (poll).
        self.first_failed: tuple[str, int] | None = None

    def log_path(self, host: str) -> Path:
        return self.run_dir / f"torchrun.{host}.log"

    def node_command(self, host: HostSlots, port: int | None) -> str:
        """The shell command that runs `host`'s node, as the remote shell receives it."""
        first = self.placed[0].host
        argv = [sys.executable, "-m", "hetbench.harness.launch.node",
                "--run-dir", str(self.run_dir.resolve()), "--rdzv-host", first,
                "--nnodes", str(len(self.placed)), "--nproc", str(host.slots),
                "--run-id", self.config.run_id, "--watch-stdin",
                *(["--rdzv-host-node"] if port is None else ["--port", str(port)])]
        env = {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        env.update({k: v for k, v in os.environ.items()
                    if k in FORWARDED or (k.startswith("HETBENCH_")
                                          and k != "HETBENCH_LAUNCHER_PID")})
        assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
        return (f"cd {shlex.quote(os.getcwd())} && exec env {assignments} "
                + " ".join(shlex.quote(a) for a in argv))

    def _start(self, host: HostSlots, port: int | None) -> subprocess.Popen:
        command = self.node_command(host, port)
        argv = (["sh", "-c", command] if is_this_host(host.host)
                else [*self.agent, host.host, command])
        path = self.log_path(host.host)
        with open(path, "wb") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[host.host], self.logs[host.host] = proc, path
        return proc

    def start(self) -> None:
        """Start the rendezvous host's node, learn its port, start the others; NodeFailed (all
        stopped again) when the first could not start."""
        first = self.placed[0]
        proc = self._start(first, None)
        try:
            port = self._read_port(first.host, proc)
        except NodeFailed:
            self.stop()
            raise
        for host in self.placed[1:]:
            self._start(host, port)
        self.watch.start()

    def _node_ports(self) -> dict[str, list[int]]:
        """The probe port of every node that printed one so far."""
        return {host: [port] for host in list(self.procs)
                if (port := self._printed(host, PROBE_LINE)) is not None}

    def _printed(self, host: str, prefix: str) -> int | None:
        """The number a node printed after `prefix`, once it has."""
        with contextlib.suppress(OSError):
            for line in self.log_path(host).read_text(errors="replace").splitlines():
                if line.startswith(prefix):
                    return int(line[len(prefix):])
        return None

    def _read_port(self, host: str, proc: subprocess.Popen) -> int:
        deadline = time.monotonic() + PORT_TIMEOUT_S
        while time.monotonic() < deadline:
            if (port := self._printed(host, PORT_LINE)) is not None:
                return port
            if proc.poll() is not None:
                raise NodeFailed(self.node_error(host) or
                                 f"{host}: its node exited with code {proc.returncode} before "
                                 f"the rendezvous started (see {self.log_path(host).name})")
            time.sleep(0.05)
        raise NodeFailed(f"{host}: no rendezvous port after {PORT_TIMEOUT_S:.0f} s (agent "
                         f"{shlex.join(self.agent)}; see {self.log_path(host).name})")

    def node_error(self, host: str) -> str | None:
        """A node's own one-line error (`error: HOST: ...`), if it printed one."""
        with contextlib.suppress(OSError):
            for line in self.log_path(host).read_text(errors="replace").splitlines():
                if line.startswith("error: "):
                    return line.removeprefix("error: ").strip()
        return None

    def poll(self) -> int | None:
        """None while every node runs and none failed; else the job's exit code: 0 when every
        node ended cleanly, otherwise the first failed node's (1 for a host found lost)."""
        if self.watch.lost:
            return 1
        codes = {host: proc.poll() for host, proc in self.procs.items()}
        # A node dead of a signal first: the others' failures follow from it.
        failed = sorted(((h, c) for h, c in codes.items() if c not in (None, 0)),
                        key=lambda item: item[1] >= 0)
        if failed:
            # Before anything is stopped: the nodes stopped afterwards end with signals too.
            self.first_failed = self.first_failed or failed[0]
            return failed[0][1]
        return 0 if all(c == 0 for c in codes.values()) else None

    def failed_hosts(self) -> list[str]:
        return [self.first_failed[0]] if self.first_failed else []

    def host_cause(self, ranks_on: dict[int, str], reported: set[int]) -> str | None:
        """The failure as a host's, when one was lost or its node killed (`ranks_on`: each
        rank's host, core.record.rank_hosts; `reported`: ranks that failed with a report):
        the host, its ranks, what happened."""
        if self.first_failed and (self.first_failed[1] < 0 or self.first_failed[1] == 255):
            host, code = self.first_failed  # its node died of a signal, or ssh lost the host
            how = (f"was killed ({signal.Signals(-code).name})" if code < 0
                   else "lost its connection (ssh exit 255)")
            return f"host {host} ({ranks_of(host, ranks_on)}): its node {how}, and the run with it"
        return self.watch.cause(ranks_on, reported)

    def stop(self) -> None:
        """Ask every node to stop (stdin closed), then kill what is left of each agent."""
        self.watch.stop()
        for proc in self.procs.values():
            with contextlib.suppress(OSError):
                if proc.stdin:
                    proc.stdin.close()
        deadline = time.monotonic() + STOP_GRACE_S + 5
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for proc in self.procs.values():
            stop_job(proc)

    def log_text(self) -> str:
        return "\n".join(path.read_text(errors="replace") for path in self.logs.values()
                         if path.exists())
