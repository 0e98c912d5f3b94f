"""The smart Group Generator's decisions, without gRPC or processes."""

import heapq
import itertools
import random

import pytest

from hetbench.algorithms.prague.generator import GroupGenerator


def _run_rounds(gen, order):
    """Each worker in `order` requests once; returns (worker, group) in request order."""
    return [(w, gen.request(w)) for w in order]


def _assert_no_cycles(gen_groups_by_worker):
    """Every worker's groups appear in increasing id order: one global order, no deadlock."""
    for groups in gen_groups_by_worker.values():
        ids = [g.id for g in groups]
        assert ids == sorted(ids)


def test_group_division_partitions_everyone_at_once():
    gen = GroupGenerator(16, 4, seed=3)
    group = gen.request(5)
    assert 5 in group.members and len(group.members) == 4
    # One request made a whole division: 4 disjoint groups covering all 16 workers.
    assert gen.generated == 4
    queued = [gen.buffers[w][0] for w in range(16) if w not in group.members]
    divisions = {g.members for g in queued} | {group.members}
    assert sorted(w for m in divisions for w in m) == list(range(16))
    # The others get their division's group from the buffer, no new generation.
    for w in range(16):
        if w != 5:
            g = gen.request(w)
            assert w in g.members and (g in queued or g == group)
    assert gen.generated == 4


def test_groups_of_one_division_never_share_a_worker():
    gen = GroupGenerator(13, 3, seed=1)
    gen.request(0)
    division = {g for b in gen.buffers for g in b}
    members = [w for g in division for w in g.members]
    assert len(members) == len(set(members))
    assert all(len(g.members) >= 2 for g in division)


def test_without_division_only_the_requesters_group_is_made():
    gen = GroupGenerator(8, 3, group_division=False, seed=2)
    g = gen.request(0)
    assert gen.generated == 1 and len(g.members) == 3


@pytest.mark.parametrize("rule", ["requester", "pairwise"])
def test_threshold_rule_leaves_stragglers_out(rule):
    gen = GroupGenerator(6, 3, delta_c=2, threshold_rule=rule, seed=0)
    # Worker 5 is a straggler: workers 0..4 request 10 times each, it never does.
    for _ in range(10):
        for w in range(5):
            group = gen.request(w)
            # c_5 = 0 <= c_i - 2 once c_i >= 2: then worker 5 must not be picked.
            if gen.counts[w] >= 2:
                assert 5 not in group.members
    # Once it requests it still gets a group: itself plus workers it is close enough to.
    group = gen.request(5)
    assert 5 in group.members


def test_threshold_rule_is_strict():
    gen = GroupGenerator(3, 2, delta_c=3, group_division=False, seed=0)
    gen.counts[:] = [6, 3, 2]
    assert gen.eligible(0) == []  # c_1 = 3 is not > 6 - 3
    gen.counts[:] = [5, 3, 2]
    assert gen.eligible(0) == [1]  # c_1 = 3 > 5 - 3; c_2 = 2 is not
    # A request counts itself first: c_0 becomes 6, so worker 1 is out and 0 is alone.
    assert gen.request(0).members == (0,)


def test_group_buffer_off_only_picks_idle_workers():
    gen = GroupGenerator(6, 3, group_division=False, group_buffer=False, delta_c=None, seed=4)
    first = gen.request(0)
    busy = set(first.members) - {0}
    second = gen.request(next(w for w in range(6) if w not in first.members))
    assert not busy & set(second.members)


def test_every_workers_groups_follow_one_global_order_under_any_schedule():
    for seed, (division, buffer) in itertools.product(range(5), [(True, True), (False, True),
                                                                 (True, False), (False, False)]):
        gen = GroupGenerator(7, 3, delta_c=3, group_division=division, group_buffer=buffer,
                             seed=seed)
        got = {w: [] for w in range(7)}
        rng = random.Random(seed)
        for _ in range(200):
            w = rng.choice([0, 1, 2, 3, 4, 5, 6, 0, 1, 2])  # 0..2 request more often
            got[w].append(gen.request(w))
        _assert_no_cycles(got)
        # And every group a worker got lists it as a member.
        assert all(w in g.members for w, gs in got.items() for g in gs)


def test_done_workers_drain_their_buffer_then_finish_and_get_no_new_groups():
    gen = GroupGenerator(4, 2, seed=0)
    gen.request(0)  # a division: 0 and 1..3 paired
    pending = gen.finish(3)
    made_before = gen.generated
    assert pending == len(gen.buffers[3]) == 1
    drained = gen.request(3)
    assert drained is not None and 3 in drained.members
    assert gen.request(3) is None
    for _ in range(5):
        for w in range(3):
            group = gen.request(w)
            # Groups queued before the finish still hold 3 (it drained them); new ones never.
            assert group.id < made_before or 3 not in group.members
    assert gen.generated > made_before


@pytest.mark.parametrize("bad", [-1, 4, 100])
def test_out_of_range_workers_are_refused(bad):
    gen = GroupGenerator(4, 2)
    with pytest.raises(ValueError, match="out of range"):
        gen.request(bad)
    with pytest.raises(ValueError, match="out of range"):
        gen.finish(bad)
    assert gen.request(0) is not None  # and the generator still works


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="group_size"):
        GroupGenerator(4, 5)
    with pytest.raises(ValueError, match="delta_c"):
        GroupGenerator(4, 2, delta_c=0)


@pytest.mark.parametrize("algorithm", ["prague-smart", "prague-random"])
def test_run_config_refuses_groups_larger_than_the_world(algorithm):
    from hetbench.core.config import RunConfig
    from hetbench.errors import UserError

    with pytest.raises(UserError, match="group_size"):
        RunConfig(algorithm=algorithm, workload="mlp-digits", workers=3,
                  algorithm_options={"group_size": 4})
    with pytest.raises(UserError, match="group_size"):
        RunConfig(algorithm=algorithm, workload="mlp-digits", workers=3,
                  algorithm_options={"group_size": 1})


def test_pairwise_rule_gives_a_fixed_straggler_no_fast_workers_once_counts_differ():
    # Worker 0 is 5x slower: the others request 5 times for each of its requests. Under the
    # pairwise rule no group made once they are delta_c requests ahead may pair it with them:
    # not on its own requests, not in a division. The paper's one-sided rule (c_w > c_i -
    # delta_c, i the requester) does not do this: every fast worker passes when the straggler
    # asks (the next test).
    gen = GroupGenerator(8, 2, delta_c=2, threshold_rule="pairwise", seed=5)
    checked = alone = 0
    for _ in range(20):
        for w in [*range(1, 8)] * 5 + [0]:
            before = gen.generated
            got = gen.request(w)
            made = {g for b in [*gen.buffers, [got]] for g in b if g.id >= before}
            if w == 0 and not made:  # the straggler got a group queued earlier
                continue
            for g in made:
                if 0 in g.members:
                    checked += 1
                    assert all(gen.counts[m] - gen.counts[0] < 2 for m in g.members)
            alone += w == 0 and all(g.members == (0,) for g in made if 0 in g.members)
    assert min(gen.counts[1:]) - gen.counts[0] >= 2  # it did fall behind
    assert alone > 10  # and, asking, it was left to run alone rather than hold anyone up
    assert checked > 0


def test_the_papers_rule_is_one_sided():
    # c_w > c_i - delta_c for requester i: the fast requester leaves the straggler out, the
    # straggler's own request takes fast workers in.
    gen = GroupGenerator(4, 2, delta_c=2, group_division=False, seed=0)
    gen.counts[:] = [1, 5, 5, 5]
    assert 0 not in gen.request(1).members  # c_1 becomes 6: c_0 = 1 is not > 4
    assert len(gen.request(0).members) == 2  # c_0 becomes 2: c_w = 5 or 6 > 0
    with pytest.raises(ValueError, match="threshold_rule"):
        GroupGenerator(4, 2, threshold_rule="both")


def test_every_pair_in_a_generated_group_passes_the_pairwise_rule():
    for seed in range(20):
        gen = GroupGenerator(12, 3, delta_c=2, threshold_rule="pairwise", seed=seed)
        rng = random.Random(seed)
        for _ in range(300):
            w = rng.choice(range(12))
            counts = list(gen.counts)
            counts[w] += 1  # the request counts itself before generating
            before = gen.generated
            got = gen.request(w)
            new = {g for b in [*gen.buffers, [got]] for g in b if g.id >= before}
            for g in new:  # made on this request: judged with the counts of this moment
                assert all(abs(counts[a] - counts[b]) < 2 for a in g.members for b in g.members)


def test_buffer_limit_bounds_the_groups_queued_for_one_worker():
    # Worker 7 never asks; the others keep asking. Unbounded (and within delta_c), every
    # division would queue another group for it; with a limit of 2 it never holds more.
    for limit, most in ((2, 2), (None, 10)):
        gen = GroupGenerator(8, 2, delta_c=None, buffer_limit=limit, seed=1)
        for _ in range(10):
            for w in range(7):
                gen.request(w)
        assert len(gen.buffers[7]) == most if limit else len(gen.buffers[7]) >= most
        assert max(len(b) for b in gen.buffers) <= (limit or 1000)


def test_without_group_buffer_the_limit_is_one():
    gen = GroupGenerator(6, 2, group_buffer=False, buffer_limit=3, delta_c=None, seed=0)
    assert gen.buffer_limit == 1
    with pytest.raises(ValueError, match="buffer_limit"):
        GroupGenerator(6, 2, buffer_limit=0)


def _play(gen, step_s, rounds):
    """Drive `gen` as real workers do: ask (with the time), wait until every member of the group
    has asked (the P-Reduce), compute for step_s(worker, round), ask again. Returns each
    worker's total wait and the set of partners it met."""
    n = gen.workers
    arrived: dict[int, dict[int, float]] = {}
    waits, partners = [0.0] * n, [set() for _ in range(n)]
    done_rounds = [0] * n
    queue = [(0.0, w) for w in range(n)]
    while queue:
        t, w = heapq.heappop(queue)
        group = gen.request(w, t)
        partners[w].update(m for m in group.members if m != w)
        arrived.setdefault(group.id, {})[w] = t
        if len(arrived[group.id]) < len(group.members):
            continue
        end = max(arrived[group.id].values())
        for m, t_m in arrived.pop(group.id).items():
            waits[m] += end - t_m
            done_rounds[m] += 1
            if done_rounds[m] < rounds:
                heapq.heappush(queue, (end + step_s(m, done_rounds[m]), m))
    return waits, partners


def test_expected_arrival_is_the_groups_completion_plus_the_workers_own_work_time():
    gen = GroupGenerator(2, 2, arrival_order=True, seed=0)
    gen.request(0, 0.0)
    gen.request(1, 0.1)  # group 0 complete at 0.1
    gen.request(0, 1.1)  # 0's work: 1.0
    gen.request(1, 1.3)  # 1's work: 1.2; group 1 complete at 1.3
    assert gen.expected_arrivals(1.3) == pytest.approx({0: 2.3, 1: 2.5})
    assert gen.expected_arrivals(2.5) == pytest.approx({0: 2.3, 1: 2.5})
    # More than one work time (LATE_AFTER) past its expected time, a worker is late.
    assert gen.expected_arrivals(3.35) == pytest.approx({0: float("inf"), 1: 2.5})
    gen.request(0, 2.4)  # 0's work: 1.1; it now waits in a group with 1 ...
    # ... and once 1 is late, so is 0, whose group cannot complete before 1 asks.
    assert gen.expected_arrivals(3.8) == {0: float("inf"), 1: float("inf")}
    gen.request(1, 3.8)  # 1's work: 2.5; group complete at 3.8
    assert gen.expected_arrivals(3.8) == pytest.approx({0: 3.8 + 1.05, 1: 3.8 + 1.85})


def test_arrival_order_holds_fast_workers_less_behind_a_fixed_straggler():
    # Worker 3 steps 10x slower. Under the paper's rule its own requests take fast workers
    # into its groups (they are ahead of it), so they wait for it; arrival_order keeps on-time
    # workers away from a late one once it is known to be late. (With the pairwise rule a
    # fast worker can instead be locked with the straggler for the whole run, with or without
    # arrival_order: seed 2 of this play, about 330 s of waiting;
    # docs/results/2026-11-22-prague-generator-variants.md.)
    def fast_wait(arrival_order):
        total = 0.0
        for seed in range(6):
            gen = GroupGenerator(4, 2, delta_c=4, arrival_order=arrival_order, seed=seed)
            waits, _ = _play(gen, lambda w, k: 10.0 if w == 3 else 1.0, rounds=40)
            total += max(waits[:3])
        return total

    assert fast_wait(True) < 0.6 * fast_wait(False)


def test_arrival_order_pairs_workers_that_arrive_together():
    # Workers 0-3 step every 1 s, 4 and 5 every 3 s; no threshold rule, so only the order
    # can keep the fast ones from waiting in groups with the slow ones.
    def fast_workers_wait(arrival_order):
        total = 0.0
        for seed in range(5):
            gen = GroupGenerator(6, 2, delta_c=None, buffer_limit=1,
                                 arrival_order=arrival_order, seed=seed)
            waits, _ = _play(gen, lambda w, k: 1.0 if w < 4 else 3.0, rounds=30)
            total += sum(waits[:4])
        return total

    assert fast_workers_wait(True) < 0.5 * fast_workers_wait(False)


def test_arrival_order_makes_fast_workers_wait_less_for_random_stragglers():
    def total_wait(arrival_order, seed):
        gen = GroupGenerator(16, 2, buffer_limit=1, arrival_order=arrival_order, seed=seed)
        rng = random.Random(seed)
        slowed = {(w, k) for w in range(16) for k in range(60) if rng.random() < 1 / 16}
        waits, _ = _play(gen, lambda w, k: 1.0 + 4.0 * ((w, k) in slowed), rounds=60)
        return sum(waits)

    on = sum(total_wait(True, s) for s in range(5))
    off = sum(total_wait(False, s) for s in range(5))
    assert on < 0.85 * off


def test_arrival_order_keeps_groups_mixing():
    # Equal steps with a little jitter: ordering strictly by expected time would pin the same
    # pairs forever; coarse time classes shuffled randomly keep everyone meeting everyone.
    gen = GroupGenerator(8, 2, buffer_limit=1, arrival_order=True, seed=4)
    rng = random.Random(4)
    _, partners = _play(gen, lambda w, k: 1.0 + rng.uniform(0, 0.05), rounds=80)
    assert all(len(p) >= 5 for p in partners)


def test_arrival_order_keeps_one_global_order():
    for seed in range(5):
        gen = GroupGenerator(7, 3, delta_c=3, buffer_limit=2, arrival_order=True, seed=seed)
        rng = random.Random(seed)
        got = {w: [] for w in range(7)}
        for i in range(200):
            w = rng.choice([0, 1, 2, 3, 4, 5, 6, 0, 1, 2])
            got[w].append(gen.request(w, i * 0.1))
        _assert_no_cycles(got)


def _alone_share(gen, rounds, jitter_s, seed):
    """Equal workers (1 s steps plus random jitter) driven by _play: the largest share of one
    worker's requests answered with a group of one."""
    rng = random.Random(seed)
    alone = [0] * gen.workers
    request = gen.request

    def counting(w, now=None):
        group = request(w, now)
        alone[w] += len(group.members) == 1
        return group

    gen.request = counting
    # Exponential jitter: processes sharing cores mostly run on time, now and then much later.
    _play(gen, lambda w, k: 1.0 + rng.expovariate(1 / jitter_s), rounds)
    return max(alone) / rounds


@pytest.mark.parametrize("workers", [4, 8, 16])
@pytest.mark.parametrize("arrival_order", [False, True])
def test_equal_workers_are_almost_never_alone(workers, arrival_order):
    # The paper's GG in a homogeneous run: every iteration in a group of group_size. Workers
    # that merely asked at different moments are not stragglers.
    for seed in range(5):
        gen = GroupGenerator(workers, 2, delta_c=4, arrival_order=arrival_order, seed=seed)
        assert _alone_share(gen, rounds=150, jitter_s=0.4, seed=seed) <= 0.05, seed


def test_pairwise_rule_with_delta_c_2_separates_equal_workers():
    # What the previous defaults did (pairwise, delta_c 2): a worker that drifted two requests
    # ahead ran alone, drifted further, and stayed alone. Kept as an option, off by default.
    shares = [_alone_share(GroupGenerator(4, 2, delta_c=2, threshold_rule="pairwise",
                                          buffer_limit=1, seed=s), 150, 0.4, s)
              for s in range(5)]
    assert max(shares) > 0.3


def test_a_group_without_division_is_a_uniform_draw_of_the_eligible_workers():
    """The lazy draw (no Group Division: prague-random, and smart without division) picks
    each set of eligible partners equally often, and never a done worker or the requester."""
    tallies = {}
    for seed in range(6000):
        gen = GroupGenerator(7, 3, delta_c=None, group_division=False, seed=seed)
        gen.finish(5)
        gen.finish(6)
        (group,) = [gen.request(0).members]
        assert 0 in group and not {5, 6} & set(group) and len(group) == 3
        tallies[group] = tallies.get(group, 0) + 1
    # 6 pairs from workers 1-4, each expected 1000 times (sd about 29).
    assert len(tallies) == 6 and all(850 < n < 1150 for n in tallies.values()), tallies


def test_a_lazy_draw_stops_short_of_full_when_too_few_are_eligible():
    gen = GroupGenerator(4, 4, delta_c=None, group_division=False, seed=1)
    gen.finish(3)
    assert gen.request(1).members == (0, 1, 2)


def _division_by_the_definition(gen: GroupGenerator, pool: list[int], fits_with=None):
    """Group Division as the docstring defines it, with plain lists: the first worker left
    leads; every later one that passes fits_with(leader) and (pairwise rule) the threshold rule
    with every member so far joins, up to group_size; the rest, in order, is the new pool."""
    groups = []
    while pool:
        leader, group, rest = pool[0], [pool[0]], []
        for w in pool[1:]:
            counts = [gen.counts[m] for m in (*group, w)]
            joins = ((fits_with is None or fits_with(leader)(w))
                     and (not gen.pairwise or max(counts) - min(counts) < gen.delta_c))
            (group if joins and len(group) < gen.group_size else rest).append(w)
        if len(group) > 1:
            groups.append(tuple(sorted(group)))
        pool = rest
    return groups


def _same_lateness(late: frozenset[int]):
    """arrival_order's fits_with: late workers only with late ones."""
    return lambda leader: lambda w: (w in late) == (leader in late)


@pytest.mark.parametrize("rule", ["requester", "pairwise"])
@pytest.mark.parametrize("with_fits", [False, True])
def test_division_over_a_linked_pool_makes_the_groups_of_the_definition(rule, with_fits):
    rng = random.Random(5)
    for trial in range(40):
        workers = rng.randint(2, 60)
        size = rng.randint(2, workers) if trial % 2 else 2
        gen = GroupGenerator(workers, size, delta_c=3, threshold_rule=rule, seed=trial)
        gen.counts = [rng.randint(0, 6) for _ in range(workers)]
        late = frozenset(x for x in range(workers) if rng.random() < 0.3)
        pool = rng.sample(range(workers), rng.randint(0, workers))
        fits_with = _same_lateness(late) if with_fits else None
        expected = _division_by_the_definition(gen, pool, fits_with)
        gen._divide(pool, list(range(1, len(pool) + 1)), 0, fits_with)
        assert [g.members for g in sorted({g for b in gen.buffers for g in b})] == expected
