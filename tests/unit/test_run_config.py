"""RunConfig resolves its typed options once (issue 59): every question after the config's
own validation gets the objects it validated, and a changed copy resolves its own."""

from __future__ import annotations

import dataclasses

from hetbench.core.config import RunConfig
from hetbench.core.options import build_config


def test_the_typed_options_are_built_once_and_are_what_the_options_say():
    config = RunConfig(algorithm="hop", workload="mlp-digits", workers=4, iterations=10,
                       algorithm_options={"backup_workers": 0},
                       workload_options={"compute": "emulated", "compute_ms": 5})
    algorithm = config.algorithm_config()
    assert algorithm is config.algorithm_config()
    assert config.workload_config() is config.workload_config()
    assert algorithm == build_config(config.algorithm_class().Config, config.algorithm_options,
                                     "hop")
    assert algorithm.backup_workers == 0 and config.workload_config().compute_ms == 5
    changed = dataclasses.replace(config, algorithm_options={"backup_workers": 1})
    assert changed.algorithm_config().backup_workers == 1
    assert config.algorithm_config().backup_workers == 0


def test_each_injector_is_its_own():
    config = RunConfig(algorithm="allreduce", workload="mlp-digits", workers=4, iterations=10,
                       slowdown="prob:5")
    assert config.injector() is not config.injector()
