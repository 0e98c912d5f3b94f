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
