"""Comm on real gloo ranks: the primitives algorithms build on."""

import time

import pytest
import torch

from hetbench.comm.comm import CommMisuse, ReduceOp
from tests.helpers import on_ranks


def _all_reduce_and_p2p(comm):
    t = torch.full((5,), float(comm.rank + 1))
    comm.average_(t)
    received = torch.zeros(3)
    if comm.rank == 0:
        comm.send(torch.arange(3.0), dst=1)
    elif comm.rank == 1:
        comm.recv(received, src=0)
    return t.tolist(), received.tolist()


def test_average_and_send_recv_on_three_ranks():
    results = on_ranks(_all_reduce_and_p2p, 3)
    for means, _ in results:
        assert means == [2.0] * 5  # mean of 1, 2, 3
    assert results[1][1] == [0.0, 1.0, 2.0]
    assert results[2][1] == [0.0, 0.0, 0.0]


def _partners_on_the_fly(comm, steps):
    """After setup, average with a different partner each step through average_(members=...),
    then try a collective that only a world-wide group could serve."""
    comm.group([0, 1])  # a fixed group, made at setup by every rank
    comm.end_setup()
    value = torch.tensor([float(comm.rank)])
    for step in range(steps):
        partner = comm.rank ^ (1 if step % 2 == 0 else 2)
        comm.average_(value, members=[comm.rank, partner])
    if comm.rank in (0, 1):
        comm.average_(torch.ones(1), members=[0, 1])  # the fixed group still serves
    start = time.monotonic()
    try:
        comm.all_reduce_(torch.ones(1), ReduceOp.MAX, members=[comm.rank, comm.rank ^ 2])
        refused = ""
    except CommMisuse as exc:
        refused = str(exc)
    return value.item(), refused, time.monotonic() - start


def test_groups_formed_on_the_fly_work_or_are_refused_at_once():
    # Pairs {0,1},{2,3} then {0,2},{1,3}: after two steps everyone holds the mean of 0..3.
    results = on_ranks(_partners_on_the_fly, 4, 2, timeout_s=20)
    for value, refused, took_s in results:
        assert value == pytest.approx(1.5)
        assert "p_reduce_" in refused and "\n" not in refused
        assert took_s < 1.0  # refused at once, not after the 20 s timeout


def _staged_point_to_point(comm):
    """Point to point as ranks sharing a GPU over gloo run it (through host buffers), forced on
    CPU tensors: gloo has no CUDA path for it, so a CUDA tensor is sent from, and received
    into, a host buffer of the rank's pool (comm/staging.py)."""
    comm.stages_through_host = True
    out = {}
    if comm.rank == 0:
        message = torch.arange(4.0)
        first = comm.isend(message, dst=1, tag=3)
        message.fill_(-1.0)  # the copy was sent, not what the tensor holds once isend returned
        # Two sends in flight at once: each from a buffer of its own.
        second = comm.isend(torch.full((4,), 5.0), dst=1, tag=4)
        first.wait()
        second.wait()
        for i in range(20):  # sequential messages reuse the pool's buffers
            comm.send(torch.full((2,), float(i)), dst=1)
    else:
        first, second = torch.zeros(4), torch.zeros(4)
        work = comm.irecv(first, src=0, tag=3)
        assert work.wait()
        comm.recv(second, src=0, tag=4)
        out["first"], out["second"] = first.tolist(), second.tolist()
        received = []
        for _ in range(20):
            into = torch.zeros(2)
            out["sender"] = comm.recv(into)  # any sender
            received.append(into[0].item())
        out["received"] = received
    out["allocated"] = comm.staging.allocated
    return out


def test_point_to_point_through_host_buffers_delivers_and_reuses_them():
    sender, receiver = on_ranks(_staged_point_to_point, 2)
    assert receiver["first"] == [0.0, 1.0, 2.0, 3.0]
    assert receiver["second"] == [5.0] * 4
    assert receiver["received"] == [float(i) for i in range(20)]
    assert receiver["sender"] == 0
    # Two 4-element buffers while both isends were in flight, then one 2-element buffer for 20
    # sends; the receiver's 22 messages reuse one buffer per size.
    assert sender["allocated"] == 3
    assert receiver["allocated"] == 2


def _head_from_host(comm):
    """A receive that reads the message's head: staged, from the host buffer it landed in,
    before (and whatever) the copy to the rank's tensor does; unstaged, from the tensor."""
    comm.stages_through_host = comm.rank < 2  # ranks 0-1 staged, 2-3 plain
    peer = comm.rank ^ 1
    if comm.rank % 2 == 0:
        comm.send(torch.tensor([2.0, 7.0, 1.5, 1.5]), dst=peer, tag=5)
        return None
    if comm.stages_through_host:
        # Deliveries held back: the tensor keeps its zeros, so a head read off the tensor
        # (after its copy, as reading a CUDA tensor would be) could only read zeros.
        delivered = []
        comm.staging.deliver = lambda buffer, tensor: delivered.append(buffer.tolist())
    into = torch.zeros(4)
    sender, head = comm.recv_head_on(None, into, 2, src=None, tag=5)
    return sender, head, into.tolist(), comm.traffic.p2p_received_bytes


def test_a_receive_reads_the_message_head_from_host_memory():
    """Hop's receivers and AD-PSGD's server learn a message's kind from its head without
    waiting for the device (issue 44): staged, the head comes from the host buffer."""
    _, staged, _, plain = on_ranks(_head_from_host, 4)
    sender, head, tensor, received = staged
    assert (sender, head) == (0, [2.0, 7.0])
    assert tensor == [0.0] * 4  # read before any copy to the tensor
    assert received == 16
    sender, head, tensor, _ = plain
    assert (sender, head, tensor) == (2, [2.0, 7.0], [2.0, 7.0, 1.5, 1.5])


def test_a_buffer_returns_to_the_pool_only_once_its_message_is_done():
    from hetbench.comm.staging import KEEP_FREE, HostStaging

    staging = HostStaging(torch.device("cpu"))
    done = {"flag": False}
    first = staging.outgoing(torch.ones(3))
    staging.give_back(first, lambda: done["flag"])
    second = staging.outgoing(torch.ones(3))
    assert second.data_ptr() != first.data_ptr()  # the first is still being sent
    done["flag"] = True
    staging.give_back(second)
    third = staging.outgoing(torch.full((3,), 2.0))
    assert third.data_ptr() in (first.data_ptr(), second.data_ptr())
    assert third.tolist() == [2.0] * 3
    # A burst is not kept for good: at most KEEP_FREE buffers of a size stay in the pool.
    burst = [staging.outgoing(torch.ones(3)) for _ in range(KEEP_FREE + 5)]
    for buffer in burst:
        staging.give_back(buffer)
    assert len(staging._free[(3, torch.float32)]) == KEEP_FREE


def _vote(local_ranks, gpus, monkeypatch):
    """Each rank's choose_backend for ranks at these local indices on hosts of `gpus` GPUs,
    one thread a rank around one real in-process store."""
    import threading

    import torch.distributed as dist

    from hetbench.comm.comm import choose_backend

    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    store = dist.HashStore()
    chosen = [None] * len(local_ranks)

    def rank(i):
        chosen[i] = choose_backend(torch.device("cuda", local_ranks[i] % gpus), local_ranks[i],
                                   store, len(local_ranks), timeout_s=10)

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(len(local_ranks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return chosen


def test_ranks_sharing_a_gpu_all_choose_gloo_and_ranks_with_their_own_choose_nccl(monkeypatch):
    assert _vote([0, 1], gpus=2, monkeypatch=monkeypatch) == ["nccl", "nccl"]
    # Two hosts of 2 GPUs, the second with 3 ranks: only its third rank sees the sharing.
    assert _vote([0, 1, 0, 1, 2], gpus=2, monkeypatch=monkeypatch) == ["gloo"] * 5
    assert _vote([0, 1], gpus=1, monkeypatch=monkeypatch) == ["gloo", "gloo"]


def _record_a_step(comm):
    import threading
    import time

    comm.end_setup()
    comm.record_step()
    t = torch.ones(2)
    if comm.rank in (0, 1):
        comm.p_reduce_(t, [0, 1])
    if comm.rank == 2:
        time.sleep(1.0)  # rank 0's receive blocks on this late sender
        comm.send(t, dst=0, tag=9)
        comm.irecv(t, src=1, tag=8).wait()
    if comm.rank == 0:
        comm.recv(t, tag=9)  # any sender: the one that sent is what it met
    if comm.rank == 1:
        time.sleep(1.3)  # after rank 2 waits on its irecv
        comm.isend(t, dst=2, tag=8).wait()
    # An operation on another thread (a serving thread) is not the step's.
    other = threading.Thread(target=lambda: (comm._meet((7,)), comm._blocked(0.0)))
    other.start()
    other.join()
    record = comm.recorded_step()
    return sorted(record.met), record.blocked_s


def test_comm_records_what_a_step_met_and_blocked_on_its_own_thread():
    """The ranks each step's operations involved, and the seconds it blocked on point-to-point
    messages: rank 0's receive waits for rank 2's send, 1 s late; rank 2's irecv for rank 1's
    isend, 0.3 s later still; rank 1's isend finds its receiver waiting. A collective (the
    P-Reduce) is not blocked time: its wait is inferred from the members' arrivals."""
    (met0, blocked0), (met1, blocked1), (met2, blocked2) = on_ranks(_record_a_step, 3)
    assert (met0, met1, met2) == ([0, 1, 2], [0, 1, 2], [0, 1])
    assert 0.6 < blocked0 < 5 and 0.1 < blocked2 < 5
    assert blocked1 < 0.3



def test_a_receive_from_any_sender_on_nccl_is_refused_with_what_to_do():
    """NCCL (a GPU per rank) has no any-source receive, which AD-PSGD and Hop need: refused at
    once, naming gloo, instead of failing inside the backend."""
    import torch.distributed as dist

    from hetbench.comm.comm import Comm

    comm = Comm(0, 2, torch.device("cpu"), "nccl", dist.HashStore(), timeout_s=5)
    with pytest.raises(CommMisuse, match="needs gloo"):
        comm.recv(torch.zeros(2))


def test_hop_with_a_gpu_per_rank_is_refused_with_what_to_do():
    """Hop's receivers (a thread per edge) receive at once on one channel, which NCCL's
    communicators do not allow: refused in setup, naming gloo, not a hang in the backend."""
    from types import SimpleNamespace

    import torch.distributed as dist

    from hetbench.algorithms.hop import Hop, HopOptions
    from hetbench.comm.comm import Comm

    comm = Comm(0, 4, torch.device("cpu"), "nccl", dist.HashStore(), timeout_s=5)
    ctx = SimpleNamespace(comm=comm, rank=0, workers=4)
    with pytest.raises(CommMisuse, match="needs gloo"):
        Hop(HopOptions()).setup(ctx, torch.nn.Linear(2, 1), None)


def _traffic_and_probe(comm):
    comm.stages_through_host = True
    peer = 1 - comm.rank
    if comm.rank == 0:
        comm.send(torch.ones(4), dst=peer)
    else:
        comm.recv(torch.zeros(4), src=peer)
    comm.all_reduce_(torch.ones(2))
    traffic = dict(vars(comm.traffic))
    return traffic, comm.measure_staged_bandwidth(peer, numel=1024, rounds=2)


def test_comm_counts_what_it_moved_and_measures_a_staged_message():
    (sender, speed0), (receiver, speed1) = on_ranks(_traffic_and_probe, 2)
    assert sender == {"p2p_sent_bytes": 16, "p2p_received_bytes": 0, "collective_bytes": 8,
                      "messages": 1}
    assert receiver == {"p2p_sent_bytes": 0, "p2p_received_bytes": 16, "collective_bytes": 8,
                        "messages": 0}
    assert speed0 > 0 and speed1 > 0
