"""Option sweeps, per-algorithm workload options, variant names and bench tune's trials."""

import pytest

from hetbench.core.variants import base_name, variant_names
from hetbench.errors import UserError
from hetbench.harness.matrix import expand
from hetbench.harness.tune import expand_tuning, parse_dimension

BASE = {"algorithms": ["allreduce", "hop"], "workloads": ["mlp-digits"], "workers": [4],
        "iterations": 20}


def names(configs):
    return variant_names((c.algorithm, c.workload, c.algorithm_options, c.workload_options)
                         for c in configs)


def test_a_list_in_an_option_table_expands_into_runs_with_distinct_ids():
    configs = expand({**BASE, "algorithm": {"hop": {"backup_workers": [0, 1],
                                                    "staleness": [1, 3]}}})
    hops = [c for c in configs if c.algorithm == "hop"]
    assert sorted((c.algorithm_options["backup_workers"], c.algorithm_options["staleness"])
                  for c in hops) == [(0, 1), (0, 3), (1, 1), (1, 3)]
    assert len({c.run_id for c in configs}) == len(configs) == 5
    # Runs the sweep does not touch keep their ids: they still resume from earlier results.
    def ids(found, algorithm):
        return {c.run_id for c in found if c.algorithm == algorithm}
    assert ids(expand(BASE), "allreduce") == ids(configs, "allreduce")


def test_workload_options_per_algorithm_override_the_workload_table():
    configs = expand({**BASE, "workload": {"mlp-digits": {"lr": 0.2, "batch_size": 16}},
                      "algorithm": {"allreduce": {"workload": {"lr": [0.05, 0.1]}}}})
    allreduce = sorted(c.workload_options["lr"] for c in configs if c.algorithm == "allreduce")
    assert allreduce == [0.05, 0.1]
    hop = [c for c in configs if c.algorithm == "hop"]
    assert [c.workload_options["lr"] for c in hop] == [0.2]  # the workload table's, not 0.05
    assert all(c.workload_options["batch_size"] == 16 for c in configs)


def test_variant_names_show_what_varies_and_keep_the_bare_name_for_defaults():
    configs = expand({**BASE, "algorithm": {"allreduce": {"workload": {"lr": [0.05, 0.1]}},
                                            "hop": {"backup_workers": [0, 1]}}})
    shown = sorted(names(configs))
    # lr 0.1 and backup_workers 1 are the defaults: those runs keep the bare name.
    assert shown == ["allreduce", "allreduce[lr=0.05]", "hop", "hop[backup_workers=0]"]
    assert {base_name(n) for n in shown} == {"allreduce", "hop"}
    # Without a sweep nothing varies, so even non-default options leave the name alone.
    fixed = expand({**BASE, "algorithm": {"hop": {"backup_workers": 0}}})
    assert sorted(names(fixed)) == ["allreduce", "hop"]


def tuning_spec(**tune):
    return {**BASE, "target": "accuracy:0.8",
            "tune": {"trials": 5, "seed": 3, "workload": {
                "lr": {"min": 0.01, "max": 0.5, "scale": "log"}, "momentum": [0.0, 0.9]},
                **tune}}


def test_every_algorithm_gets_the_same_trials_and_the_same_shared_draws():
    spec = tuning_spec(algorithm={"hop": {"backup_workers": {"min": 0, "max": 1}}})
    _, drawn = expand_tuning(spec, expand(spec), None)
    by_algorithm = {}
    for config, t, values in drawn:
        by_algorithm.setdefault(config.algorithm, {})[t] = (config, values)
    assert {a: sorted(trials) for a, trials in by_algorithm.items()} == {
        "allreduce": list(range(5)), "hop": list(range(5))}
    for t in range(5):
        a, h = by_algorithm["allreduce"][t], by_algorithm["hop"][t]
        # Common random numbers: trial t has one learning rate and momentum for everyone.
        assert a[0].workload_options["lr"] == h[0].workload_options["lr"]
        assert a[0].workload_options["momentum"] == h[0].workload_options["momentum"]
        assert 0.01 <= a[0].workload_options["lr"] <= 0.5
        assert h[0].algorithm_options["backup_workers"] in (0, 1)
        assert "backup_workers" not in a[1]
    lrs = [by_algorithm["allreduce"][t][0].workload_options["lr"] for t in range(5)]
    assert len(set(lrs)) == 5  # five distinct points, not five copies
    # The same seed draws the same trials (a rerun resumes them); another seed does not.
    _, again = expand_tuning(spec, expand(spec), None)
    assert [c.run_id for c, _, _ in again] == [c.run_id for c, _, _ in drawn]
    other = {**spec, "tune": {**spec["tune"], "seed": 4}}
    _, moved = expand_tuning(other, expand(other), None)
    assert [c.run_id for c, _, _ in moved] != [c.run_id for c, _, _ in drawn]
    # More trials extend the same sequence: the first five are the ones already run.
    _, more = expand_tuning(spec, expand(spec), 8)
    assert {c.run_id for c, _, _ in drawn} <= {c.run_id for c, _, _ in more}


@pytest.mark.parametrize("spec, message", [
    ([], "empty list"),
    ({"min": 1}, "give a list"),
    ({"min": 2, "max": 1}, "above max"),
    ({"min": 0.0, "max": 1.0, "scale": "log"}, "min > 0"),
    ({"min": 0, "max": 1, "scale": "cubic"}, "scale must be"),
])
def test_bad_dimensions_are_refused(spec, message):
    with pytest.raises(UserError, match=message):
        parse_dimension("lr", spec, "[tune.workload]")


def test_dimension_values_cover_their_range():
    log = parse_dimension("lr", {"min": 0.001, "max": 1.0, "scale": "log"}, "")
    assert log.value(0.0) == pytest.approx(0.001) and log.value(0.5) == pytest.approx(0.0316, 1e-2)
    ints = parse_dimension("k", {"min": 0, "max": 2}, "")
    assert [ints.value(u) for u in (0.0, 0.34, 0.67, 0.999)] == [0, 1, 2, 2]
    assert parse_dimension("m", [0.0, 0.9], "").value(0.7) == 0.9
