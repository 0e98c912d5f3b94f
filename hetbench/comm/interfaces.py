"""Which of this host's interfaces a multi-host run's ranks use.

gloo (and NCCL's bootstrap) pick the address of the machine's hostname unless GLOO_SOCKET_IFNAME /
NCCL_SOCKET_IFNAME name an interface; on many machines the hostname resolves to 127.0.x.x, and
ranks of other hosts are then told to dial their own loopback (`Gloo connectFullMesh failed ...
remote=[127.0.0.1]`, shared/MULTIHOST.md). The interface to use is the one holding the address
this host would send from to reach the rendezvous host: the kernel's route choice, asked with an
unconnected UDP socket (no packet is sent).
"""

from __future__ import annotations

import fcntl
import ipaddress
import re
import socket
import struct

from hetbench.errors import UserError

#: The environment variables that name the interface gloo and NCCL use.
IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
SIOCGIFADDR = 0x8915


def route_source(peer: str, port: int = 9) -> str:
    """The address this host sends from to reach `peer` (a name or an address)."""
    try:
        peer_address = socket.gethostbyname(peer)
    except OSError as exc:
        raise UserError(f"cannot resolve host {peer!r} here ({exc})") from None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((peer_address, port))  # UDP: chooses a route, sends nothing
        except OSError as exc:
            raise UserError(f"no route from {socket.gethostname()} to {peer} "
                            f"({peer_address}): {exc.strerror}") from None
        return probe.getsockname()[0]


def interface_address(name: str) -> str | None:
    """The IPv4 address of interface `name`, or None when it has none or does not exist."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR,
                                 struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def interface_of(address: str) -> str | None:
    """The name of this host's interface holding `address`."""
    for _, name in socket.if_nameindex():
        if interface_address(name) == address:
            return name
    return None


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def choose_interface(peer: str, environ: dict[str, str]) -> str | None:
    """Set GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME in `environ` to the interface that reaches
    `peer` (the rendezvous host), unless the user set them; check a user's choice. Returns the
    address this host is reached at (for torchrun's --local-addr), or None when `peer` is this
    host's loopback (one machine: nothing to choose).

    A wrong choice is one line (UserError) naming the variable: an interface that does not
    exist, or has no IPv4 address, or is loopback while the peer is not."""
    source = route_source(peer)
    for variable in IFNAME_VARIABLES:
        chosen = environ.get(variable)
        if not chosen:
            continue
        # gloo takes one interface; NCCL accepts a list and ^/= prefixes (left to NCCL).
        if variable == "NCCL_SOCKET_IFNAME" and re.search(r"[,^=]", chosen):
            continue
        address = interface_address(chosen)
        if address is None:
            raise UserError(f"{variable}={chosen}: no such interface with an IPv4 address on "
                            f"{socket.gethostname()}; the one that reaches {peer} is "
                            f"{interface_of(source) or '?'} ({source}); unset {variable} to "
                            "let hetbench choose it")
        if is_loopback(address) and not is_loopback(source):
            raise UserError(f"{variable}={chosen} is loopback, but {peer} is reached through "
                            f"{interface_of(source) or '?'} ({source}): ranks on other hosts "
                            f"could not connect; unset {variable} or name that interface")
    if is_loopback(source):
        return None
    interface = interface_of(source)
    if interface is not None:
        for variable in IFNAME_VARIABLES:
            environ.setdefault(variable, interface)
    return source
