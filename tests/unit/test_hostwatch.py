"""The host watch of runs across hosts (harness/launch/hostwatch.py) on real sockets of this
machine, and how mpirun's words about a lost daemon name its host. The faults on a real test
bed, under each launcher, are tests/distributed/test_multihost_faults.py's."""

import socket
import time

import pytest

from hetbench.harness.launch import hostwatch
from hetbench.harness.launch.external import MpiLauncher
from hetbench.harness.launch.hostwatch import HostWatch


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(hostwatch, "PROBE_S", 0.05)
    monkeypatch.setattr(hostwatch, "LOST_AFTER_S", 0.3)


def closed_port(address: str) -> int:
    """A port nothing listens on (connections to it are refused)."""
    with socket.create_server((address, 0)) as listener:
        return listener.getsockname()[1]


def watch_until_lost(ports: dict[str, list[int]], timeout_s: float = 5.0) -> HostWatch:
    watch = HostWatch(lambda: ports, gone="its ranks").start()
    deadline = time.monotonic() + timeout_s
    while not watch.lost and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # a round more: a host that answers stays off the list
    watch.stop()
    return watch


def test_a_host_whose_ports_refuse_is_lost_and_one_that_answers_is_not(quick):
    answering = hostwatch.answer_probes("127.0.0.1")
    watch = watch_until_lost({"127.0.0.1": [closed_port("127.0.0.1"), answering],
                              "127.0.0.2": [closed_port("127.0.0.2")]})
    assert list(watch.lost) == ["127.0.0.2"]
    cause = watch.cause({0: "127.0.0.1", 1: "127.0.0.1", 2: "127.0.0.2", 3: "127.0.0.2"})
    assert cause.startswith("host 127.0.0.2 (ranks 2, 3) refuses connections (its ranks gone)")


def test_of_hosts_lost_together_the_one_whose_ranks_said_nothing_is_named(quick):
    # Both lost: ranks 0-1 failed with a report (their peers vanished), ranks 2-3 said nothing.
    watch = watch_until_lost({"127.0.0.1": [closed_port("127.0.0.1")],
                              "127.0.0.2": [closed_port("127.0.0.2")],
                              "127.0.0.3": [hostwatch.answer_probes("127.0.0.3")]})
    assert set(watch.lost) == {"127.0.0.1", "127.0.0.2"}
    ranks_on = {0: "127.0.0.1", 1: "127.0.0.1", 2: "127.0.0.2", 3: "127.0.0.2", 4: "127.0.0.3"}
    assert watch.cause(ranks_on, reported={0, 1}).startswith("host 127.0.0.2 (ranks 2, 3)")
    assert watch.cause(ranks_on, reported={2, 3}).startswith("host 127.0.0.1 (ranks 0, 1)")


def test_every_other_host_lost_at_once_blames_bench_s_own_host(quick):
    watch = watch_until_lost({"127.0.0.1": [closed_port("127.0.0.1")],
                              "127.0.0.2": [closed_port("127.0.0.2")]})
    cause = watch.cause({0: "127.0.0.1", 1: "127.0.0.2"})
    assert "the host of bench and the run's services, lost every other host (127.0.0.1 (rank " \
           "0), 127.0.0.2 (rank 1)): its own link is down?" in cause


@pytest.mark.parametrize("log", [
    "A daemon failed to report back after being spawned. ...\n  Local host:    h1\n"
    "  Remote host:   h2\n  Daemon exit status: 0\n",
    "PRTE has lost communication with a remote daemon.\n\n  HNP daemon   : [prterun-h1-14549@0,0]"
    " on node h1\n  Remote daemon: [prterun-h1-14549@0,1] on node h2\n"])
def test_mpirun_s_lost_daemon_names_its_host(log):
    assert MpiLauncher.lost_host(MpiLauncher.__new__(MpiLauncher), log) == "h2"
    assert MpiLauncher.lost_host(MpiLauncher.__new__(MpiLauncher), "rank 1 exited") is None
