"""P-Reduce on real gloo ranks: member-only communicators, cached, several groups at once."""

import time

import torch

from tests.helpers import on_ranks


def _values(rank: int) -> torch.Tensor:
    # Distinct per rank and not symmetric, so a wrong member set shows in the mean.
    return torch.arange(6, dtype=torch.float64) * (rank + 1) + rank**2


def _one_group(comm, members):
    t = _values(comm.rank)
    if comm.rank in members:
        comm.p_reduce_(t, members)
    return t.tolist()  # not a tensor: torch would share it by fd with a process about to exit


def test_members_hold_the_mean_and_non_members_are_untouched():
    members = [0, 2, 3]
    results = [torch.tensor(t, dtype=torch.float64) for t in on_ranks(_one_group, 5, members)]
    mean = torch.stack([_values(r) for r in members]).mean(0)
    for rank, t in enumerate(results):
        if rank in members:
            assert torch.allclose(t, mean)
        else:
            assert torch.equal(t, _values(rank))
    total = torch.stack(results).sum(0)
    assert torch.allclose(total, torch.stack([_values(r) for r in range(5)]).sum(0))


def _rounds(comm, rounds, concurrent):
    """Apply each round's groups; concurrently (each rank only its group) or one at a time."""
    t = _values(comm.rank)
    for groups in rounds:
        if concurrent:
            for members in groups:
                if comm.rank in members:
                    comm.p_reduce_(t, members)
        else:
            # One group at a time: everyone waits for the previous group to be done.
            for members in groups:
                if comm.rank in members:
                    comm.p_reduce_(t, members)
                comm.barrier()
    return t.tolist(), comm.preduce_cache_hits, comm.preduce_cache_misses


def _as_tensors(results):
    return [(torch.tensor(t, dtype=torch.float64), *rest) for t, *rest in results]


ROUNDS = [
    [[0, 1], [2, 3, 4], [5]],
    [[1, 2, 5], [0, 3]],
    [[0, 1], [2, 3, 4]],
    [[0, 4, 5], [1, 3]],
    [[0, 1], [2, 3, 4]],
]


def test_concurrent_disjoint_groups_equal_sequential_and_hit_the_cache():
    concurrent = _as_tensors(on_ranks(_rounds, 6, ROUNDS, True))
    sequential = _as_tensors(on_ranks(_rounds, 6, ROUNDS, False))
    for (a, _, _), (b, _, _) in zip(concurrent, sequential, strict=True):
        assert torch.allclose(a, b)
    total = torch.stack([t for t, _, _ in concurrent]).sum(0)
    assert torch.allclose(total, torch.stack([_values(r) for r in range(6)]).sum(0))
    # Rank 0 was in {0,1} three times: created once, then two hits; {0,3} and {0,4,5} once.
    _, hits, misses = concurrent[0]
    assert (hits, misses) == (2, 3)
    # Rank 5 was only ever alone or in new sets: no hits.
    assert concurrent[5][1:] == (0, 2)


def _evicting(comm, cache_size):
    """Rank 0 keeps a cache of one and so evicts {0,1} while rank 1 still holds it."""
    comm.preduce_cache_size = cache_size if comm.rank == 0 else 16
    t = _values(comm.rank)
    cached = []
    for members in ([0, 1], [0, 2], [0, 1], [0, 1]):
        if comm.rank in members:
            comm.p_reduce_(t, members)
            cached.append(len(comm._preduce_comms))
    comm.close_member_groups()
    return t.tolist(), comm.preduce_cache_hits, comm.preduce_cache_misses, cached


def test_one_member_evicting_makes_all_members_rebuild_instead_of_hanging():
    start = time.perf_counter()
    results = _as_tensors(on_ranks(_evicting, 3, 1, timeout_s=20))
    assert time.perf_counter() - start < 20
    # Rank 0 created {0,1}, {0,2}, {0,1} again (evicted), then hit once; its cache never
    # held more than its bound of one.
    assert results[0][1:] == (1, 3, [1, 1, 1, 1])
    # Rank 1 still held {0,1} but rebuilt it with rank 0: one hit (the last use), two misses.
    assert results[1][1:] == (1, 2, [1, 1, 1])
    v = [_values(r) for r in range(3)]
    a = (v[0] + v[1]) / 2
    b = (a + v[2]) / 2
    assert torch.allclose(results[0][0], (b + a) / 2)
    assert torch.allclose(results[1][0], results[0][0])
