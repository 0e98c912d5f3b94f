"""The Group Generator through a real gRPC server (in its own process) and real clients."""

import os
import socket
import threading
from collections import defaultdict

import grpc
import pytest

from hetbench.algorithms.prague.generated import group_generator_pb2 as pb
from hetbench.algorithms.prague.generator import GroupGenerator
from hetbench.algorithms.prague.service import GroupClient, gg_server, start_server

SMART = {"group_size": 4, "delta_c": 2, "group_division": True, "group_buffer": True}


def _ask_in_rounds(spec, workers, rounds, log_path):
    """Every worker asks once per round, concurrently (a barrier between rounds), each from its
    own gRPC client; returns {round: [(worker, group_id, members)]}."""
    got = defaultdict(list)
    barrier = threading.Barrier(workers)
    errors = []
    with gg_server(spec, log_path) as services:
        address = services["gg_address"]

        def worker(w):
            client = GroupClient(address, timeout_s=10)
            try:
                for r in range(rounds):
                    barrier.wait(timeout=10)  # a round: everyone asks once, concurrently
                    reply = client.group(w)
                    got[r].append((w, reply.group_id, tuple(reply.members)))
            except Exception as exc:  # surfaced below: a thread's assert would be lost
                errors.append(exc)
                barrier.abort()
            finally:
                client.close()

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    assert not errors
    return got


def test_groups_of_one_round_never_share_a_worker_and_all_members_agree(tmp_path):
    workers, rounds = 8, 12
    # The paper's generator (no arrival_order): one division per round covers everybody.
    spec = {**SMART, "workers": workers, "seed": 7, "arrival_order": False}
    got = _ask_in_rounds(spec, workers, rounds, tmp_path / "gg.log")
    members_of = {}
    for r in range(rounds):
        replies = got[r]
        assert len(replies) == workers
        groups = {gid: members for _, gid, members in replies}
        flat = [w for members in groups.values() for w in members]
        assert len(flat) == len(set(flat)), f"round {r}: groups share a worker: {groups}"
        for w, gid, members in replies:
            assert w in members and len(members) == 4
            assert members_of.setdefault(gid, members) == members
    # Each group id was handed to exactly its members.
    handed = defaultdict(set)
    for r in range(rounds):
        for w, gid, _ in got[r]:
            handed[gid].add(w)
    assert all(handed[gid] == set(members) for gid, members in members_of.items())


def test_arrival_order_through_grpc_keeps_groups_consistent_and_in_one_order(tmp_path):
    # With arrival_order the server times requests with its own clock. Groups may then span
    # lockstep rounds (a late worker is kept out of a division and grouped later), but every
    # group is handed to exactly its members, and each worker gets its groups in id order
    # (the global order that rules out conflicts).
    workers, rounds = 8, 12
    spec = {**SMART, "workers": workers, "seed": 7, "arrival_order": True}
    got = _ask_in_rounds(spec, workers, rounds, tmp_path / "gg.log")
    members_of, handed, ids_of = {}, defaultdict(set), defaultdict(list)
    for r in range(rounds):
        assert len(got[r]) == workers
        for w, gid, members in got[r]:
            assert w in members and len(members) <= 4
            assert members_of.setdefault(gid, members) == members
            handed[gid].add(w)
            ids_of[w].append(gid)
    assert all(ids == sorted(ids) and len(set(ids)) == len(ids) for ids in ids_of.values())
    # No group was handed to a worker outside it.
    assert all(handed[gid] <= set(members) for gid, members in members_of.items())


@pytest.fixture
def server():
    """An in-process gRPC server over a generator the test can inspect."""
    generator = GroupGenerator(5, 3, delta_c=2, seed=1)
    srv, port = start_server(generator)
    client = GroupClient(f"127.0.0.1:{port}", timeout_s=5)
    yield generator, client, port
    client.close()
    srv.stop(grace=0)


def test_threshold_rule_keeps_a_straggler_out_through_grpc(server):
    generator, client, _ = server
    for _ in range(6):
        for w in range(4):  # worker 4 never asks: c_4 = 0
            reply = client.group(w)
            if generator.counts[w] >= 2:  # c_4 = 0 <= c_w - delta_c
                assert 4 not in reply.members
    assert 4 in client.group(4).members


def test_bad_requests_get_error_statuses_and_the_server_keeps_serving(server):
    _, client, port = server
    with pytest.raises(grpc.RpcError) as err:
        client.group(5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "out of range" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        client.done(-3)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # Bytes that are not a GroupRequest at all.
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        raw = channel.unary_unary("/hetbench.prague.GroupGenerator/GetGroup")
        with pytest.raises(grpc.RpcError) as err:
            raw(b"\xff\xff\xff\xff", timeout=5)
        assert err.value.code() != grpc.StatusCode.OK
        unknown = channel.unary_unary("/hetbench.prague.GroupGenerator/Nope")
        with pytest.raises(grpc.RpcError) as err:
            unknown(b"", timeout=5)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    reply = client.group(0)
    assert 0 in reply.members and not reply.finished


def test_done_workers_drain_then_finish(server):
    _, client, _ = server
    client.group(0)
    pending = client.done(1)
    for _ in range(pending):
        reply = client.group(1)
        assert 1 in reply.members and not reply.finished
    assert client.group(1).finished


def test_the_server_process_is_gone_after_the_run(tmp_path):
    with gg_server({**SMART, "workers": 4, "seed": 0}, tmp_path / "gg.log") as services:
        client = GroupClient(services["gg_address"], timeout_s=5)
        assert len(client.group(2).members) == 4
    assert not os.path.exists(f"/proc/{services['gg_pid']}")
    with pytest.raises(grpc.RpcError) as err:
        client._stub.GetGroup(pb.GroupRequest(worker=0), timeout=2)
    assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    client.close()
    assert "groups generated" in (tmp_path / "gg.log").read_text()


def test_a_multi_node_server_listens_everywhere_and_advertises_the_hostname(tmp_path):
    with gg_server({**SMART, "workers": 4, "seed": 0}, tmp_path / "gg.log",
                   host="0.0.0.0") as services:
        host, _ = services["gg_address"].rsplit(":", 1)
        assert host == socket.gethostname()  # what workers on other machines dial
        client = GroupClient(services["gg_address"], timeout_s=5)
        assert len(client.group(2).members) == 4
        client.close()
