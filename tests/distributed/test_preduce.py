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
    return t.tolist(), comm.member_groups.hits, comm.member_groups.misses


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
    """Rank 0 keeps a cache of one and so evicts {0,1} while rank 1 still holds it.

    Rank 1 starts its second use of {0,1} only after rank 0 has evicted it (a store flag), so
    the eviction wins the race for that use's key: both must rebuild rather than hang.
    """
    comm.configure_p_reduce(cache_size=cache_size if comm.rank == 0 else 16)
    t = _values(comm.rank)
    cached = []
    for i, members in enumerate(([0, 1], [0, 2], [0, 1], [0, 1])):
        if comm.rank == 1 and i == 2:
            comm.store.wait(["test/evicted"])
        if comm.rank in members:
            comm.p_reduce_(t, members)
            cached.append(len(comm.member_groups._comms))
        if comm.rank == 0 and i == 1:
            comm.store.set("test/evicted", "1")
    comm.close_member_groups()
    return t.tolist(), comm.member_groups.hits, comm.member_groups.misses, cached


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


def _claimed_first(comm):
    """Rank 1 claims the next use of {0,1} (and waits in it) before rank 0, whose cache holds
    one communicator, makes {0,2}: rank 0 must keep {0,1} for that use, not drop it."""
    comm.configure_p_reduce(cache_size=1 if comm.rank == 0 else 16)
    t = _values(comm.rank)
    sizes = []
    if comm.rank in (0, 1):
        comm.p_reduce_(t, [0, 1])
    if comm.rank == 1:
        group = comm.member_groups.get([0, 1])  # claims use 1 on the cached communicator
        comm.store.set("test/claimed", "1")
        group.allreduce([t]).wait()  # rank 0 joins it after making {0,2}
        t.div_(2)
    if comm.rank == 2:
        comm.store.wait(["test/claimed"])
    if comm.rank == 0:
        comm.store.wait(["test/claimed"])
        comm.p_reduce_(t, [0, 2])
        sizes.append(len(comm.member_groups._comms))  # {0,1} kept: over the bound, not dropped
        comm.p_reduce_(t, [0, 1])
        sizes.append(len(comm.member_groups._comms))
    if comm.rank == 2:
        comm.p_reduce_(t, [0, 2])
    comm.close_member_groups()
    return t.tolist(), comm.member_groups.hits, comm.member_groups.misses, sizes


def test_an_eviction_that_loses_to_a_claimed_use_keeps_the_communicator():
    start = time.perf_counter()
    results = _as_tensors(on_ranks(_claimed_first, 3, timeout_s=20))
    assert time.perf_counter() - start < 20
    # Rank 0: {0,1} made, {0,2} made (its eviction of {0,1} lost: 2 held), {0,1} hit, after
    # which the next creation could evict again.
    assert results[0][1:] == (1, 2, [2, 2])
    assert results[1][1:3] == (1, 1)
    v = [_values(r) for r in range(3)]
    a = (v[0] + v[1]) / 2
    b = (a + v[2]) / 2
    assert torch.allclose(results[0][0], (b + a) / 2)
    assert torch.allclose(results[1][0], results[0][0])
    assert torch.allclose(results[2][0], b)


def _use_keys(comm, uses):
    """Members reuse {0,1} many times; the store keeps only the newest use keys."""
    t = _values(comm.rank)
    for _ in range(uses):
        comm.p_reduce_(t, [0, 1])
    comm.barrier()
    return [k for k in range(uses) if comm.store.check([f"preduce/0-1/u{k}"])]


def test_old_use_keys_are_deleted():
    kept = on_ranks(_use_keys, 2, 150, timeout_s=60)[0]
    assert len(kept) < 70 and max(kept) == 149
