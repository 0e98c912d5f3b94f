"""Which hosts a multi-host run's ranks go to (`bench run --hosts`), and which of this host's
addresses the others reach.

`--hosts h1:2,h2:2` (or a hostfile: `h1:2` or Open MPI's `h1 slots=2` per line, `#` comments)
lists hosts and how many ranks each takes. A run's ranks fill the hosts in order: rank 0 and the
rendezvous on the first host, a world of 5 on h1:2,h2:2,h3:2 as 2, 2 and 1. Hosts a run does not
need are left out of it.

Which interface each host's ranks use is comm/interfaces.py's; harness/launch/multihost.py
starts them.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from pathlib import Path

from hetbench.errors import UserError

HOST_ENTRY = re.compile(r"^([A-Za-z0-9_.\-]+)(?::(\d+)|\s+slots\s*=\s*(\d+))?$")


@dataclass(frozen=True)
class HostSlots:
    host: str
    slots: int


def parse_hosts(spec: str) -> list[HostSlots]:
    """`h1:2,h2:2`, or the path of a hostfile; UserError naming what is wrong."""
    spec = spec.strip()
    if not spec:
        raise UserError("--hosts is empty: give HOST:SLOTS,... or a hostfile")
    path = Path(spec.removeprefix("@"))
    if spec.startswith("@") or ("," not in spec and ":" not in spec and path.is_file()):
        try:
            text = path.read_text()
        except OSError as exc:
            raise UserError(f"--hosts {spec}: cannot read the hostfile ({exc.strerror})") from None
        entries = [line.split("#", 1)[0].strip() for line in text.splitlines()]
        where = f"hostfile {path}"
    else:
        entries = [part.strip() for part in spec.split(",")]
        where = "--hosts"
    hosts: list[HostSlots] = []
    for entry in entries:
        if not entry:
            continue
        match = HOST_ENTRY.match(entry)
        if match is None:
            raise UserError(f"{where}: {entry!r} is not HOST:SLOTS (or `HOST slots=N` in a "
                            "hostfile)")
        name, slots = match.group(1), int(match.group(2) or match.group(3) or 1)
        if slots < 1:
            raise UserError(f"{where}: {name} has {slots} slots; give it at least 1")
        if any(h.host == name for h in hosts):
            raise UserError(f"{where}: {name} is listed twice")
        hosts.append(HostSlots(name, slots))
    if not hosts:
        raise UserError(f"{where} lists no host")
    return hosts


def place(hosts: list[HostSlots], world_size: int) -> list[HostSlots]:
    """How many of `world_size` ranks each host runs (filling hosts in order); UserError when
    the slots do not add up to the world."""
    total = sum(h.slots for h in hosts)
    if total < world_size:
        listed = ", ".join(f"{h.host}:{h.slots}" for h in hosts)
        raise UserError(f"--hosts gives {total} slots ({listed}) but a run needs {world_size} "
                        "ranks (workers + server ranks)")
    placed, left = [], world_size
    for host in hosts:
        if left == 0:
            break
        take = min(host.slots, left)
        placed.append(HostSlots(host.host, take))
        left -= take
    return placed


def is_this_host(name: str) -> bool:
    """Whether `name` is this machine (then no remote agent is needed to start its ranks)."""
    return name in ("localhost", socket.gethostname()) or name == _short(socket.gethostname())


def _short(name: str) -> str:
    return name.split(".", 1)[0]

