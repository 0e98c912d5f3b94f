"""A cluster of hosts on one machine, to rehearse and test multi-host runs (issue 43): Linux
network namespaces joined by a bridge, each with its own hostname, address and, optionally, a
shaped link and a shifted clock.

    bench testbed up --hosts 3 --rate h2=100mbit --clock-offset h2=+0.050
    bench testbed exec h1 -- python3 -c 'import socket; print(socket.gethostname())'
    bench testbed down

Each host `hN` is a namespace holding one end of a veth pair (`eth0`, address 10.77.0.N/24) whose
other end sits on a bridge in the root namespace; the bridge has no address, so the bed reaches
nothing outside itself and nothing outside reaches it. `/etc/netns/<namespace>/hosts` names every
host (`ip netns exec` mounts it over /etc/hosts), and each command runs in a UTS namespace of its
own whose hostname is the host's, so hostname-based rendezvous (torchrun's c10d at `h1`, gloo's
address lookup) behave as on separate machines.

- A link rate is a qdisc on the host's eth0 (egress) and on its bridge port (the host's
  ingress), with a 4 KB bucket and 50 ms of queue (shape_link): by default tbf, one FIFO;
  shape_link's `queue` also gives htb with one FIFO, or a FIFO per peer host served round
  robin (how the links queue moves point-to-point protocols: docs/network.md).
- A clock offset is libfaketime (Debian's `faketime` package) preloaded into every command run on
  the host: `time.time_ns()` there reads the offset more. It also fakes CLOCK_MONOTONIC (with
  DONT_FAKE_MONOTONIC, Python's time.sleep fails: libfaketime#426), which gloo and torchrun
  tolerate.
- A one-way delay is a user-space delay line (delay_line.py) in a namespace between the host's
  eth0 and the bridge: this kernel has no netem. Its ceiling is in docs/multi-node.md.

Setting up needs root and namespaces; without them it refuses in one line. A bed that fails
half-way is torn down before the error is raised, and `down` removes whatever a bed's record
says exists, also one left by a killed process.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hetbench.errors import UserError

#: Where beds record what they made (so `down` works from another process).
STATE_DIR = Path("/run/hetbench-testbed")
#: libfaketime as Debian's faketime package installs it.
FAKETIME_LIBS = ("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
                 "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
                 "/usr/lib/faketime/libfaketime.so.1")
RATE = re.compile(r"^\d+(\.\d+)?(kbit|mbit|gbit)$")
#: How long a shaped link's queue may grow (at its rate) before packets drop.
SHAPE_QUEUE_MS = 50.0
#: How a shaped link enforces its rate and queues (shape_link).
QUEUES = ("host-fair", "fifo", "fair", "tbf")
#: A cluster's: per-flow queues out of a host, a switch port's FIFO into it; and unlike tbf,
#: it leaves the bed's CPU to the ranks (docs/results/2026-11-28-fair-transport-bed.md).
DEFAULT_QUEUE = "host-fair"


def faketime_library() -> str | None:
    return next((lib for lib in FAKETIME_LIBS if Path(lib).exists()), None)


@dataclass
class Bed:
    """A bed's record: its name (the prefix of every interface and namespace it made), its
    hosts (name -> address), their link rates and clock offsets."""

    name: str
    hosts: dict[str, str]
    rates: dict[str, str] = field(default_factory=dict)
    clock_offsets: dict[str, float] = field(default_factory=dict)
    #: One-way delay (seconds) added to each direction of a host's link (delay_line.py).
    delays: dict[str, float] = field(default_factory=dict)
    #: How the shaped links queue (QUEUES, shape_link).
    queue: str = DEFAULT_QUEUE
    #: The SLURM cluster in the bed (slurm.py), if one was started: its slurm.conf,
    #: the daemons' pids.
    slurm: dict | None = None

    @property
    def bridge(self) -> str:
        return f"{self.name}-br"

    def namespace(self, host: str) -> str:
        return f"{self.name}-{host}"

    def veth(self, host: str) -> str:
        return f"{self.name}-{host}"

    def middle_namespace(self, host: str) -> str:
        """Where a delayed host's delay line runs, between its eth0 and the bridge."""
        return f"{self.name}-d{host}"

    def namespaces(self) -> list[str]:
        return [*(self.namespace(h) for h in self.hosts),
                *(self.middle_namespace(h) for h in self.delays)]

    def command(self, host: str, argv: list[str]) -> list[str]:
        """`argv` as run on `host`: in its network namespace, its own hostname, its clock."""
        if host not in self.hosts:
            raise UserError(f"testbed {self.name}: no host {host!r}; hosts: "
                            f"{', '.join(self.hosts)}")
        env = []
        offset = self.clock_offsets.get(host)
        if offset:
            lib = faketime_library()
            if lib is None:
                raise UserError("testbed: a clock offset needs libfaketime (apt-get install "
                                "faketime)")
            env = ["env", f"LD_PRELOAD={lib}", f"FAKETIME={offset:+.6f}"]
        if self.slurm:  # SLURM's clients on every host find the bed's cluster
            env = [*(env or ["env"]), f"SLURM_CONF={self.slurm['conf']}"]
        return ["ip", "netns", "exec", self.namespace(host), "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', host, *env, *argv]

    def run(self, host: str, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(host, argv), **kwargs)

    def popen(self, host: str, argv: list[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(host, argv), **kwargs)


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _tc(*args: str) -> None:
    done = subprocess.run(["tc", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"tc {' '.join(args)}: {done.stderr.strip()}")


def check_can_make_beds() -> None:
    """One line (UserError) unless this process is root on a kernel with network namespaces and
    the `ip` tool."""
    if os.geteuid() != 0:
        raise UserError("testbed: making network namespaces needs root (run as root, or in a "
                        "container that grants CAP_NET_ADMIN and CAP_SYS_ADMIN)")
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        raise UserError("testbed: needs iproute2's `ip` and util-linux's `unshare`")
    if not Path("/proc/self/ns/net").exists():
        raise UserError("testbed: this kernel has no network namespaces")


def up(name: str = "hbtb", hosts: int = 3, subnet: str = "10.77.0",
       rates: dict[str, str] | None = None,
       clock_offsets: dict[str, float] | None = None, slurm: bool = False,
       delays: dict[str, float] | None = None, queue: str = DEFAULT_QUEUE) -> Bed:
    """Make a bed of `hosts` hosts h1..hN at subnet.1..N, `rates`' links shaped with `queue`
    (shape_link), with a SLURM cluster if `slurm` (slurm.py); torn down again if anything
    fails."""
    check_can_make_beds()
    _check_queue(queue)
    if slurm:
        from hetbench.testbed import slurm as slurm_cluster

        slurm_cluster.check_installed()
    if not re.fullmatch(r"[a-z][a-z0-9]{0,5}", name):
        raise UserError(f"testbed: name {name!r} must be 1-6 lowercase letters or digits, "
                        "starting with a letter (it prefixes interface names, 15 characters "
                        "at most)")
    if not 1 <= hosts <= 50:
        raise UserError(f"testbed: --hosts must be 1-50, got {hosts}")
    if not re.fullmatch(r"10\.\d{1,3}\.\d{1,3}", subnet):
        raise UserError(f"testbed: subnet {subnet!r} must be a private 10.X.Y prefix")
    bed = Bed(name, {f"h{i}": f"{subnet}.{i}" for i in range(1, hosts + 1)},
              dict(rates or {}), dict(clock_offsets or {}), delays=dict(delays or {}),
              queue=queue)
    for host, rate in bed.rates.items():
        if host not in bed.hosts or not RATE.match(rate):
            raise UserError(f"testbed: --rate {host}={rate}: expected HOST=RATE with a host "
                            f"of {', '.join(bed.hosts)} and a rate like 100mbit or 1gbit")
    for host in bed.clock_offsets:
        if host not in bed.hosts:
            raise UserError(f"testbed: --clock-offset {host}: no such host")
    for host, delay in bed.delays.items():
        if host not in bed.hosts or not 0 < delay <= 10:
            raise UserError(f"testbed: --delay {host}={delay:g}: expected a host of "
                            f"{', '.join(bed.hosts)} and a delay above 0 and at most 10 s")
    if bed.delays and shutil.which("ethtool") is None:
        raise UserError("testbed: a delay needs ethtool (apt-get install ethtool) to turn off "
                        "the offloads of the interfaces feeding its delay line")
    if bed.clock_offsets and faketime_library() is None:
        raise UserError("testbed: a clock offset needs libfaketime (apt-get install faketime)")
    if (STATE_DIR / f"{name}.json").exists():
        raise UserError(f"testbed {name} is up already (`bench testbed down --name {name}`)")
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    _write_state(bed)  # first, so that a failure below leaves a record `down` can follow
    try:
        _ip("link", "add", bed.bridge, "type", "bridge")
        _ip("link", "set", "dev", bed.bridge, "up")
        hosts_file = "".join(f"{address} {host}\n" for host, address in bed.hosts.items())
        for host, address in bed.hosts.items():
            ns, veth = bed.namespace(host), bed.veth(host)
            _ip("netns", "add", ns)
            etc = Path("/etc/netns") / ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(f"127.0.0.1 localhost\n{hosts_file}")
            if host in bed.delays:
                _add_delay_line(bed, host)
            else:
                _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", "dev", veth, "master", bed.bridge)
            _ip("link", "set", "dev", veth, "up")
            _ip("-n", ns, "link", "set", "dev", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "dev", "eth0", "up")
            if host in bed.rates:
                shape_link(bed, host, bed.rates[host])
        for host in bed.delays:
            _start_delay_line(bed, host)
        if slurm:
            try:
                slurm_cluster.up(bed, STATE_DIR / f"{name}-slurm")
            finally:
                _write_state(bed)  # what was started, for down()
    except BaseException as exc:
        down(name)
        if isinstance(exc, RuntimeError):
            raise UserError(f"testbed {name}: set-up failed and was undone: {exc}") from exc
        raise
    return bed


def _add_delay_line(bed: Bed, host: str) -> None:
    """`host`'s eth0 paired with `host-side` in a middle namespace whose `bridge-side` pairs
    with the bridge port (delay_line.py copies frames between the two)."""
    middle, ns, veth = bed.middle_namespace(host), bed.namespace(host), bed.veth(host)
    _ip("netns", "add", middle)
    _ip("-n", middle, "link", "add", "host-side", "type", "veth", "peer", "name", "eth0",
        "netns", ns)
    _ip("-n", middle, "link", "add", "bridge-side", "type", "veth", "peer", "name", veth,
        "netns", "1")
    for end in ("host-side", "bridge-side"):
        # Frames for other hosts' addresses too (promisc); the middle has no address of its
        # own and no IPv6, so its kernel drops them and sends nothing of its own.
        _ip("-n", middle, "link", "set", "dev", end, "promisc", "on", "up")
    subprocess.run(["ip", "netns", "exec", middle, "sysctl", "-q", "-w",
                    "net.ipv6.conf.all.disable_ipv6=1"], capture_output=True)
    # The two interfaces that transmit into the middle hand it whole, checksummed frames.
    _ethtool_off(["ip", "netns", "exec", ns, "ethtool", "-K", "eth0"])
    _ethtool_off(["ethtool", "-K", veth])


def _ethtool_off(command: list[str]) -> None:
    done = subprocess.run([*command, "tx", "off", "tso", "off", "gso", "off"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")


def _start_delay_line(bed: Bed, host: str) -> None:
    subprocess.Popen(["ip", "netns", "exec", bed.middle_namespace(host), sys.executable, "-m",
                      "hetbench.testbed.delay_line", "host-side", "bridge-side",
                      repr(bed.delays[host])],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True)


def shape_link(bed: Bed, host: str, rate: str, queue_ms: float = SHAPE_QUEUE_MS,
               queue: str | None = None) -> None:
    """Shape `host`'s link to `rate` in both directions (on its eth0 and on its bridge port),
    replacing any shaping it had. `queue_ms` of the rate is queued, beyond it packets drop, as
    at a switch port's buffer. `queue` is how the rate is enforced (QUEUES; default the bed's):
    "tbf", one token
    bucket of 4 KB (the smallest burst that kept the rate here; 64 KB let every message after
    an idle spell start ~5 ms early at 100 Mbit/s) in front of one FIFO; "fifo", htb's bucket
    in front of one FIFO; "fair", htb with a FIFO for each peer host, served round robin, so
    that every pair of hosts moving at once gets its even share (the max-min sharing
    `transport = "fair"` models); "host-fair", "fair" on the host's sending side and "fifo"
    into it: a host that queues per flow (fq_codel, a NIC queue per flow) behind a switch
    port's FIFO. This kernel has no fq_codel or sfq, so htb's classes stand in for them.
    tbf, the bed's first shaping, busied the bed's cores far more than htb does, so that the
    ranks it shaped could not keep up (docs/results/2026-11-28-fair-transport-bed.md)."""
    queue = bed.queue if queue is None else queue
    _check_queue(queue)
    # Out of the host on its eth0 (a peer is a destination), into it on its bridge port (a
    # peer is a source).
    sides = ((("-n", bed.namespace(host)), "eth0", "dst"), ((), bed.veth(host), "src"))
    for where, device, peer_is in sides:
        if queue == "tbf":
            _tc(*where, "qdisc", "replace", "dev", device, "root", "tbf", "rate", rate,
                "burst", "4kb", "latency", f"{queue_ms:g}ms")
            continue
        per_peer = queue == "fair" or (queue == "host-fair" and peer_is == "dst")
        _shape_htb(where, device, rate, queue_ms,
                   {p: a for p, a in bed.hosts.items() if p != host} if per_peer else {},
                   peer_is)


def _check_queue(queue: str) -> None:
    if queue not in QUEUES:
        raise UserError(f"testbed: unknown link queue {queue!r}; choose from "
                        f"{', '.join(QUEUES)}")


def _shape_htb(where: tuple[str, ...], device: str, rate: str, queue_ms: float,
               peers: dict[str, str], peer_is: str) -> None:
    """htb at `rate` on `device`: one FIFO class, or with `peers` (host -> address) a class
    per peer besides the default one (everything else), each guaranteed an even part of the
    rate and allowed all of it, so the classes with packets share the rate round robin, a
    packet at a time (quantum: one full frame)."""
    bits = _rate_bits(rate)
    limit = f"{max(int(bits / 8 * queue_ms / 1000), 16_000)}"  # bytes, as tbf's latency
    frame = ["quantum", "1514"]
    bucket = ["burst", "4kb", "cburst", "4kb"]
    subprocess.run(["tc", *where, "qdisc", "del", "dev", device, "root"], capture_output=True)
    _tc(*where, "qdisc", "add", "dev", device, "root", "handle", "1:", "htb", "default", "ff")
    _tc(*where, "class", "add", "dev", device, "parent", "1:", "classid", "1:1", "htb",
        "rate", rate, "ceil", rate, *bucket, *frame)
    even = f"{max(int(bits / (len(peers) + 1)), 8000)}bit"
    for i, (_, address) in enumerate([*peers.items(), (None, None)]):
        classid = "1:ff" if address is None else f"1:{i + 10:x}"
        _tc(*where, "class", "add", "dev", device, "parent", "1:1", "classid", classid, "htb",
            "rate", even, "ceil", rate, *bucket, *frame)
        _tc(*where, "qdisc", "add", "dev", device, "parent", classid, "bfifo", "limit", limit)
        if address is not None:
            _tc(*where, "filter", "add", "dev", device, "parent", "1:", "protocol", "ip",
                "prio", "1", "u32", "match", "ip", peer_is, f"{address}/32", "flowid", classid)


def _rate_bits(rate: str) -> float:
    """Bits per second of a RATE string ("100mbit")."""
    match = RATE.match(rate)
    if match is None:
        raise UserError(f"bad link rate {rate!r}: a number and kbit, mbit or gbit")
    unit = match.group(2)
    return float(rate[:-len(unit)]) * {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[unit]


def _write_state(bed: Bed) -> None:
    path = STATE_DIR / f"{bed.name}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(bed)))
    tmp.replace(path)


def load(name: str = "hbtb") -> Bed:
    try:
        return Bed(**json.loads((STATE_DIR / f"{name}.json").read_text()))
    except FileNotFoundError:
        raise UserError(f"testbed {name} is not up (`bench testbed up`)") from None


def down(name: str = "hbtb") -> list[str]:
    """Remove everything bed `name` made (each step whether or not an earlier one failed);
    what was removed."""
    path = STATE_DIR / f"{name}.json"
    try:
        bed = Bed(**json.loads(path.read_text()))
    except (FileNotFoundError, ValueError):
        return []
    removed = []
    # Whatever still runs on the bed's hosts (ranks, daemons, slurmd's job steps) goes first:
    # a namespace outlives its deletion while a process holds it.
    for ns in bed.namespaces():
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                              text=True).stdout.split()
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(int(pid), signal.SIGKILL)
    if bed.slurm:
        from hetbench.testbed import slurm as slurm_cluster

        slurm_cluster.down(bed.slurm)
    for host in bed.hosts:
        ns = bed.namespace(host)
        # Deleting the namespace deletes its veth end, and with it the bridge's end.
        if subprocess.run(["ip", "netns", "del", ns], capture_output=True).returncode == 0:
            removed.append(ns)
        shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
        subprocess.run(["ip", "link", "del", bed.veth(host)], capture_output=True)
    for host in bed.delays:
        if subprocess.run(["ip", "netns", "del", bed.middle_namespace(host)],
                          capture_output=True).returncode == 0:
            removed.append(bed.middle_namespace(host))
    if subprocess.run(["ip", "link", "del", bed.bridge], capture_output=True).returncode == 0:
        removed.append(bed.bridge)
    path.unlink(missing_ok=True)
    return removed
