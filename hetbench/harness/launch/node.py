"""One host's part of a multi-host torchrun run: what `bench run --hosts` starts on each host
(through ssh, or the agent it is given) as

    python -m hetbench.harness.launch.node --run-dir DIR --rdzv-host H1 --nnodes N --nproc K
                                           --run-id ID (--rdzv-host-node | --port P)

It checks that the run directory is here (results must be on a filesystem every host shares),
chooses the interface that reaches the rendezvous host (comm/interfaces.py: GLOO_SOCKET_IFNAME
and NCCL_SOCKET_IFNAME unless set, torchrun's --local-addr), and runs this host's torchrun
agent. The rendezvous host's node picks a free port for the c10d store and prints it first
(`hetbench-node port P`); `bench run` then starts the other hosts with it. Every node listens
on a port of its own (`hetbench-node probe P`) through which bench checks, once a second, that
the host is still reachable.

The job's lifetime is bench's: when this process's stdin closes (bench ended, was killed, or
asks the job to stop; ssh passes the close on), or on SIGTERM / SIGHUP, it stops its torchrun and
every rank under it, so no process of the run outlives it on this host.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

from hetbench.comm.interfaces import choose_interface
from hetbench.core.rundir import RunDir
from hetbench.core.signals import LAUNCHER_PID_ENV
from hetbench.errors import UserError
from hetbench.harness.launch.hostwatch import answer_probes
from hetbench.harness.launch.multihost import PORT_LINE, PROBE_LINE
from hetbench.harness.launch.processes import stop_job


def torchrun_command(args: argparse.Namespace, port: int, local_addr: str | None) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", str(args.nnodes), "--nproc-per-node", str(args.nproc),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{args.rdzv_host}:{port}",
        "--rdzv-id", args.run_id,
        # Said, not guessed: torchrun infers the store's host by matching the endpoint's name
        # to this machine's, which a hostname resolving to loopback defeats.
        "--rdzv-conf", f"is_host={int(args.rdzv_host_node)}",
        *(["--local-addr", local_addr] if local_addr else []),
        "--max-restarts", "0", "--monitor-interval", "0.5",
        "-m", "hetbench.harness.worker", "--run-dir", str(args.run_dir),
    ]


def free_port(address: str | None) -> int:
    """A port free on this host now (the c10d store binds it a moment later)."""
    with socket.create_server((address or "", 0)) as listener:
        return listener.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--rdzv-host", required=True)
    parser.add_argument("--nnodes", type=int, required=True)
    parser.add_argument("--nproc", type=int, required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--rdzv-host-node", action="store_true")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--watch-stdin", action="store_true",
                        help="stop the job when stdin closes (bench run passes it)")
    parser.add_argument("--debug", action="store_true")
    args = parser.parse_args(argv)
    here = socket.gethostname()
    try:
        if not RunDir(args.run_dir).config.exists():
            raise UserError(f"{args.run_dir}/config.json is not visible on {here}: a multi-host "
                            "run's results must be on a filesystem every host shares (the same "
                            "path on each)")
        environ = dict(os.environ)
        local_addr = choose_interface(args.rdzv_host, environ)
        port = args.port
        if args.rdzv_host_node:
            port = free_port(local_addr)
            print(f"{PORT_LINE}{port}", flush=True)
        elif not port:
            raise UserError("a node other than the rendezvous host's needs --port")
        # bench probes this host through it (multihost.py): a host it cannot connect to is
        # lost (its link is down, or it is gone), however its ranks fail afterwards.
        print(f"{PROBE_LINE}{answer_probes(local_addr)}", flush=True)
    except UserError as exc:
        if args.debug:
            raise
        print(f"error: {here}: {exc}", file=sys.stderr, flush=True)
        return 2
    note = (f"{here}: {args.nproc} rank(s), rendezvous {args.rdzv_host}:{port}"
            + (f", interface {environ.get('GLOO_SOCKET_IFNAME')} ({local_addr})"
               if local_addr else ""))
    print(note, flush=True)
    environ[LAUNCHER_PID_ENV] = str(os.getpid())  # the ranks end with this process
    job = subprocess.Popen(torchrun_command(args, port, local_addr), env=environ,
                           stdin=subprocess.DEVNULL, start_new_session=True)
    stopping, stopped = threading.Event(), threading.Event()

    def stop(*_) -> None:
        if not stopping.is_set():
            stopping.set()
            stop_job(job)
            stopped.set()

    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, lambda *_: threading.Thread(target=stop, daemon=True).start())

    def watch_stdin() -> None:
        # bench holds the other end: end of file means bench is gone or wants the job stopped.
        while os.read(0, 4096):
            pass
        stop()

    if args.watch_stdin:
        threading.Thread(target=watch_stdin, daemon=True).start()
    code = job.wait()
    if stopping.is_set():  # stop_job may still be killing what is left of the tree
        stopped.wait(timeout=30)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
