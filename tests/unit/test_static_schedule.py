"""The static Group Generator's schedule, as pure integer code."""

import pytest

from hetbench.algorithms.prague.schedule import static_group, static_groups


def test_the_papers_16_worker_schedule():
    assert static_groups(0, 16, 4) == sorted(
        [(0, 4, 8, 12), (1,), (5,), (9,), (13,), (2, 3), (6, 7), (10, 11), (14, 15)])
    assert static_groups(1, 16, 4) == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11),
                                       (12, 13, 14, 15)]
    assert static_groups(2, 16, 4) == sorted(
        [(1, 5, 9, 13), (2,), (6,), (10,), (14,), (0, 3), (4, 7), (8, 11), (12, 15)])
    assert static_groups(3, 16, 4) == static_groups(1, 16, 4)
    assert static_groups(4, 16, 4) == static_groups(0, 16, 4)


LAYOUTS = [(16, 4), (8, 4), (12, 3), (8, 2), (6, 6), (4, 1), (10, 5), (32, 8)]


@pytest.mark.parametrize(("workers", "per_node"), LAYOUTS)
def test_groups_of_a_step_are_disjoint_and_cover_every_worker(workers, per_node):
    for step in range(8):
        groups = static_groups(step, workers, per_node)
        flat = [w for g in groups for w in g]
        assert sorted(flat) == list(range(workers))


@pytest.mark.parametrize(("workers", "per_node"), LAYOUTS)
def test_every_worker_agrees_on_every_members_group(workers, per_node):
    for step in range(8):
        for w in range(workers):
            group = static_group(w, step, workers, per_node)
            assert w in group
            for member in group:
                assert static_group(member, step, workers, per_node) == group


@pytest.mark.parametrize(("workers", "per_node"), LAYOUTS)
def test_after_four_steps_everyone_has_heard_from_everyone(workers, per_node):
    # knows[w] = the workers whose initial model has reached w's model.
    knows = [{w} for w in range(workers)]
    for step in range(4):
        for group in static_groups(step, workers, per_node):
            merged = set().union(*(knows[w] for w in group))
            for w in group:
                knows[w] = merged
    assert all(k == set(range(workers)) for k in knows)


def test_three_steps_are_not_enough_for_16_workers():
    knows = [{w} for w in range(16)]
    for step in range(3):
        for group in static_groups(step, 16, 4):
            merged = set().union(*(knows[w] for w in group))
            for w in group:
                knows[w] = merged
    assert any(k != set(range(16)) for k in knows)


def test_a_layout_that_does_not_divide_is_refused():
    with pytest.raises(ValueError, match="must divide"):
        static_groups(0, 10, 4)


def test_run_config_refuses_a_layout_before_any_process_starts():
    from hetbench.core.config import RunConfig
    from hetbench.errors import UserError

    with pytest.raises(UserError, match="workers_per_node"):
        RunConfig(algorithm="prague-static", workload="mlp-digits", workers=6)
    config = RunConfig(algorithm="prague-static", workload="mlp-digits", workers=6,
                       algorithm_options={"workers_per_node": 3})
    assert config.algorithm_options["workers_per_node"] == 3
