"""`bench run --hosts`: the host list, where a run's ranks go, what a run across hosts refuses,
and the interface check (issue 43). The runs themselves are tests/distributed/test_multihost.py."""

from __future__ import annotations

import pytest

from hetbench.comm.interfaces import choose_interface, interface_address, route_source
from hetbench.core.config import RunConfig
from hetbench.core.hosts import HostSlots, parse_hosts, place
from hetbench.errors import UserError

BASE = {"algorithm": "allreduce", "workload": "mlp-digits", "workers": 4}


def test_a_host_list_and_a_hostfile_say_the_same():
    spec = parse_hosts("h1:2,h2:3, h3")
    assert spec == [HostSlots("h1", 2), HostSlots("h2", 3), HostSlots("h3", 1)]


def test_a_hostfile_in_either_spelling(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# the rack\nh1 slots=2\nh2:3  # two GPUs\n\nh3\n")
    assert parse_hosts(str(hostfile)) == [HostSlots("h1", 2), HostSlots("h2", 3),
                                          HostSlots("h3", 1)]
    assert parse_hosts(f"@{hostfile}") == parse_hosts(str(hostfile))


@pytest.mark.parametrize("spec, message", [
    ("h1:2,h1:2", "listed twice"), ("h1:x", "not HOST:SLOTS"), ("h1:0", "at least 1"),
    ("@/nonexistent/hosts", "cannot read"), (" ", "empty")])
def test_a_bad_host_list_is_one_line_naming_what_is_wrong(spec, message):
    with pytest.raises(UserError, match=message):
        parse_hosts(spec)


def test_ranks_fill_the_hosts_in_order_and_unneeded_hosts_are_left_out():
    hosts = parse_hosts("h1:2,h2:2,h3:2")
    assert place(hosts, 5) == [HostSlots("h1", 2), HostSlots("h2", 2), HostSlots("h3", 1)]
    assert place(hosts, 2) == [HostSlots("h1", 2)]
    with pytest.raises(UserError, match=r"6 slots .* needs 7 ranks"):
        place(hosts, 7)


def test_a_run_across_hosts_needs_a_launcher_that_starts_them_and_a_reachable_rendezvous():
    with pytest.raises(UserError, match="add --launcher torchrun or mpi"):
        RunConfig(**BASE, hosts="h1:2,h2:2", bind_host="0.0.0.0")
    with pytest.raises(UserError, match="places them itself"):
        RunConfig(**BASE, hosts="h1:2,h2:2", launcher="slurm", bind_host="0.0.0.0")
    with pytest.raises(UserError, match="loopback"):
        RunConfig(**BASE, hosts="h1:2,h2:2", launcher="torchrun")
    with pytest.raises(UserError, match=r"4 slots .* needs 5 ranks"):  # ps-sync has a server
        RunConfig(**{**BASE, "algorithm": "ps-sync"}, hosts="h1:2,h2:2", launcher="torchrun",
                  bind_host="0.0.0.0")


def test_an_emulated_network_across_hosts_is_refused():
    with pytest.raises(UserError, match="emulates a cluster on one host"):
        RunConfig(**BASE, hosts="h1:2,h2:2", launcher="torchrun", bind_host="0.0.0.0",
                  network={"preset": "prague"})


def test_hosts_are_part_of_a_run_and_one_machine_keeps_its_old_id(tmp_path):
    local = RunConfig(**BASE, launcher="torchrun")
    spread = RunConfig(**BASE, launcher="torchrun", hosts="h1:2, h2:2", bind_host="0.0.0.0")
    hostfile = tmp_path / "hosts"
    hostfile.write_text("h1 slots=2\nh2 slots=2\n")
    from_file = RunConfig(**BASE, launcher="torchrun", hosts=str(hostfile), bind_host="0.0.0.0")
    assert spread.hosts == from_file.hosts == "h1:2,h2:2"
    assert spread.run_id == from_file.run_id != local.run_id
    # A run on one machine keeps the id it had before `hosts` existed (this id is what the
    # code of commit ee0e579 gives this config).
    assert local.run_id == "allreduce-mlp-digits-w4-none-s1-5dfa6007b7"


def test_the_interface_that_reaches_loopback_is_none_to_choose():
    env: dict[str, str] = {}
    assert choose_interface("127.0.0.1", env) is None
    assert env == {}
    assert route_source("127.0.0.1") == "127.0.0.1"
    assert interface_address("lo") == "127.0.0.1"


def test_a_named_interface_that_does_not_exist_is_one_line_naming_the_variable():
    with pytest.raises(UserError, match="GLOO_SOCKET_IFNAME=nonexistent0: no such interface"):
        choose_interface("127.0.0.1", {"GLOO_SOCKET_IFNAME": "nonexistent0"})


def test_an_unknown_host_is_one_line():
    with pytest.raises(UserError, match="cannot resolve host"):
        route_source("no-such-host.invalid")



def test_horovod_across_hosts_is_refused_saying_why():
    with pytest.raises(UserError, match=r"impl = horovod .* cannot run with --hosts"):
        RunConfig(**BASE, algorithm_options={"impl": "horovod"}, hosts="h1:2,h2:2",
                  launcher="torchrun", bind_host="0.0.0.0")
