"""How a rank learns who it is and where the run's store is, under each launcher.

- local: the launcher passes --rank and the address of the store it holds.
- torchrun: RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT from torchrun's
  environment; with the c10d rendezvous the agent of node 0 already serves a store there.
- mpi: mpi4py gives rank and size; rank 0 opens the store on a free port and broadcasts its
  address to the others (MPI is used for nothing else).
- slurm: the task submitit started gives rank and size; rank 0 opens the store on a free port
  and writes its address into the run directory (on the shared filesystem), the others read it.

Across hosts, gloo and NCCL are pointed at the interface that reaches the store's host
(comm/interfaces.py) unless GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME say otherwise; torchrun's
ranks get it from their host's node (harness/launch/node.py).

Every launcher ends in the same place: a rank, a world size and a store client, so the rest of
the worker (Comm, algorithms) does not know who started it.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist

from hetbench.comm.interfaces import choose_interface
from hetbench.errors import UserError


@dataclass
class Rendezvous:
    rank: int
    world_size: int
    #: Index of this rank on its machine (picks the GPU).
    local_rank: int
    store: dist.Store


def _timeout(timeout_s: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=timeout_s)


@dataclass(frozen=True)
class JoinRequest:
    """What a rank knows before it joins, whoever started it: each launcher's join (registered
    in core/launchers.py) takes what it needs."""

    world_size: int
    timeout_s: float
    #: The address rank 0 hosts the store on (mpi, slurm).
    bind_host: str
    run_dir: Path
    #: The local launcher's: this rank and the store it holds (the worker's command line).
    rank: int | None = None
    store_host: str = "127.0.0.1"
    store_port: int | None = None


def join_local(request: JoinRequest) -> Rendezvous:
    """A client of the store the local launcher holds."""
    if request.rank is None or request.store_port is None:
        raise UserError("launcher local: the worker needs --rank and --store-port")
    store = dist.TCPStore(request.store_host, request.store_port, request.world_size,
                          is_master=False, timeout=_timeout(request.timeout_s))
    return Rendezvous(request.rank, request.world_size, request.rank, store)


def join_torchrun(request: JoinRequest) -> Rendezvous:
    """Rank and store from the environment torchrun gives each worker."""
    world_size, timeout_s = request.world_size, request.timeout_s
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
               if k not in os.environ]
    if missing:
        raise UserError(f"launcher torchrun: {', '.join(missing)} not set; start the worker "
                        "with `torchrun ... -m hetbench.harness.worker --run-dir DIR`")
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    _check_size(size, world_size, "torchrun's --nnodes x --nproc-per-node")
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    # With the c10d rendezvous the agent of node 0 serves a store at MASTER_ADDR:MASTER_PORT
    # and says so in TORCHELASTIC_USE_AGENT_STORE; otherwise rank 0 must host it (what
    # init_process_group("env://") does too).
    agent_serves = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(host, port, size, is_master=not agent_serves and rank == 0,
                          timeout=_timeout(timeout_s), wait_for_workers=False)
    # The agent's store also holds its rendezvous keys; a restart must not see an older
    # attempt's keys either.
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    prefixed = dist.PrefixStore(f"hetbench/attempt{attempt}", store)
    return Rendezvous(rank, size, int(os.environ.get("LOCAL_RANK", rank)), prefixed)


def join_mpi(request: JoinRequest) -> Rendezvous:
    """Rank and size from MPI; rank 0 hosts the store and broadcasts where it listens."""
    world_size, bind_host, timeout_s = request.world_size, request.bind_host, request.timeout_s
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise UserError(f"launcher mpi needs mpi4py: pip install 'hetbench[mpi]' ({exc})") from None
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    _check_size(size, world_size, "mpirun -n")
    store = None
    address = None
    if rank == 0:
        store, address = _host_store(bind_host, size, timeout_s)
    host, port = comm.bcast(address, root=0)
    choose_interface(host, os.environ)  # the interface that reaches rank 0's host
    if store is None:
        store = dist.TCPStore(host, port, size, is_master=False, timeout=_timeout(timeout_s))
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)  # the ranks on this machine
    local_rank = node.Get_rank()
    node.Free()
    return Rendezvous(rank, size, local_rank, store)


def join_slurm(request: JoinRequest) -> Rendezvous:
    """Rank, size and local rank from the SLURM launcher's task (RANK, WORLD_SIZE, LOCAL_RANK,
    HETBENCH_JOB_ID); rank 0 hosts the store and writes its address into the run directory,
    which every node of the job sees (the results live on a shared filesystem), the others
    read it from there."""
    run_dir, world_size = request.run_dir, request.world_size
    bind_host, timeout_s = request.bind_host, request.timeout_s
    missing = [k for k in ("RANK", "WORLD_SIZE", "HETBENCH_JOB_ID") if k not in os.environ]
    if missing:
        raise UserError(f"launcher slurm: {', '.join(missing)} not set; the run is started by "
                        "`bench run --launcher slurm` (hetbench.harness.launch.slurm)")
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    _check_size(size, world_size, "the job's nodes x tasks per node")
    # Named after the job: a file left by an earlier attempt of the run is never read.
    address_file = Path(run_dir) / f"store.{os.environ['HETBENCH_JOB_ID']}.json"
    if rank == 0:
        store, (host, port) = _host_store(bind_host, size, timeout_s)
        choose_interface(host, os.environ)
        # Written whole (temp file, rename) so a peer never reads half of it; by hand, as
        # core.store's helpers sit above this layer.
        tmp = address_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"host": host, "port": port}))
        os.replace(tmp, address_file)
    else:
        deadline = time.monotonic() + timeout_s
        while not address_file.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"launcher slurm: rank 0 did not publish the run's store in "
                                   f"{timeout_s:.0f} s ({address_file} missing)")
            time.sleep(0.05)
        found = json.loads(address_file.read_text())
        choose_interface(found["host"], os.environ)
        store = dist.TCPStore(found["host"], found["port"], size, is_master=False,
                              timeout=_timeout(timeout_s))
    return Rendezvous(rank, size, int(os.environ.get("LOCAL_RANK", rank)), store)


def _host_store(bind_host: str, size: int, timeout_s: float
                ) -> tuple[dist.TCPStore, tuple[str, int]]:
    """Rank 0's store on a free port of bind_host, and the address peers dial."""
    # Bind the socket ourselves: a free port with no race, on bind_host only.
    listener = socket.create_server((bind_host, 0))
    port = listener.getsockname()[1]
    store = dist.TCPStore(bind_host, port, size, True, timeout=_timeout(timeout_s),
                          wait_for_workers=False, master_listen_fd=listener.detach())
    return store, (advertised_host(bind_host), port)


def advertised_host(bind_host: str) -> str:
    """The address peers dial: bind_host itself, unless it means "every interface"."""
    return socket.gethostname() if bind_host in ("", "0.0.0.0", "::") else bind_host


def _check_size(size: int, world_size: int, what: str) -> None:
    if size != world_size:
        raise UserError(f"the launcher started {size} ranks but the run needs {world_size} "
                        f"(workers + server ranks); set {what} to {world_size}")
