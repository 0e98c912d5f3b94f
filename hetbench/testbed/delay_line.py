"""A one-way delay on a test-bed host's link, in user space (this kernel has no netem).

A delayed host's eth0 is not on the bridge: it is paired with an interface in a middle namespace
of its own (`<bed>-d<host>`), whose second interface is the bridge port. This process runs in
the middle namespace and copies every Ethernet frame from one interface to the other after
`delay` seconds, both ways, in arrival order: each direction of the host's link is `delay`
longer (a message between two delayed hosts gets both hosts' delays).

    python -m hetbench.testbed.delay_line HOST_SIDE BRIDGE_SIDE DELAY_S

Frames are read and written whole through AF_PACKET sockets, so the interfaces that transmit
into the middle namespace must hand it real frames: the bed turns off their checksum and
segmentation offloads (ethtool), else the line would read unchecksummed 64 KB super-frames it
cannot send on. One Python thread serves both directions; its ceiling here is in
docs/multi-node.md (the bed's section). It runs until killed (the bed's `down` kills whatever
runs in its namespaces).
"""

from __future__ import annotations

import collections
import select
import socket
import sys
import time

ETH_P_ALL = 0x0003
#: recvfrom's packet type for a frame this host sent (the socket sees its own sends).
PACKET_OUTGOING = 4
#: Larger than any frame with offloads off (MTU 1500 + header), with room to spare.
FRAME_BYTES = 65536


def open_interface(name: str) -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.bind((name, 0))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
    sock.setblocking(False)
    return sock


def serve(host_side: str, bridge_side: str, delay_s: float) -> None:
    ends = [open_interface(host_side), open_interface(bridge_side)]
    # queues[i]: frames read on ends[i], to be written on the other end at their due time.
    queues: list[collections.deque] = [collections.deque(), collections.deque()]
    while True:
        due = [q[0][0] for q in queues if q]
        timeout = max(0.0, min(due) - time.monotonic()) if due else None
        readable, _, _ = select.select(ends, [], [], timeout)
        for sock in readable:
            i = ends.index(sock)
            while True:
                try:
                    frame, address = sock.recvfrom(FRAME_BYTES)
                except BlockingIOError:
                    break
                if address[2] != PACKET_OUTGOING:
                    queues[i].append((time.monotonic() + delay_s, frame))
        now = time.monotonic()
        for i, queue in enumerate(queues):
            out = ends[1 - i]
            while queue and queue[0][0] <= now:
                try:
                    out.send(queue[0][1])
                except BlockingIOError:
                    break  # the interface's queue is full: retry at the next turn
                except OSError:
                    pass  # a frame the interface refuses (too long): dropped, as a NIC would
                queue.popleft()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2], float(sys.argv[3]))
