"""Comm on real gloo ranks: the primitives algorithms build on."""

import torch

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
