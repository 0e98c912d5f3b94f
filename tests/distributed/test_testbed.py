"""The multi-host test bed (hetbench/testbed/): hosts in network namespaces with their own
names and addresses, a shaped link, a shifted clock; refused without root; nothing left behind,
also when set-up fails (issue 43). Real namespaces, real TCP between them."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hetbench import testbed
from hetbench.errors import UserError
from tests.helpers import NEEDS_TEST_BED

pytestmark = NEEDS_TEST_BED

#: Receives bytes until the peer closes, then prints how many and in how many seconds.
SINK = """
import socket, sys, time
server = socket.create_server(("0.0.0.0", 5555)); print("ready", flush=True)
conn, _ = server.accept(); total = 0; start = None
while chunk := conn.recv(1 << 16):
    start = start or time.perf_counter(); total += len(chunk)
print(total, time.perf_counter() - start, flush=True)
"""
SOURCE = """
import socket, sys
with socket.create_connection((sys.argv[1], 5555), timeout=20) as s:
    s.sendall(b"x" * int(sys.argv[2]))
"""


def _bed_name() -> str:
    return f"t{os.getpid() % 100000}"


@pytest.fixture
def bed():
    name = _bed_name()
    testbed.down(name)  # a bed a killed run of this test left
    made = testbed.up(name, hosts=3, rates={"h2": "40mbit"},
                      clock_offsets={"h3": 0.05} if testbed.faketime_library() else {})
    try:
        yield made
    finally:
        testbed.down(name)
    assert _leftovers(name) == []


def _leftovers(name: str) -> list[str]:
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return ([line for line in namespaces.splitlines() if line.startswith(f"{name}-")]
            + [line for line in links.splitlines() if f" {name}-" in line]
            + [str(p) for p in Path("/etc/netns").glob(f"{name}-*")]
            + [str(p) for p in testbed.STATE_DIR.glob(f"{name}.json")])


def _megabits_per_s(bed, sender: str, receiver: str, nbytes: int) -> float:
    sink = bed.popen(receiver, [sys.executable, "-c", SINK], stdout=subprocess.PIPE, text=True)
    try:
        assert sink.stdout.readline().strip() == "ready"
        sent = bed.run(sender, [sys.executable, "-c", SOURCE, receiver, str(nbytes)],
                       capture_output=True, text=True, timeout=60)
        assert sent.returncode == 0, sent.stderr
        total, seconds = sink.stdout.readline().split()
    finally:
        sink.kill()
        sink.wait()
    assert int(total) == nbytes
    return nbytes * 8 / float(seconds) / 1e6


def test_each_host_has_its_name_and_reaches_the_others_by_theirs(bed):
    for host in bed.hosts:
        seen = bed.run(host, [sys.executable, "-c", "import socket; print(socket.gethostname(),"
                              " *(socket.gethostbyname(h) for h in ('h1', 'h2', 'h3')))"],
                       capture_output=True, text=True, timeout=60)
        assert seen.stdout.split() == [host, "10.77.0.1", "10.77.0.2", "10.77.0.3"], seen
    assert _megabits_per_s(bed, "h1", "h3", 1 << 20) > 0


def test_a_shaped_host_gets_its_rate_and_the_others_do_not(bed):
    shaped = _megabits_per_s(bed, "h1", "h2", 3 << 20)
    free = _megabits_per_s(bed, "h1", "h3", 3 << 20)
    assert 20 < shaped <= 44, shaped  # tbf at 40mbit (payload a little under the wire rate)
    assert free > 3 * shaped, (free, shaped)


#: Sends nbytes to each address given, over one connection each, all at once.
SOURCES = """
import socket, sys, threading
nbytes = int(sys.argv[1])
conns = [socket.create_connection((host, 5555), timeout=20) for host in sys.argv[2:]]
sends = [threading.Thread(target=c.sendall, args=(b"x" * nbytes,)) for c in conns]
for t in sends: t.start()
for t in sends: t.join()
for c in conns: c.close()
"""


def test_a_fair_queue_gives_each_peer_its_class_and_an_even_share(bed):
    """queue = "fair": h1's traffic to each peer goes through that peer's class, and two
    flows out of h1 at once move at the same rate (the max-min sharing the fair transport
    models), each about half of the link."""
    testbed.shape_link(bed, "h1", "40mbit", queue="fair")
    nbytes = 3 << 20
    sinks = {host: bed.popen(host, [sys.executable, "-c", SINK], stdout=subprocess.PIPE,
                             text=True) for host in ("h2", "h3")}
    try:
        for sink in sinks.values():
            assert sink.stdout.readline().strip() == "ready"
        sent = bed.run("h1", [sys.executable, "-c", SOURCES, str(nbytes), "h2", "h3"],
                       capture_output=True, text=True, timeout=60)
        assert sent.returncode == 0, sent.stderr
        rates = {}
        for host, sink in sinks.items():
            total, seconds = sink.stdout.readline().split()
            assert int(total) == nbytes
            rates[host] = nbytes * 8 / float(seconds) / 1e6
    finally:
        for sink in sinks.values():
            sink.kill()
            sink.wait()
    assert 0.75 < rates["h2"] / rates["h3"] < 1.33, rates
    assert 12 < rates["h2"] < 26 and 12 < rates["h3"] < 26, rates  # half of 40mbit each
    classes = subprocess.run(["tc", "-n", bed.namespace("h1"), "-s", "class", "show", "dev",
                              "eth0"], capture_output=True, text=True, check=True).stdout
    leaves, classid = {}, None
    for line in classes.splitlines():
        words = line.split()
        if words[:2] == ["class", "htb"]:
            classid = words[2] if "parent" in words else None  # 1:1 is the root's child
        elif words[:1] == ["Sent"] and classid is not None:
            leaves[classid] = int(words[1])
    # A class for each peer and one for the rest: each peer's carried its flow, nothing else.
    assert len(leaves) == 3 and sum(sent >= nbytes for sent in leaves.values()) == 2, classes
    assert leaves["1:ff"] < nbytes, classes


def test_a_shifted_host_reads_its_clock_that_much_later(bed):
    if "h3" not in bed.clock_offsets:
        pytest.skip("libfaketime is not installed (apt-get install faketime)")
    before = time.time_ns()
    read = bed.run("h3", [sys.executable, "-c", "import time; print(time.time_ns())"],
                   capture_output=True, text=True, timeout=60)
    after = time.time_ns()
    shifted = int(read.stdout)
    assert before + 0.04e9 < shifted < after + 0.06e9, (before, shifted, after)


def test_a_failed_set_up_is_undone_and_said_in_one_line(bench):
    name = _bed_name()
    testbed.down(name)
    with pytest.raises(UserError, match="set-up failed and was undone"):
        testbed.up(name, hosts=2, rates={"h2": "0kbit"})  # tc refuses a zero rate
    assert _leftovers(name) == []
    refused = bench("testbed", "up", "--name", name, "--rate", "h9=1mbit")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "h9" in refused.stderr and _leftovers(name) == []


def test_without_root_the_bed_is_refused_in_one_line(monkeypatch, capsys):
    """The CLI as a non-root user runs it (the euid is what the check reads; a real other user
    could not read a checkout in a private directory, as CI's may be)."""
    from hetbench.cli.main import main

    monkeypatch.setattr(os, "geteuid", lambda: 65534)
    with pytest.raises(SystemExit) as exited:
        main(["testbed", "up", "--name", _bed_name()])
    err = capsys.readouterr().err
    assert exited.value.code == 2, err
    assert "needs root" in err and len(err.strip().splitlines()) == 1
    assert _leftovers(_bed_name()) == []

ALL_REDUCE = """
import socket, sys, torch, torch.distributed as dist
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="tcp://h1:29511", rank=rank, world_size=2)
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
print(socket.gethostname(), value.item(), flush=True)
dist.destroy_process_group()
"""


def test_real_gloo_ranks_on_two_hosts_meet_by_hostname(bed):
    """Two ranks, one on h1 and one on h2, rendezvous at h1's name and all-reduce over the
    bed's links (gloo finds each host's address from its own hostname)."""
    ranks = [bed.popen(host, [sys.executable, "-c", ALL_REDUCE, str(rank)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank, host in enumerate(("h1", "h2"))]
    outputs = []
    for proc in ranks:
        try:
            out, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
        assert proc.returncode == 0, err[-2000:]
        outputs.append(out.split())
    assert outputs == [["h1", "3.0"], ["h2", "3.0"]]


#: Echoes one byte at a time, then hashes a bulk transfer; the client times the round trips.
ECHO = """
import hashlib, socket
server = socket.create_server(("0.0.0.0", 5556)); print("ready", flush=True)
conn, _ = server.accept(); conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
for _ in range(20):
    conn.sendall(conn.recv(1))
digest = hashlib.sha256()
while chunk := conn.recv(1 << 16):
    digest.update(chunk)
print(digest.hexdigest(), flush=True)
"""
PING = """
import hashlib, os, socket, statistics, sys, time
conn = socket.create_connection((sys.argv[1], 5556), timeout=20)
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rtts = []
for _ in range(20):
    start = time.perf_counter(); conn.sendall(b"x"); conn.recv(1)
    rtts.append(time.perf_counter() - start)
data = os.urandom(2 << 20)
conn.sendall(data); conn.shutdown(socket.SHUT_WR)
print(statistics.median(rtts), hashlib.sha256(data).hexdigest(), flush=True)
"""


def _round_trip(bed, client: str, server: str) -> tuple[float, bool]:
    """The median round trip (s) of a one-byte ping-pong, and whether 2 MB arrived intact."""
    echo = bed.popen(server, [sys.executable, "-c", ECHO], stdout=subprocess.PIPE, text=True)
    try:
        assert echo.stdout.readline().strip() == "ready"
        ping = bed.run(client, [sys.executable, "-c", PING, server], capture_output=True,
                       text=True, timeout=60)
        assert ping.returncode == 0, ping.stderr
        rtt, sent = ping.stdout.split()
        received = echo.stdout.readline().strip()
    finally:
        echo.kill()
        echo.wait()
    return float(rtt), sent == received


def test_a_delayed_host_adds_its_delay_each_way_and_delivers_every_byte():
    """h2's link delayed 10 ms each way by the user-space delay line: a round trip h1-h2 takes
    20 ms more than h1-h3's, bytes arrive intact through it, and down removes its namespace and
    its process."""
    if shutil.which("ethtool") is None:
        pytest.skip("the delay line needs ethtool (apt-get install ethtool; .ci/run does)")
    name = _bed_name()
    testbed.down(name)
    bed = testbed.up(name, hosts=3, delays={"h2": 0.010})
    try:
        line = subprocess.run(["ip", "netns", "pids", bed.middle_namespace("h2")],
                              capture_output=True, text=True).stdout.split()
        assert line, "no delay line runs in the middle namespace"
        delayed, intact_delayed = _round_trip(bed, "h1", "h2")
        direct, intact_direct = _round_trip(bed, "h1", "h3")
        assert intact_delayed and intact_direct
        assert 0.020 <= delayed - direct < 0.030, (delayed, direct)
    finally:
        testbed.down(name)
    assert _leftovers(name) == []
    assert all(not Path(f"/proc/{pid}").exists() for pid in line)


@pytest.mark.slow
def test_a_delay_without_a_host_or_above_ten_seconds_is_refused(bench):
    name = _bed_name()
    for flag in ("h7=10ms", "h2=11", "h2=soon"):
        refused = bench("testbed", "up", "--name", name, "--hosts", "2", "--delay", flag)
        assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, flag
        assert flag.split("=")[0] in refused.stderr or "soon" in refused.stderr
    assert _leftovers(name) == []
